"""Timed runs: our engine and, back to back, the engine's peer, interleaved: transformers' own assisted generation
for the torch engine, llama.cpp's own programs for the llama.cpp engine (``disco.bench.llama_peer``)."""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
import time

import torch

from disco.bench import llama_peer
from disco.bench.runs import PEER_PREFIX, run_row
from disco.errors import BenchError
from disco.suites import SuitePrompt
from disco.decode.divergence import explain as explain_divergence
from disco.decode.divergence import short as divergence_short
from disco.decode.live import Decoder
from disco.decode.race import greedy_reference
from disco.decode.settings import DecodeSettings
from disco.decode.trace import iterations_frame, summarize
from disco.models.pair import sync
from disco.policies import AUTOREGRESSIVE, Autoregressive, Policy, Threshold

log = logging.getLogger(__name__)


@contextlib.contextmanager
def roc_adaptation(enabled: bool):
    """transformers adapts a non-zero ``assistant_confidence_threshold`` online whenever scikit-learn is installed
    (``AssistedCandidateGenerator``, checked with ``is_sklearn_available`` in that module). A fixed-threshold
    peer must not adapt, the ``adaptive`` peer must: switch it per run."""
    from transformers.generation import candidate_generator as cg

    if enabled:
        if not cg.is_sklearn_available():
            raise BenchError("the adaptive peer needs scikit-learn (pip install scikit-learn)")
        yield
        return
    saved = cg.is_sklearn_available
    cg.is_sklearn_available = lambda: False
    try:
        yield
    finally:
        cg.is_sklearn_available = saved


def run_ours(pair, prompt_ids: list[int], policy: Policy, max_new_tokens: int, reference: list[int] | None = None,
             costs=None) -> dict:
    if policy.probes_verification:  # the oracle knows the target's continuation
        if reference is None:
            reference = greedy_reference(pair, prompt_ids, max_new_tokens)
        policy.reference = list(reference)
    start = time.perf_counter()
    decoder = Decoder(pair, list(prompt_ids), policy, DecodeSettings(max_new_tokens=max_new_tokens), costs=costs)
    decoder.run()
    seconds = time.perf_counter() - start
    summary = summarize(policy.spec, iterations_frame(decoder.records))
    summary["decode_seconds"] = summary["seconds"] - summary["ttft_ms"] / 1000.0  # after the first iteration
    summary["seconds"] = seconds  # wall time of the whole call, as for the peer
    return {"summary": summary, "output_ids": decoder.output_ids, "records": decoder.records, "tokens": decoder.tokens,
            "dtype": pair.dtype_name}


def run_hf(pair, prompt_ids: list[int], policy: Policy, max_new_tokens: int) -> dict:
    """transformers' ``generate`` (greedy) with the assistant configured like ``policy`` (``Policy.hf_kwargs``, its
    own mapping); passes counted with hooks."""
    settings = policy.hf_kwargs()
    if settings is None:
        raise BenchError(f"strategy {policy.spec!r} has no transformers peer")
    gc = pair.assistant.generation_config
    keys = ("num_assistant_tokens", "assistant_confidence_threshold", "num_assistant_tokens_schedule")
    saved = {k: getattr(gc, k, None) for k in keys}
    counts = {"target": 0, "assistant": 0}

    def counter(role):
        def hook(module, args, output):
            counts[role] += 1
        return hook

    hooks = [pair.target.register_forward_hook(counter("target")),
             pair.assistant.register_forward_hook(counter("assistant"))]
    eos = list(pair.eos_ids)
    pad = getattr(pair.tokenizer, "pad_token_id", None)
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, repetition_penalty=1.0,
                  eos_token_id=eos, pad_token_id=pad if pad is not None else eos[0])
    assistant = pair.assistant if settings and not policy.proposes else None
    if policy.proposes:  # prompt lookup: generate's own arguments, no assistant model
        kwargs.update(settings)
        settings = {}
    try:
        for k, v in settings.items():
            setattr(gc, k, v)
        x = torch.tensor([list(prompt_ids)], dtype=torch.long, device=pair.device)
        mask = torch.ones_like(x)
        with torch.inference_mode():
            sync(pair.device)
            with roc_adaptation(getattr(policy, "hf_roc_adaptation", False)):
                start = time.perf_counter()
                out = pair.target.generate(input_ids=x, attention_mask=mask,
                                           assistant_model=assistant, **kwargs)
            sync(pair.device)
            seconds = time.perf_counter() - start
    finally:
        for h in hooks:
            h.remove()
        for k, v in saved.items():
            setattr(gc, k, v)
    output = out[0, len(prompt_ids):].tolist()
    for i, token in enumerate(output):  # generate stops at EOS; be safe about padding
        if token in pair.eos_ids:
            output = output[: i + 1]
            break
    return {"seconds": seconds, "output_ids": output, "target_passes": counts["target"],
            "assistant_passes": counts["assistant"]}


