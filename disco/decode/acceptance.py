"""Acceptance figures named as the engines name them: one lane's per-iteration rows (``iterations_frame``) counted
the way DISCO Lab, vLLM, llama.cpp and SGLang count, so a figure here can be set beside the one an engine prints.

Every function takes the rows of ONE lane (``frame[frame["strategy"] == spec]``; rows of several lanes are pooled)
with at least the columns ``lookahead`` (tokens drafted and sent for verification), ``accepted`` (drafted tokens the
target accepted), ``emitted`` (tokens appended to the output) and ``max_lookahead`` (K in force); ``ours`` also reads
``stop_reason`` when there is one. An empty frame, or one where nothing was drafted, gives NaN ratios, never an error.

The words, once:
  * iteration / verify pass: one target forward pass (every row; iteration 1 also holds the prompt's prefill, and it
    verifies drafts too: DISCO Lab drafts before its first target pass);
  * draft: an iteration that sent at least one drafted token (``lookahead > 0``). Figures defined "per draft" ignore
    iterations that sent nothing (autoregressive rows, a draft discarded as too short, a prompt lookup with no match),
    as vLLM does (its scheduler records a draft only when the step scheduled speculative tokens);
  * greedy acceptance and stops: ``emitted`` is ``accepted + 1`` except on the last iteration of a run cut at EOS or at
    ``max_new_tokens``, where it can be less (the tokens after the stop, the target's own included, are dropped).
    ``accepted`` is NOT cut: it counts every drafted token the target accepted, as vLLM's rejection sampler output does
    (its scheduler counts ``len(generated_token_ids) - 1`` before it trims at a stop) and as llama.cpp does (it adds
    ``ids.size() - 1`` before it looks for EOS). SGLang counts what it appends, up to the stop: its figures use
    ``emitted``. Each function below says which it uses.

Sources read (paths in each project's repository; the glossary, ``docs/glossary.md``, has the table):
  vLLM ``vllm/v1/spec_decode/metrics.py`` (``SpecDecodingStats.observe_draft``, ``SpecDecodingLogging.log``,
  ``compute_acceptance_len``), ``vllm/v1/core/sched/scheduler.py`` (``update_from_output``,
  ``make_spec_decoding_stats``), ``vllm/config/speculative.py`` (``synthetic_acceptance_rates``,
  ``_resolve_synthetic_acceptance_rates``); llama.cpp ``examples/speculative-simple/speculative-simple.cpp`` and
  ``common/speculative.cpp`` (the copy vendored by llama-cpp-python 0.3.36 and upstream's agree on the counting);
  SGLang ``python/sglang/srt/managers/tokenizer_manager.py`` (``_calculate_spec_decoding_metrics``) and its verify step
  (``python/sglang/srt/speculative/eagle_info.py``, ``spec_verify_ct`` / ``spec_accepted_tokens``). Not verified: how
  every SGLang version and worker (overlap scheduler, n-gram, DFlash) counts accepted tokens of a request that stops
  mid-verify (the copies read recompute the accept length after the stop: that is what ``sglang`` assumes), and
  whether SGLang's n-gram worker ever verifies an empty draft.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from disco.decode.stops import STOP_NONE
from disco.errors import InputError

NAN = math.nan
REQUIRED = ("lookahead", "accepted", "emitted", "max_lookahead")
# the columns ``summarize`` appends after its own (``disco.decode.trace.summarize``)
SUMMARY_COLUMNS = ("vllm_acceptance_rate", "vllm_mean_acceptance_length", "llamacpp_accept_pct", "sglang_accept_length")
POSITION_COLUMNS = ["position", "drafts", "had_token", "reached", "accepted_at", "conditional_rate",
                    "unconditional_rate"]
DECIMALS = 4  # synthetic_acceptance_rates are rounded to this many decimals


def _rows(frame: pd.DataFrame | None) -> pd.DataFrame:
    if frame is None or len(frame) == 0:  # no rows: nothing to count, whatever the columns
        return pd.DataFrame(columns=list(REQUIRED))
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise InputError(f"an iterations frame needs the columns {', '.join(missing)} (disco.decode.trace)")
    return frame


def _ints(rows: pd.DataFrame, column: str) -> np.ndarray:
    return rows[column].to_numpy(dtype=np.int64) if len(rows) else np.zeros(0, dtype=np.int64)


def _ratio(num: float, den: float) -> float:
    return num / den if den else NAN


def ours(frame: pd.DataFrame | None) -> dict:
    """Today's columns, exactly as ``summarize`` computes them (it filters one strategy's rows first):

      * ``target_calls`` = number of iterations (one target pass each);
      * ``drafted`` = sum(lookahead) over all iterations; ``accepted`` = sum(accepted) (not cut at a stop);
      * ``acceptance_rate`` = accepted / drafted (NaN when nothing was drafted);
      * ``mean_lookahead`` = mean(lookahead) over the iterations whose ``stop_reason`` is not ``none`` - zero-length
        drafts of a drafting policy (discarded as too short, no lookup match) included, unlike vLLM's per-draft
        figures; 0.0 for a lane that never drafts by design (autoregressive), NaN for no rows at all. A frame without
        ``stop_reason`` counts the iterations with ``max_lookahead > 0`` instead (the same rows for DISCO Lab's lanes).
    """
    rows = _rows(frame)
    if rows.empty:
        return {"target_calls": 0, "drafted": 0, "accepted": 0, "acceptance_rate": NAN, "mean_lookahead": NAN}
    drafted = int(rows["lookahead"].sum())
    accepted = int(rows["accepted"].sum())
    speculative = rows["stop_reason"] != STOP_NONE if "stop_reason" in rows else rows["max_lookahead"] > 0
    return {
        "target_calls": len(rows),
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_rate": accepted / drafted if drafted else NAN,
        "mean_lookahead": float(rows.loc[speculative, "lookahead"].mean()) if speculative.any() else 0.0,
    }


def _spec_tokens(lookahead: np.ndarray, max_lookahead: np.ndarray) -> int:
    """vLLM's ``num_spec_tokens`` for a dynamic lane: the largest K in force (or drafted) over its drafts."""
    drafts = lookahead > 0
    if not drafts.any():
        return 0
    return int(max(max_lookahead[drafts].max(), lookahead[drafts].max()))


def vllm(frame: pd.DataFrame | None, k: int | None = None) -> dict:
    """vLLM's spec-decode metrics (``vllm/v1/spec_decode/metrics.py``), per draft (iterations with lookahead 0 ignored):

      * ``num_drafts`` = iterations with lookahead > 0;
      * ``num_draft_tokens`` = sum(lookahead); ``num_accepted_tokens`` = sum(accepted) (not cut at a stop: vLLM counts
        what its rejection sampler accepted, before the stop check trims the output);
      * ``acceptance_rate`` = num_accepted_tokens / num_draft_tokens (vLLM logs it x100 as "Avg Draft acceptance rate");
      * ``mean_acceptance_length`` = 1 + num_accepted_tokens / num_drafts (the "+1" is the target's own token, counted
        whether or not a stop dropped it). NaN with no drafts (vLLM logs nothing then; ``compute_acceptance_len``
        says 1);
      * ``num_accepted_tokens_per_pos[i-1]`` = drafts with accepted >= i, for i = 1..k, and
        ``per_position_acceptance_rate`` = that / num_drafts: unconditional, a draft shorter than i counts as not
        accepted at i (vLLM's way: its counter only goes up to each draft's accepted count).

    ``k`` is vLLM's ``num_speculative_tokens`` (the length of the per-position vectors); by default the largest K in
    force over the drafts. vLLM subtracts tokens a grammar invalidated (structured output); DISCO Lab has none.
    """
    rows = _rows(frame)
    lookahead, accepted = _ints(rows, "lookahead"), _ints(rows, "accepted")
    k = _spec_tokens(lookahead, _ints(rows, "max_lookahead")) if k is None else int(k)
    drafts = lookahead > 0
    num_drafts = int(drafts.sum())
    num_draft_tokens = int(lookahead[drafts].sum())
    num_accepted = int(accepted[drafts].sum())
    per_pos = [int((accepted[drafts] >= i).sum()) for i in range(1, k + 1)]
    return {
        "num_drafts": num_drafts,
        "num_draft_tokens": num_draft_tokens,
        "num_accepted_tokens": num_accepted,
        "acceptance_rate": _ratio(num_accepted, num_draft_tokens),
        "mean_acceptance_length": 1 + num_accepted / num_drafts if num_drafts else NAN,
        "num_accepted_tokens_per_pos": per_pos,
        "per_position_acceptance_rate": [_ratio(n, num_drafts) for n in per_pos],
    }


def llamacpp(frame: pd.DataFrame | None) -> dict:
    """What ``llama-speculative-simple`` prints at its end (``examples/speculative-simple/speculative-simple.cpp``):

      * ``n_drafted`` = sum(lookahead) over all iterations (a draft discarded as shorter than n-min is emptied by
        ``common/speculative.cpp`` and adds 0, "we ignore the discarded small drafts");
      * ``n_accept`` = sum(accepted) (it adds ``ids.size() - 1`` before it looks for EOS: not cut at a stop);
      * ``accept_pct`` = 100 * n_accept / n_drafted (printed ``accept = %.3f%%``; NaN when nothing was drafted, where
        llama.cpp prints nan or inf);
      * ``n_predict`` = sum(accepted + 1): the tokens it counts as decoded, including any after an EOS in the same
        verify pass; our ``new_tokens`` stops at the EOS and at max_new_tokens, and llama.cpp's loop may overshoot
        ``-n`` (it stops once ``n_predict > -n``).

    Not modelled: its checkpoint path for models whose cache cannot drop a suffix (recurrent ones), which re-verifies a
    partially accepted draft and counts only the final pass.
    """
    rows = _rows(frame)
    lookahead, accepted = _ints(rows, "lookahead"), _ints(rows, "accepted")
    n_drafted, n_accept = int(lookahead.sum()), int(accepted.sum())
    return {
        "n_drafted": n_drafted,
        "n_accept": n_accept,
        "accept_pct": 100.0 * n_accept / n_drafted if n_drafted else NAN,
        "n_predict": int((accepted + 1).sum()),
    }


def sglang(frame: pd.DataFrame | None) -> dict:
    """SGLang's per-request speculative figures (``meta_info`` of ``tokenizer_manager.py``):

      * ``spec_verify_ct`` = verify passes: every iteration of a lane that drafted at all (SGLang verifies on every
        decode step of a speculative request; 0 for a lane that never drafted, as SGLang without speculation);
      * ``accept_length`` = sum(emitted) / spec_verify_ct: tokens per verify pass including the target's own
        (``spec_accept_length = completion_tokens / spec_verify_ct``). ``emitted``, not accepted + 1: SGLang appends
        tokens until the request finishes. SGLang's first token comes from its prefill, which is no verify pass, so
        for the same tokens its figure is a little higher than ours (our iteration 1 is prefill and verify at once);
      * ``accept_token_num`` = sum(emitted - 1) (SGLang's accepted drafts, recomputed up to the stop) and
        ``draft_token_num`` = sum(max_lookahead) over the verify passes: SGLang multiplies the verify count by its
        configured draft tokens per step (``speculative_num_draft_tokens - 1``), not by what was actually drafted; for a
        dynamic lane the K in force stands for it;
      * ``accept_rate`` = accept_token_num / draft_token_num.

    NaN figures when nothing was drafted (SGLang reports 0 there).
    """
    rows = _rows(frame)
    lookahead, emitted = _ints(rows, "lookahead"), _ints(rows, "emitted")
    verify_ct = len(rows) if (lookahead > 0).any() else 0
    accept_tokens = int((emitted - 1).clip(min=0).sum()) if verify_ct else 0
    draft_tokens = int(_ints(rows, "max_lookahead").sum()) if verify_ct else 0
    return {
        "spec_verify_ct": verify_ct,
        "accept_length": _ratio(int(emitted.sum()), verify_ct),
        "accept_token_num": accept_tokens,
        "draft_token_num": draft_tokens,
        "accept_rate": _ratio(accept_tokens, draft_tokens),
    }


def per_position(frame: pd.DataFrame | None, kmax: int | None = None) -> pd.DataFrame:
    """Acceptance by draft position i = 1..kmax (default: the longest draft), per draft (lookahead 0 ignored):

      * ``drafts`` = all drafts; ``had_token`` = drafts with an i-th token (lookahead >= i);
      * ``reached`` = drafts whose i-th token was judged: it was drafted and tokens 1..i-1 were accepted
        (lookahead >= i and accepted >= i - 1); ``accepted_at`` = drafts with accepted >= i;
      * ``conditional_rate`` = accepted_at / reached: P(i accepted | 1..i-1 accepted and i drafted). A position beyond a
        draft is unobserved, not a rejection (a draft of 2 fully accepted says nothing about position 3); NaN where
        no draft reached i. The same counts as ``disco.decode.trace.position_acceptance`` (which stops at the first
        position no draft reached);
      * ``unconditional_rate`` = accepted_at / drafts: P(the first i tokens all accepted), a draft shorter than i
        counting as not accepted at i (vLLM's per-position rate; NaN with no drafts, 0 beyond every draft).
    """
    rows = _rows(frame)
    lookahead, accepted = _ints(rows, "lookahead"), _ints(rows, "accepted")
    drafts = lookahead > 0
    lookahead, accepted = lookahead[drafts], accepted[drafts]
    n = len(lookahead)
    kmax = int(lookahead.max(initial=0)) if kmax is None else int(kmax)
    table = []
    for i in range(1, kmax + 1):
        reached = int(((lookahead >= i) & (accepted >= i - 1)).sum())
        ok = int((accepted >= i).sum())
        table.append({"position": i, "drafts": n, "had_token": int((lookahead >= i).sum()), "reached": reached,
                      "accepted_at": ok, "conditional_rate": _ratio(ok, reached), "unconditional_rate": _ratio(ok, n)})
    return pd.DataFrame(table, columns=POSITION_COLUMNS)


def non_increasing(values) -> list[float]:
    """The running minimum: each value capped by every one before it (NaN stays NaN)."""
    out, low = [], math.inf
    for v in values:
        v = float(v)
        if not math.isnan(v):
            low = min(low, v)
            v = low
        out.append(v)
    return out


def _check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise InputError(f"num_speculative_tokens must be a positive integer, got {k!r}")
    return int(k)


def synthetic_acceptance_rates(frame: pd.DataFrame | None, k: int) -> list[float]:
    """vLLM's ``synthetic_acceptance_rates`` for ``num_speculative_tokens = k`` from this lane's drafts: entry i-1 is
    the unconditional rate of position i (``per_position``'s ``unconditional_rate``: the share of drafts whose first i
    tokens were all accepted, a shorter draft counting as not accepted), for i = 1..k.

    vLLM requires (``vllm/config/speculative.py``, ``_resolve_synthetic_acceptance_rates``) length k, each entry in
    [0, 1], non-increasing. Unconditional rates are non-increasing by construction; the running minimum
    (``non_increasing``) enforces it anyway, then the entries are clipped to [0, 1] and rounded to 4 decimals
    (rounding keeps the order). Positions beyond k are dropped, so with k below the lane's longest draft the vLLM
    mean acceptance length this implies (1 + sum of the rates) is lower than the lane's. All NaN when the lane never
    drafted (``vllm_speculative_config`` refuses that)."""
    k = _check_k(k)
    rates = per_position(frame, k)["unconditional_rate"].tolist()
    if any(math.isnan(r) for r in rates):
        return [NAN] * k
    return [round(min(1.0, max(0.0, r)), DECIMALS) for r in non_increasing(rates)]


def vllm_speculative_config(frame: pd.DataFrame | None, k: int) -> dict:
    """The ``speculative_config`` fragment that makes vLLM accept drafts at this lane's measured per-position rates:
    ``{"num_speculative_tokens": k, "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [...]}``.
    vLLM accepts ``synthetic_acceptance_rates`` only with ``rejection_sample_method="synthetic"`` (and not together
    with ``synthetic_acceptance_length``); merge it with the method and model of the deployment. Raises
    ``InputError`` when the lane never drafted (there is nothing to calibrate)."""
    rates = synthetic_acceptance_rates(frame, k)
    if any(math.isnan(r) for r in rates):
        raise InputError("this trace has no drafts: no synthetic_acceptance_rates to give vLLM")
    return {"num_speculative_tokens": len(rates), "rejection_sample_method": "synthetic",
            "synthetic_acceptance_rates": rates}


def figures(frame: pd.DataFrame | None) -> dict:
    """Every scalar and per-position figure above in one flat dict: ours unprefixed (``summarize``'s names), the
    engines' prefixed ``vllm_``, ``llamacpp_``, ``sglang_``. Its keys are the columns of ``DEFINITIONS`` that are not
    ``per_position`` / synthetic columns."""
    out = dict(ours(frame))
    for prefix, values in (("vllm_", vllm(frame)), ("llamacpp_", llamacpp(frame)), ("sglang_", sglang(frame))):
        out.update({prefix + key: value for key, value in values.items()})
    return out


def summary_columns(frame: pd.DataFrame | None) -> dict:
    """The engines' headline figures ``summarize`` appends after its own columns (``SUMMARY_COLUMNS``)."""
    every = figures(frame)
    return {column: every[column] for column in SUMMARY_COLUMNS}


# (column, formula, engine, the engine's own name for it): the glossary (docs/glossary.md) lists every row
DEFINITIONS = [
    ("target_calls", "iterations (one target pass each)", "DISCO Lab", "summarize: target_calls"),
    ("drafted", "sum(lookahead)", "DISCO Lab", "summarize: drafted"),
    ("accepted", "sum(accepted)", "DISCO Lab", "summarize: accepted"),
    ("acceptance_rate", "sum(accepted) / sum(lookahead)", "DISCO Lab", "summarize: acceptance_rate"),
    ("mean_lookahead", "mean(lookahead) over iterations with stop_reason != none", "DISCO Lab",
     "summarize: mean_lookahead"),
    ("vllm_num_drafts", "count(lookahead > 0)", "vLLM", "num_drafts (vllm:spec_decode_num_drafts)"),
    ("vllm_num_draft_tokens", "sum(lookahead)", "vLLM", "num_draft_tokens (vllm:spec_decode_num_draft_tokens)"),
    ("vllm_num_accepted_tokens", "sum(accepted)", "vLLM",
     "num_accepted_tokens (vllm:spec_decode_num_accepted_tokens)"),
    ("vllm_acceptance_rate", "num_accepted_tokens / num_draft_tokens", "vLLM",
     "Avg Draft acceptance rate (logged x100, %)"),
    ("vllm_mean_acceptance_length", "1 + num_accepted_tokens / num_drafts", "vLLM", "Mean acceptance length"),
    ("vllm_num_accepted_tokens_per_pos", "[count(accepted >= i) over drafts for i = 1..k]", "vLLM",
     "num_accepted_tokens_per_pos (vllm:spec_decode_num_accepted_tokens_per_pos)"),
    ("vllm_per_position_acceptance_rate", "num_accepted_tokens_per_pos[i] / num_drafts", "vLLM",
     "Per-position acceptance rate"),
    ("llamacpp_n_drafted", "sum(lookahead)", "llama.cpp", "n_drafted"),
    ("llamacpp_n_accept", "sum(accepted)", "llama.cpp", "n_accept"),
    ("llamacpp_accept_pct", "100 * n_accept / n_drafted", "llama.cpp", "accept (%)"),
    ("llamacpp_n_predict", "sum(accepted + 1)", "llama.cpp", "n_predict (decoded N tokens)"),
    ("sglang_spec_verify_ct", "iterations (when the lane drafted at all)", "SGLang", "spec_verify_ct"),
    ("sglang_accept_length", "sum(emitted) / spec_verify_ct", "SGLang",
     "spec_accept_length (completion_tokens / spec_verify_ct)"),
    ("sglang_accept_token_num", "sum(emitted - 1) over verify passes", "SGLang", "spec_accept_token_num"),
    ("sglang_draft_token_num", "sum(max_lookahead) over verify passes", "SGLang",
     "spec_draft_token_num (spec_verify_ct x (speculative_num_draft_tokens - 1))"),
    ("sglang_accept_rate", "accept_token_num / draft_token_num", "SGLang", "spec_accept_rate"),
    ("drafts", "count(lookahead > 0)", "per position", "vLLM num_drafts"),
    ("had_token", "count(lookahead >= i)", "per position", "-"),
    ("reached", "count(lookahead >= i and accepted >= i - 1)", "per position",
     "DISCO Lab position_acceptance: reached"),
    ("accepted_at", "count(accepted >= i) over drafts", "per position", "vLLM num_accepted_tokens_per_pos[i - 1]"),
    ("conditional_rate", "accepted_at / reached", "per position", "DISCO Lab position_acceptance: rate"),
    ("unconditional_rate", "accepted_at / drafts", "per position", "vLLM per-position acceptance rate"),
    ("synthetic_acceptance_rates", "running min of unconditional_rate for i = 1..k, rounded to 4 decimals", "vLLM",
     "speculative_config synthetic_acceptance_rates"),
]
