"""Which engine runs a pair fastest on this machine, from both engines' measured profiles (issue 27): the engine
choice is a measurement, like the numerics.

For each engine: its recommended lane (the profile's ``auto``, by exact replay under this engine's own pass costs)
decodes at ``target step / its speed-up`` per token, and its prefill costs about ``prefill ms / prompt tokens`` per
prompt token (the profile's longest prefill point). A run of L prompt tokens and N new tokens then costs
``L · prefill + N · decode`` on each engine: the engine with the smaller cost at the typical run (``PROMPT_TOKENS``,
``NEW_TOKENS``) is chosen, and where the two lines cross (one engine decodes faster, the other prefills faster) the
prompt length from which the other engine wins is given. Measured on an Intel Xeon with AMX (issue 27): torch's best
lane beat llama.cpp's plain decoding on short prompts while llama.cpp prefilled ~5x slower; on the AVX-512 EPYC
llama.cpp's target alone was 3x torch's.
"""

from __future__ import annotations

import math

from disco.models import engine_choice

PROMPT_TOKENS, NEW_TOKENS = 64, 64  # the typical run the choice is made for (the app's default race)
NAMES = {"llamacpp": "llama.cpp", "torch": "torch"}


def engine_figures(profile) -> dict:
    """One engine's figures from its profile: best lane, its decode ms a token, prefill ms a prompt token."""
    rec = profile.recommended
    step = profile.target_ms[1]
    speedup = rec.get("auto_speedup", 1.0) or 1.0
    prefill = {int(n): ms for n, ms in profile.target_prefill_ms.items()}
    if prefill:
        n = max(prefill)
        per_token = prefill[n] / n
    else:
        per_token = step  # no prefill measured: a prompt token costs about a step (a safe upper bound)
    return {"engine": profile.key.get("engine", "torch"), "lane": rec.get("auto", "autoregressive"),
            "lane_speedup": speedup, "step_ms": step, "decode_ms_per_token": step / speedup,
            "prefill_ms_per_token": per_token, "dtype": profile.dtype}


def run_ms(fig: dict, prompt_tokens: int, new_tokens: int) -> float:
    return prompt_tokens * fig["prefill_ms_per_token"] + new_tokens * fig["decode_ms_per_token"]


def decide(profiles: list, prompt_tokens: int = PROMPT_TOKENS, new_tokens: int = NEW_TOKENS) -> dict | None:
    """The faster engine for a run of ``prompt_tokens`` + ``new_tokens`` and why (None with fewer than two engines)."""
    figs = {f["engine"]: f for f in map(engine_figures, profiles)}
    if len(figs) < 2:
        return None
    ranked = sorted(figs.values(), key=lambda f: run_ms(f, prompt_tokens, new_tokens))
    best, other = ranked[0], ranked[1]
    d_best, d_other = best["decode_ms_per_token"], other["decode_ms_per_token"]
    p_best, p_other = best["prefill_ms_per_token"], other["prefill_ms_per_token"]
    # the lines cross where one engine decodes faster and the other prefills faster; the best wins at the typical run,
    # so the other wins beyond the crossing if it prefills faster (long prompts), below it if it decodes faster
    crossing = new_tokens * (d_other - d_best) / (p_best - p_other) if p_best != p_other else math.nan
    above = int(math.ceil(crossing)) if p_other < p_best and d_other > d_best and crossing > 0 else None
    below = int(math.floor(crossing)) if p_other > p_best and d_other < d_best and crossing > 0 else None
    reason = (f"{NAMES[best['engine']]} is faster here: its best lane `{best['lane']}` decodes at "
              f"{d_best:.0f} ms a token against {d_other:.0f} ms for {NAMES[other['engine']]}'s `{other['lane']}`, "
              f"and it prefills at {p_best:.1f} ms a prompt token against {p_other:.1f}")
    if above is not None:
        reason += f"; from about {above} prompt tokens on, {NAMES[other['engine']]} wins (its faster prefill pays more)"
    if below is not None:
        reason += f"; on prompts under about {below} tokens, {NAMES[other['engine']]} wins (its faster decoding pays more)"
    return {"engine": best["engine"], "lane": best["lane"], "reason": reason + ".", "crossover_prompt_tokens": above,
            "other_wins_below_prompt_tokens": below,
            "for_run": {"prompt_tokens": prompt_tokens, "new_tokens": new_tokens},
            "engines": {e: {**f, "run_ms": run_ms(f, prompt_tokens, new_tokens)} for e, f in figs.items()}}


def update(models: str, found: list, device: str = "cpu") -> dict | None:
    """Decide from the profiles ``found`` for this pair (``disco.costs.profile.save`` passes the newest one cached
    for each engine) and keep the decision for ``auto`` (None while one engine is missing)."""
    decision = decide(found)
    if decision is not None:
        engine_choice.save(models, decision, device)
    return decision