def warm_up(pair, prompt_ids: list[int]) -> None:
    """Warm both models and both code paths once (lazy initialisation must not be timed)."""
    pair.warmup()
    short = list(prompt_ids)[:16] or [pair.eos_ids[0]]
    warm = Threshold(tau=0.4, k=5)
    run_ours(pair, short, warm, 4)
    if pair.engine == "torch":  # llama.cpp's programs are separate processes: nothing of theirs stays warm
        run_hf(pair, short, warm, 4)
        run_hf(pair, short, Autoregressive(), 2)


def _llama_row(pair, prompt, spec, runs, measured, base, max_new_tokens, meta, prompt_tokens) -> dict:
    """A llama.cpp peer row: its decode rate, as the seconds it would take for our ``max_new_tokens`` (its programs
    report the decode phase apart from the prompt; ours is ``decode_seconds``)."""
    rate = statistics.median(r["new_tokens"] / r["seconds"] for r in runs)
    seconds = max_new_tokens / rate
    ar = base["llama"]
    ar_seconds = max_new_tokens / statistics.median(r["new_tokens"] / r["seconds"] for r in ar) if ar else math.nan
    first = runs[0]
    ours = measured.get(("ours", spec), [{}])[0]
    ours_text = pair.decode(ours.get("output_ids", [])) if ours else ""
    text = first.get("text")
    same = None if text is None else bool(text.startswith(ours_text) or ours_text.startswith(text))
    s = {"seconds": seconds, "new_tokens": first["new_tokens"], "ttft_ms": None, "iterations": math.nan,
         "target_calls": math.nan, "draft_calls": math.nan, "drafted": first.get("drafted"),
         "accepted": first.get("accepted"), "mean_lookahead": math.nan, "overhead_pct": math.nan,
         "acceptance_rate": (first["accepted"] / first["drafted"]) if first.get("drafted") else math.nan,
         "decode_seconds": seconds}
    return run_row(prompt, llama_peer.PREFIX + spec, "timed", "llama.cpp", s, same, ar_seconds, meta,
                   prompt_tokens=prompt_tokens, reps=len(runs), same_as_ours=same, decode_tokens_per_s=rate,
                   peer_command=first.get("command", ""))


def quiet_columns(records, costs, precision: str | None = None) -> dict:
    """A timed run's own clock beside what its iterations cost under this machine's measured (quiet) pass costs:
    ``live_over_quiet`` far from 1 says the machine was busy while it ran (``disco.app.quiet``, the same check).
    A lane whose assistant (``precision``) is not the one the costs measured is left out."""
    quiet = costs.lane_ms(records, precision) / 1000.0 if costs is not None and records else math.nan
    return {"quiet_seconds": quiet, "live_over_quiet": records[-1].elapsed_ms / 1000.0 / quiet if quiet else math.nan}


