"""Settings to take away: a DISCO Lab setting as configuration for the engines people deploy with.

``take_away(policy)`` maps one policy to
  * transformers: ``generate`` / ``GenerationConfig`` fields (``GenerationConfig(**fields)`` accepts them);
  * llama.cpp: the flags of the version this project vendors (llama-cpp-python 0.3.36's llama.cpp: ``common/arg.cpp``
    and ``common/speculative.cpp``), for ``llama-server`` / ``llama-speculative-simple``;
  * vLLM: its ``speculative_config`` (``num_speculative_tokens``; ``method: ngram`` with ``prompt_lookup_max`` /
    ``prompt_lookup_min`` for prompt lookup; ``num_speculative_tokens_per_batch_size`` when a batch-size table is
    given, ``disco.costs.profile.Profile.batch_table``).
Where an engine has no exact counterpart the nearest setting is given with a note that says how it differs.
"""

from __future__ import annotations

import json

from disco.policies.base import Policy
from disco.policies.hybrid import join_llama_flags

ENGINES = ("transformers", "llama.cpp", "vllm")
SKLEARN_NOTE = ("with scikit-learn installed, transformers adapts a non-zero assistant_confidence_threshold online "
                "(an ROC curve over accepted drafts; DISCO Lab's `adaptive` lane); DISCO Lab's `threshold` keeps it fixed")
PMIN_NOTE = ("llama.cpp's p-min differs from transformers' threshold: it compares the drafted token's probability "
             "renormalized over the draft's 10 likeliest tokens, and a token below p-min is dropped, not sent "
             "(transformers sends it and stops); DISCO Lab's `pmin:P:NMAX` is that rule, race it beside `threshold`")
HYBRID_NOTE = ("transformers drafts with prompt lookup or with an assistant, never both: the assistant part's setting, "
               "without the context drafter")
VLLM_HYBRID_NOTE = ("vLLM runs one drafting method per server (its ngram-eagle hybrid, PR #24344, pairs n-gram with "
                    "EAGLE heads, not a draft model): the assistant part's setting, without the context drafter")
LOOKUP_NOTE = ("llama.cpp's ngram-simple matches exactly N tokens at their latest earlier occurrence and drafts M; "
               "transformers matches the earliest occurrence of the longest n-gram up to N")


def _entry(config: dict | None, text: str, note: str = "", exact: bool = True) -> dict:
    return {"config": config, "text": text, "note": note, "exact": exact and config is not None}


def _part_of(entry: dict, note: str) -> dict:
    """An engine's entry for a hybrid's assistant part, marked as the nearest setting."""
    return _entry(entry["config"], entry["text"], "; ".join(n for n in (note, entry["note"]) if n), False)


def _transformers(policy: Policy) -> dict:
    if policy.composite:
        return _part_of(_transformers(policy.from_assistant), HYBRID_NOTE)
    kind, v = policy.kind, policy.values
    fields = policy.hf_kwargs()
    note, exact = "", True
    if fields is None:
        if kind == "pmin":
            fields = {"num_assistant_tokens": v["k"], "num_assistant_tokens_schedule": "constant",
                      "assistant_confidence_threshold": v["p"]}
            note, exact = "nearest: transformers' threshold; " + PMIN_NOTE, False
        elif kind in ("copy", "suffix"):
            fields = {"prompt_lookup_num_tokens": v["k"], "max_matching_ngram_size": 2}
            note, exact = ("nearest: plain prompt lookup of KMAX tokens (transformers has no evidence gate or length rule: "
                           "it drafts whenever a 2-gram matches)"), False
        elif "k" in v:
            fields = {"num_assistant_tokens": v["k"], "num_assistant_tokens_schedule": "constant",
                      "assistant_confidence_threshold": 0.0}
            note, exact = f"no transformers counterpart of `{kind}`; nearest: static K = {v['k']}", False
        else:
            return _entry(None, "", f"no transformers counterpart of `{kind}`", False)
    if fields.get("assistant_confidence_threshold"):
        note = "; ".join(n for n in (note, SKLEARN_NOTE) if n)
    assistant = "" if policy.proposes else "assistant_model=assistant, "
    args = ", ".join(f"{k}={v!r}" for k, v in fields.items())
    text = f"model.generate(**inputs, {assistant}do_sample=False, {args})"
    return _entry(fields, text, note, exact)


