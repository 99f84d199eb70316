"""Who should draft, per kind of prompt: the context (prompt lookup and its kin, no model), the assistant (any rule
on its draft length), or a hybrid of the two (``hybrid:CONTEXT+ASSISTANT``, llama.cpp's comma-separated
``--spec-type``).

``drafter_answer``: per kind and over all prompts, from replay, the best setting of each of the three families (in
hindsight on that kind's prompts, geometric mean speed-up) and the best hybrid over the better of the other two: a
hybrid earns its place where it is at least as fast as both on every kind. Where the runs hold a train and a test
split, each family's setting is also chosen on the train prompts (all kinds together, as a user without per-kind
tuning would) and reported on the kind's test prompts. No model runs.
"""

from __future__ import annotations

import math

import pandas as pd

from disco.bench.analysis import geomean
from disco.bench.kinds import per_setting, speedup_text
from disco.errors import UserError
from disco.policies import policy_class, spec_kind

ALL = "all"
FAMILIES = ("context", "assistant", "hybrid")
COLUMNS = ["kind", "prompts", "best_context", "context_speedup", "best_assistant", "assistant_speedup", "best_hybrid",
           "hybrid_speedup", "hybrid_over_better", "chosen_context", "chosen_assistant", "chosen_hybrid",
           "chosen_context_test", "chosen_assistant_test", "chosen_hybrid_test"]


def family(spec: str) -> str | None:
    """``context``, ``assistant`` or ``hybrid`` for a spec (None: the baseline, the oracle, a peer row)."""
    try:
        cls = policy_class(spec_kind(spec))
    except UserError:  # a peer row (hf:, llama:) or a spec this version does not know: no family
        return None
    if cls.composite:
        return "hybrid"
    if cls.proposes:
        return "context"
    if cls.uses_assistant and not cls.probes_verification:
        return "assistant"
    return None


def _speedups(rows: pd.DataFrame) -> pd.DataFrame:
    """Geomean speed-up per strategy that drafted over ``rows`` (``kinds.per_setting``), with its family."""
    frame = per_setting(rows)
    frame["family"] = [family(str(s)) for s in frame.index]
    return frame[(frame["drafted"] > 0) & frame["family"].notna()]