def timed_prompt(pair, prompt: SuitePrompt, ids: list[int], policies: list[Policy], max_new_tokens: int, meta: dict,
                 reps: int = 1, reference: list[int] | None = None, peer: bool = True, order_offset: int = 0,
                 costs=None) -> tuple[list[dict], list]:
    """Run ours and the peer back to back for every policy (A B B A ...), ``reps`` times, on the prompt's ``ids``
    (``disco.tables.phase.TablePhase.ids``).

    Returns the runs.csv rows (median seconds over reps) and our engine's per-iteration records."""
    measured: dict[tuple[str, str], list[dict]] = {}
    records = []
    if peer and pair.engine == "llamacpp" and not meta.get("peer_programs_missing"):
        missing = llama_peer.missing_programs()
        if missing:  # said once per run: ./run.sh does not build them (scripts/llama-build.sh)
            meta["peer_programs_missing"] = missing
            log.warning("llama.cpp's %s not built here, so its runs are not timed as the peer "
                        "(scripts/llama-build.sh programs builds them, about 3 minutes)", " and ".join(missing))
    for rep in range(reps):
        for i, policy in enumerate(policies):
            spec = policy.spec
            # A B, then B A: alternating who goes first cancels a linear drift of the machine's speed
            order = ("ours", "hf") if (i + rep + order_offset) % 2 == 0 else ("hf", "ours")
            for impl in order:
                if impl == "ours":
                    ours = run_ours(pair, ids, policy, max_new_tokens, reference, costs)
                    measured.setdefault(("ours", spec), []).append(ours)
                    for r in ours["records"]:
                        records.append({"prompt_id": prompt.id, "rep": rep, **r.__dict__})
                elif peer and pair.engine == "llamacpp":
                    if llama_peer.has_peer(policy):
                        try:
                            run = (llama_peer.plain(pair, max_new_tokens) if policy.kind == AUTOREGRESSIVE
                                   else llama_peer.speculative(pair, ids, policy, max_new_tokens))
                        except llama_peer.NoStatistics as exc:
                            log.warning("%s, %s: %s", prompt.id, spec, exc)
                            meta.setdefault("peer_missing", []).append({"prompt": prompt.id, "strategy": spec,
                                                                        "why": str(exc)[:300]})
                            continue
                        measured.setdefault(("llama", spec), []).append(run)
                elif peer and policy.hf_kwargs() is not None:
                    measured.setdefault(("hf", spec), []).append(run_hf(pair, ids, policy, max_new_tokens))
    base = {impl: measured.get((impl, AUTOREGRESSIVE)) for impl in ("ours", "hf", "llama")}
    lanes = {p.spec: p for p in policies}
    truth = base["ours"][0]["output_ids"] if base["ours"] else reference
    rows = []
    for (impl, spec), runs in measured.items():
        if impl == "llama":
            rows.append(_llama_row(pair, prompt, spec, runs, measured, base, max_new_tokens, meta, len(ids)))
            continue
        seconds = statistics.median(r["seconds"] if impl == "hf" else r["summary"]["seconds"] for r in runs)
        ar_runs = base[impl]
        ar_seconds = (statistics.median(r["seconds"] if impl == "hf" else r["summary"]["seconds"] for r in ar_runs)
                      if ar_runs else math.nan)
        first = runs[0]
        identical = (first["output_ids"] == truth) if truth is not None else None
        if impl == "ours":
            s = dict(first["summary"], seconds=seconds,
                     decode_seconds=statistics.median(r["summary"]["decode_seconds"] for r in runs))
            div = None
            if identical is False and base["ours"]:  # explained from both runs' own logits (disco.decode.divergence)
                div = explain_divergence(base["ours"][0]["tokens"], first["tokens"], first["dtype"])
            rows.append(run_row(prompt, spec, "timed", "ours", s, identical, ar_seconds, meta,
                             prompt_tokens=len(ids), reps=len(runs),
                             divergence=div["kind"] if div else "", divergence_detail=divergence_short(div),
                             **quiet_columns(first["records"], costs, lanes[spec].assistant_precision
                                             or meta.get("assistant_precision"))))
        else:
            ours_out = measured.get(("ours", spec), [{}])[0].get("output_ids")
            new_tokens = len(first["output_ids"])
            s = {"seconds": seconds, "new_tokens": new_tokens, "ttft_ms": None, "iterations": first["target_passes"],
                 "target_calls": first["target_passes"], "draft_calls": first["assistant_passes"], "drafted": None,
                 "accepted": None, "acceptance_rate": math.nan, "mean_lookahead": math.nan, "overhead_pct": math.nan}
            rows.append(run_row(prompt, PEER_PREFIX + spec, "timed", "hf", s, identical, ar_seconds, meta,
                             prompt_tokens=len(ids), reps=len(runs), same_as_ours=first["output_ids"] == ours_out))
    return rows, records
