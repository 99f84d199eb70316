"""The runs table: one row per prompt x setting x mode, this machine's environment and a run's meta, and replay of
the grid on every prompt's table (``disco.replay`` does the replaying)."""

from __future__ import annotations

import math
import os
import platform

from disco.costs.model import CostModel
from disco.machine import cpu_info, flags_line
from disco.models.keys import machine_key
from disco.errors import UserError
from disco.policies import AUTOREGRESSIVE, Policy, parse_strategy
from disco.policies.classifier import weights_summary
from disco.replay.run import replay_many
from disco.suites import SuitePrompt



def sklearn_available() -> bool:
    """transformers adapts the confidence threshold with an ROC curve when scikit-learn is importable."""
    try:
        from transformers.utils import is_sklearn_available

        return bool(is_sklearn_available())
    except ImportError:
        return False


def environment(pair, info: dict | None = None) -> dict:
    """The run's models (``pair.describe()``, or ``info`` when the models are not loaded) and this machine."""
    import torch
    import transformers

    info = dict(pair.describe() if pair is not None else info or {})
    engine = info.get("engine", "torch")
    info.update(torch=torch.__version__, transformers=transformers.__version__, python=platform.python_version(),
                sklearn_available=sklearn_available(), threads=info.get("threads") or torch.get_num_threads(),
                cpu=cpu_info()["cpu"], cpu_flags=" ".join(cpu_info()["flags"]),
                onednn_max_cpu_isa=os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
                machine=flags_line(machine_key("-", "cpu", engine)))
    info["disco_classifier"] = weights_summary()
    return info


TABLE_PAIR_KEYS = ("models", "target", "assistant", "dtype", "device", "engine")  # what a table's meta says of its pair


def run_meta(cfg, picked, specs: list, mode: str, pair=None, tables: dict | None = None, **extra) -> dict:
    """A benchmark run's meta, the one builder: its models (the ``pair`` loaded, or, models not loaded, what its cached
    ``tables`` say of theirs), this machine, the command, the selection (``picked``), the length rule, the run length,
    the mode and the grid's size, then ``extra``."""
    if pair is not None:
        meta = environment(pair)
    else:
        first = next(iter(tables.values())).meta
        meta = environment(None, {k: first.get(k) for k in TABLE_PAIR_KEYS})
        meta["assistant_precision"] = first.get("assistant_precision", "model")
    meta.update(command=cfg.command, **picked.describe(), fitting=cfg.fitting.words(), max_new_tokens=cfg.max_new_tokens,
                mode=mode, grid_size=len(specs), **extra)
    return meta


PEER_PREFIX = "hf:"  # a timed row of transformers' own generate (disco.bench.peer)


def policy_columns(policy: Policy) -> dict:
    """What the heatmap and the best-of-kind tables read of a setting, from the policy itself (never parsed back
    from its spec): its kind, its threshold τ and its K / KMAX (None where it has none)."""
    values = policy.values  # the spec's parameters (a policy's own state may move, e.g. the heuristic's K)
    return {"policy_kind": policy.kind, "tau": values.get("tau"), "kmax": values.get("k") if policy.drafts else None}


def ensure_policy_columns(runs):
    """A runs table with the policy columns, filled from the strategy specs where an older runs.csv lacks them."""
    if runs.empty or all(c in runs for c in ("policy_kind", "tau", "kmax")):
        return runs
    runs = runs.copy()
    cols = {}
    for spec in runs["strategy"].unique():
        try:
            cols[spec] = policy_columns(parse_strategy(str(spec).removeprefix(PEER_PREFIX)))
        except UserError:
            cols[spec] = {"policy_kind": None, "tau": None, "kmax": None}
    for c in ("policy_kind", "tau", "kmax"):
        runs[c] = runs["strategy"].map(lambda s: cols[s][c])
    return runs


def replay_rows(prompt: SuitePrompt, table, results: dict, base_meta: dict) -> list[dict]:
    """One runs.csv row per strategy replayed on one prompt."""
    ar = results.get(AUTOREGRESSIVE)
    ar_seconds = ar.summary()["seconds"] if ar is not None else math.nan
    rows = []
    for spec, res in results.items():
        s = res.summary()
        s["decode_seconds"] = s["seconds"] - s["ttft_ms"] / 1000.0
        identical = res.output_ids == table.reference_for(base_meta["max_new_tokens"])  # true by construction
        rows.append(run_row(prompt, spec, "replay", "ours", s, identical, ar_seconds, base_meta,
                            assistant_passes=s["draft_calls"], prompt_tokens=len(table.prompt_ids),
                            **policy_columns(res.policy)))
    return rows


def run_row(prompt: SuitePrompt, strategy: str, mode: str, implementation: str, s: dict, identical, ar_seconds: float,
         meta: dict, **extra) -> dict:
    seconds = s["seconds"]
    row = {
        "prompt_id": prompt.id, "question": prompt.unit, "turn": prompt.turn, "kind": prompt.kind, "split": prompt.split,
        "chat": prompt.chat, "strategy": strategy,
        "mode": mode,
        "implementation": implementation, "seconds": seconds, "new_tokens": s["new_tokens"],
        "iterations": s.get("iterations"), "target_passes": s["target_calls"],
        "assistant_passes": extra.pop("assistant_passes", s.get("draft_calls")), "drafted": s.get("drafted"),
        "accepted": s.get("accepted"), "acceptance_rate": s.get("acceptance_rate"),
        "mean_lookahead": s.get("mean_lookahead"), "identical_to_autoregressive": identical,
        "speedup": ar_seconds / seconds if seconds and seconds > 0 and ar_seconds == ar_seconds else math.nan,
        "overhead_pct": s.get("overhead_pct", math.nan),
        "ttft_seconds": s["ttft_ms"] / 1000.0 if s.get("ttft_ms") is not None else math.nan,
        "decode_seconds": s.get("decode_seconds", math.nan),
        "decode_tokens_per_s": s.get("decode_tokens_per_s", math.nan),
    }
    for key in ("models", "engine", "dtype", "device", "assistant_precision", "torch", "transformers", "llama_cpp",
                "sklearn_available", "max_new_tokens"):
        row[key] = meta.get(key)
    row.update(extra)  # a row of another engine names its own (bench --other-engine)
    return row


def replay_grid(tables: dict, prompts: list[SuitePrompt], specs: list[Policy], max_new_tokens: int, costs: CostModel,
                meta: dict, positions: list[dict] | None = None) -> list[dict]:
    """Every policy replayed on every prompt's table under ``costs`` (the runs table's replay rows); records in
    ``meta`` what the report needs of it: the costs, the prompts replayed, α (the assistant's first draft equals
    the target's token, over all positions) and c; appends each drafting iteration to ``positions`` when given."""
    meta["costs"] = costs.to_dict()
    runs: list[dict] = []
    hits = total = 0
    for p in prompts:
        table = tables[p.id]
        results = replay_many(table, specs, max_new_tokens, costs)
        runs += replay_rows(p, table, results, meta)
        if positions is not None:  # each run's drafts, for the acceptance by draft position
            positions += [{"prompt_id": p.id, "kind": p.kind, "split": p.split, "strategy": spec,
                           "lookahead": r.lookahead, "accepted": r.accepted}
                          for spec, res in results.items() for r in res.records if r.lookahead]
        h, n = table.first_token_agreement(max_new_tokens)
        hits, total = hits + h, total + n
    meta.update(prompts_replayed=len(prompts), alpha=hits / total if total else math.nan, cost_ratio=costs.cost_ratio)
    return runs