def _llama_hybrid(policy: Policy) -> dict:
    """llama.cpp's comma-separated --spec-type: its n-gram drafter first, its draft model when that has no draft."""
    context, assistant = _llama(policy.from_context), _llama(policy.from_assistant)
    if context["config"] is None or assistant["config"] is None:
        return _entry(None, "", "no llama.cpp counterpart of one of its parts", False)
    flags = join_llama_flags(context["config"], assistant["config"])
    exact = context["exact"] and assistant["exact"]
    notes = [n for n in (context["note"], assistant["note"]) if n]
    note = "llama.cpp asks its n-gram drafter first and drafts with the model only when that finds no match"
    return _entry(flags, "llama-server -m TARGET.gguf --spec-draft-model ASSISTANT.gguf " + " ".join(flags),
                  "; ".join([note] + notes), exact)


def _llama(policy: Policy) -> dict:
    if policy.composite:
        return _llama_hybrid(policy)
    kind, v = policy.kind, policy.values
    note, exact = "", True
    if kind in ("pmin", "ngram"):
        flags = policy.llama_args()
    elif kind == "static":
        flags = ["--spec-type", "draft-simple", "--spec-draft-n-max", str(v["k"]), "--spec-draft-n-min", "0",
                 "--spec-draft-p-min", "0"]
        note = "p-min 0 never stops a draft: always K tokens, as static K"
    elif kind in ("threshold", "adaptive"):
        flags = ["--spec-type", "draft-simple", "--spec-draft-n-max", str(v["k"]), "--spec-draft-n-min", "0",
                 "--spec-draft-p-min", f"{v['tau']:g}"]
        note, exact = "nearest: " + PMIN_NOTE, False
    elif kind in ("lookup", "copy", "suffix"):
        n = v.get("ngram", v.get("min_evidence", 2))
        flags = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(n), "--spec-ngram-simple-size-m",
                 str(v["k"])]
        own = {"lookup": "", "copy": "; DISCO Lab's copy drafts only as many tokens as agree",
               "suffix": "; suffix decoding follows the most frequent continuation, FACTOR × the match long"}
        note, exact = "nearest: " + LOOKUP_NOTE + own[kind], False
    elif "k" in v:
        flags = ["--spec-type", "draft-simple", "--spec-draft-n-max", str(v["k"]), "--spec-draft-p-min", "0"]
        note, exact = f"no llama.cpp counterpart of `{kind}`; nearest: static K = {v['k']}", False
    else:
        return _entry(None, "", f"no llama.cpp counterpart of `{kind}`", False)
    model = "" if policy.proposes else "--spec-draft-model ASSISTANT.gguf "
    return _entry(flags, f"llama-server -m TARGET.gguf {model}" + " ".join(flags), note, exact)