def _replay_split(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """The replay rows to report on (the test split's, or every one without a split) and the train rows (or None)."""
    rows = runs[runs["mode"] == "replay"]
    if "split" in rows and {"train", "test"} <= set(rows["split"].dropna()):
        return rows[rows["split"] == "test"], rows[rows["split"] == "train"]
    return rows, None


def _best(frame: pd.DataFrame, fam: str) -> tuple[str | None, float]:
    cands = frame[frame["family"] == fam]["speedup"].dropna()
    return (cands.idxmax(), float(cands.max())) if not cands.empty else (None, math.nan)


def drafter_answer(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per kind (and ``all``) of the test split (every prompt when there is no split): module doc."""
    if runs.empty or "mode" not in runs:
        return pd.DataFrame(columns=COLUMNS)
    test, train_rows = _replay_split(runs)
    train = _speedups(train_rows) if train_rows is not None else None
    chosen = {f: _best(train, f)[0] for f in FAMILIES} if train is not None else {}
    whole = _speedups(test)
    if test.empty or not (whole["family"] == "hybrid").any():
        return pd.DataFrame(columns=COLUMNS)
    out = []
    for kind in [ALL] + list(dict.fromkeys(test["kind"])):
        part = test if kind == ALL else test[test["kind"] == kind]
        frame = whole if kind == ALL else _speedups(part)
        row = {"kind": kind, "prompts": int(part["prompt_id"].nunique())}
        for fam in FAMILIES:
            row[f"best_{fam}"], row[f"{fam}_speedup"] = _best(frame, fam)
            spec = chosen.get(fam)
            row[f"chosen_{fam}"] = spec
            row[f"chosen_{fam}_test"] = float(frame["speedup"].get(spec, math.nan)) if spec else math.nan
        better = max((row["context_speedup"], row["assistant_speedup"]), key=lambda v: -math.inf if v != v else v)
        row["hybrid_over_better"] = row["hybrid_speedup"] / better if better == better else math.nan
        out.append(row)
    return pd.DataFrame(out, columns=COLUMNS)


def paired(runs: pd.DataFrame) -> pd.DataFrame:
    """What adding a context drafter does to an assistant rule: per context drafter and kind of the test split (every
    prompt without a split), the smallest, geometric-mean and largest ratio of ``hybrid:C+X`` to ``X`` alone over every
    assistant rule X the runs hold both ways."""
    if runs.empty or "mode" not in runs:
        return pd.DataFrame()
    rows, _ = _replay_split(runs)
    out = []
    for kind in [ALL] + list(dict.fromkeys(rows["kind"])):
        part = rows if kind == ALL else rows[rows["kind"] == kind]
        if part.empty:
            continue
        speed = per_setting(part)["speedup"]
        ratios: dict[str, list[float]] = {}
        for spec in speed.index:
            if family(str(spec)) != "hybrid":
                continue
            base = str(spec).split("@")[0]
            context, _, assistant = base.removeprefix("hybrid:").partition("+")
            alone = assistant + str(spec)[len(base):]
            if alone in speed.index and speed[alone] > 0:
                ratios.setdefault(context, []).append(float(speed[spec] / speed[alone]))
        for context, values in ratios.items():
            out.append({"kind": kind, "context": context, "pairs": len(values), "min": min(values),
                        "geomean": geomean(pd.Series(values)), "max": max(values)})
    return pd.DataFrame(out)


def paired_md(frame: pd.DataFrame) -> str:
    if frame.empty:
        return ""
    kinds = list(dict.fromkeys(frame["kind"]))
    lines = ["### Adding a context drafter to an assistant rule (hybrid ÷ the same rule alone)", "",
             "| context drafter | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
    for context in dict.fromkeys(frame["context"]):
        cells = []
        for kind in kinds:
            r = frame[(frame["kind"] == kind) & (frame["context"] == context)]
            cells.append("—" if r.empty else f"{r.iloc[0]['min']:.2f}–{r.iloc[0]['max']:.2f} "
                                             f"({r.iloc[0]['geomean']:.3f})")
        lines.append(f"| `{context}` | " + " | ".join(cells) + " |")
    lines += ["", "Each cell: smallest–largest ratio over every assistant rule raced both alone and in a hybrid with that "
              "context drafter (geometric mean in brackets); below 1 the context's draft displaced a better assistant "
              "draft or was rejected."]
    return "\n".join(lines) + "\n"


def drafter_answer_md(frame: pd.DataFrame, cost_words: str = "") -> str:
    if frame.empty:
        return ""
    lines = [f"## Who drafts: the context, the assistant or both (replay{', ' + cost_words if cost_words else ''})", "",
             "| kind | prompts | best from the context | best with the assistant | best hybrid | hybrid ÷ the better |",
             "|---|---|---|---|---|---|"]
    for r in frame.to_dict("records"):
        cells = [f"`{r[f'best_{f}']}` {speedup_text(r[f'{f}_speedup'])}" if isinstance(r[f"best_{f}"], str) else "—"
                 for f in FAMILIES]
        ratio = r["hybrid_over_better"]
        lines.append(f"| {r['kind']} | {r['prompts']} | " + " | ".join(cells) +
                     f" | {'—' if ratio != ratio else f'{ratio:.3f}'} |")
    first = frame.iloc[0]
    if isinstance(first["chosen_hybrid"], str):
        lines += ["", "Chosen on the train prompts (all kinds together), reported on each kind's test prompts:", "",
                  f"| kind | `{first['chosen_context']}` | `{first['chosen_assistant']}` | `{first['chosen_hybrid']}` |",
                  "|---|---|---|---|"]
        for r in frame.to_dict("records"):
            lines.append(f"| {r['kind']} | " + " | ".join(speedup_text(r[f"chosen_{f}_test"]) for f in FAMILIES) + " |")
    lines += ["", "Best in hindsight on the kind's own prompts, geometric means; a setting counts where it drafted. "
              "\"The better\": the faster of the best context drafter and the best assistant lane; a hybrid is worth "
              "running where this ratio is at least 1 on every kind."]
    return "\n".join(lines) + "\n"