def _vllm(policy: Policy, batch_table: list[list[int]] | None) -> dict:
    if policy.composite:
        return _part_of(_vllm(policy.from_assistant, batch_table), VLLM_HYBRID_NOTE)
    kind, v = policy.kind, policy.values
    note, exact = "", kind in ("static", "lookup", "suffix")
    if kind == "suffix":  # vLLM's own method (Arctic Inference); its global tree of earlier requests is extra there
        config = {"method": "suffix", "num_speculative_tokens": v["k"], "suffix_decoding_max_spec_factor": v["factor"],
                  "suffix_decoding_min_token_prob": v["min_prob"]}
        note = "vLLM also matches a global tree of earlier requests' outputs (suffix_decoding_max_cached_requests)"
    elif kind in ("lookup", "copy", "ngram"):
        low = {"lookup": 1, "copy": v.get("min_evidence"), "ngram": v.get("ngram")}[kind]
        config = {"method": "ngram", "num_speculative_tokens": v["k"],
                  "prompt_lookup_max": max(low, v.get("ngram", 2)), "prompt_lookup_min": low}
        if kind == "copy":
            note = "nearest: vLLM's n-gram proposer drafts a fixed number of tokens"
        elif kind == "ngram":
            exact, note = False, ("nearest: vLLM's n-gram proposer matching exactly N tokens; where it takes the match and "
                                  "how many tokens it sends differ from llama.cpp's ngram-simple")
    elif "k" in v:
        k = v["k"]
        if kind != "static":
            modelled = max((row[2] for row in batch_table or ()), default=0)
            if modelled:
                k = modelled
                note = (f"vLLM drafts a fixed number of tokens per step (no confidence stop): the largest static K "
                        f"modelled here for any batch size, {k}, instead of `{kind}`")
            else:
                note = f"vLLM drafts a fixed number of tokens per step (no confidence stop): `{kind}`'s most, {k}"
        batch_table = _capped(batch_table, k)
        config = {"method": "draft_model", "model": "ASSISTANT", "num_speculative_tokens": k}
    else:
        return _entry(None, "", f"no vLLM counterpart of `{kind}`", False)
    if batch_table and config["method"] == "draft_model":
        config["num_speculative_tokens_per_batch_size"] = batch_table
        never = " (it says speculation does not pay here at any batch size)" if all(r[2] == 0 for r in batch_table) else ""
        note = "; ".join(n for n in (note, "the batch-size table is modelled from this machine's pass costs "
                                           "(a batch of B sequences verifying K+1 tokens each costed as one pass of "
                                           f"B(K+1) tokens), not measured with concurrent requests{never}") if n)
    return _entry(config, f"--speculative-config '{json.dumps(config)}'", note, exact)


def _capped(table: list[list[int]] | None, k: int) -> list[list[int]] | None:
    """The batch-size table with no entry above ``num_speculative_tokens`` (vLLM's cap), equal neighbours merged."""
    rows: list[list[int]] = []
    for first, last, kk in table or ():
        kk = min(kk, k)
        if rows and rows[-1][2] == kk:
            rows[-1][1] = last
        else:
            rows.append([first, last, kk])
    return rows or None


def take_away(policy: Policy, batch_table: list[list[int]] | None = None) -> dict:
    """``{"spec": ..., "transformers": entry, "llama.cpp": entry, "vllm": entry}``; each entry holds ``config`` (None
    where the engine has nothing near), ``text`` (copy-paste), ``note`` and ``exact``."""
    if not policy.drafts:
        off = _entry({}, "", "the target alone: leave speculative decoding off")
        return {"spec": policy.spec, **{e: off for e in ENGINES}}
    if policy.probes_verification:
        none = _entry(None, "", "the oracle knows the target's answer in advance: an upper bound, nothing to deploy")
        return {"spec": policy.spec, **{e: none for e in ENGINES}}
    return {"spec": policy.spec, "transformers": _transformers(policy), "llama.cpp": _llama(policy),
            "vllm": _vllm(policy, batch_table)}


def take_away_md(settings: dict) -> str:
    """The three engines' settings as markdown (a code line each, the note below it)."""
    lines = [f"**Take `{settings['spec']}` to your engine**"]
    for engine in ENGINES:
        e = settings[engine]
        if e["config"] is None:
            lines.append(f"- {engine}: {e['note']}")
            continue
        text = f"`{e['text']}`" if e["text"] else "(nothing to set)"
        lines.append(f"- {engine}{'' if e['exact'] else ' (nearest)'}: {text}" + (f"  \n  <small>{e['note']}</small>"
                                                                                if e["note"] else ""))
    return "\n".join(lines)
