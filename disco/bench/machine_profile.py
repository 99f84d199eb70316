"""Measuring this machine's cost profile (``disco.costs.profile`` holds the record): ``python -m disco profile``, and
the app in the background after start-up.

What it measures, on the real models:
  * target: one pass over n = 1..33 tokens on top of a ~40-token cache (verification of n - 1 drafts), and a
    prefill of the prompts' lengths (iteration 1 feeds the prompt and the first drafts in one pass);
  * assistant: one step (1-3 tokens on top of its cache) and a prefill, for each assistant precision;
  * acceptance: exact greedy replay (``disco.replay``) of a grid of static K and threshold settings over a few
    suite prompts, per assistant precision. Replay gives each setting's iterations exactly; its time is the
    measured per-pass costs above. The best settings become the recommendation and the app's ``auto`` lane.
The replay tables go to the one cache, so a Sweep of the same prompts replays them without the models.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path

from disco import cache
from disco.bench.analysis import geomean
from disco.suites import load_suite
from disco.costs.profile import (
    DEFAULT_PROMPTS, DEFAULT_TOKENS, Profile, ProfileError, load_cached, save,
)
from disco.errors import Interrupted
from disco.models.keys import machine_key
from disco.models import numerics, precision as prec
from disco.models.pair import encode_prompt
from disco.models.timing import pass_costs, prefill_costs
from disco.policies import KMAXES, STATIC_KS
from disco.policies.grids import COARSE_TAUS, default_grid
from disco.replay.run import replay_many
from disco.tables.build import opened

VERIFY_SIZES = tuple(range(1, 34))
QUICK_SIZES = (1, 2, 3, 4, 6, 9, 13, 17, 21)  # a first figure in about a minute, refined by VERIFY_SIZES
ASSISTANT_SIZES = (1, 2, 3)


def grid():
    """The settings the profile replays: the target alone, every static K, and τ 0.1..0.9 × every KMAX."""
    return default_grid(STATIC_KS, COARSE_TAUS, KMAXES, heuristic=(), oracle=False, kinds=())


def suite_prompts(ids=DEFAULT_PROMPTS):
    suite = {p.id: p for p in load_suite().prompts}
    missing = [i for i in ids if i not in suite]
    if missing:
        raise ProfileError(f"unknown suite prompt(s): {', '.join(missing)}")
    return [suite[i] for i in ids]


def measure(pair, models: str, prompts=DEFAULT_PROMPTS, max_new_tokens: int = DEFAULT_TOKENS, reps: int = 3,
            precisions=None, table_dir: Path | None = None, log=None, lock=None, should_stop=None,
            quick: bool = False) -> Profile:
    """Measure the profile (see the module doc). ``lock`` (a reusable context manager, the app gives
    ``disco.models.turns.COMPUTE_LOCK.background``) is held around each chunk of work and released between them,
    so a user's run waits at most one chunk; ``should_stop`` is polled between
    chunks (raises ``disco.errors.Interrupted``). Tables go to ``table_dir`` (default: the one cache), where
    the Sweep tab and the benchmark find them. ``quick``: a preliminary profile first (fewer pass sizes, one
    timing each, the first prompt only), so the app shows a figure within minutes before the full one."""
    start = time.perf_counter()
    sizes = QUICK_SIZES if quick else VERIFY_SIZES
    if quick:
        prompts, reps = tuple(prompts)[:1], 1
    say = log or (lambda _msg: None)
    guard = lock if lock is not None else contextlib.nullcontext()
    if precisions is None:
        precisions = list(prec.BY_ENGINE[pair.engine]) if pair.device.type == "cpu" else [prec.MODEL]

    def chunk():
        if should_stop is not None and should_stop():
            raise Interrupted("profile")
        return guard

    chosen = suite_prompts(prompts)
    encoded = {p.id: encode_prompt(pair, p.prompt, p.chat, max_new_tokens) for p in chosen}
    lengths = sorted(len(v) for v in encoded.values())
    prefill_sizes = sorted({max(max(sizes) + 1, lengths[0]), lengths[-1] + max(KMAXES) + 1})
    ctx = numerics.context_ids(pair)
    views = {p: pair.with_assistant(p) for p in precisions}
    with chunk():
        for view in views.values():
            view.warmup()
        say(f"target: a pass over 1..{max(sizes)} tokens, {reps} times each{' (a quick first look)' if quick else ''} ...")
    target_ms: dict[int, float] = {}
    for lo in range(0, len(sizes), 4):  # four sizes per chunk: a queued run waits ~2 s at most
        with chunk():
            target_ms.update(pass_costs(lambda: pair.session("target"), ctx, sizes[lo:lo + 4], reps))
    longest = max(encoded.values(), key=len)
    with chunk():
        target_prefill = prefill_costs(lambda: pair.session("target"), longest, prefill_sizes, reps)
    assistant_ms, assistant_prefill = {}, {}
    for p, view in views.items():
        with chunk():
            assistant_ms[p] = pass_costs(lambda: view.session("assistant"), ctx, ASSISTANT_SIZES, reps + 2)
            assistant_prefill[p] = prefill_costs(lambda: view.session("assistant"), longest, prefill_sizes, reps)
        say(f"assistant ({p}): {assistant_ms[p][1]:.0f} ms a step, c = {assistant_ms[p][1] / target_ms[1]:.2f}")
    profile = Profile(machine_key(models, pair.device, pair.engine), pair.dtype_name,
                      pair.calibration.to_dict() if getattr(pair, "calibration", None) is not None else None,
                      target_ms, target_prefill, assistant_ms, assistant_prefill, prompts=list(prompts),
                      max_new_tokens=max_new_tokens)
    policies = grid()
    table_dir = cache.tables_dir() if table_dir is None else table_dir
    for p, view in views.items():
        costs = profile.cost_model(p)
        speedups: dict[str, list[float]] = {s.spec: [] for s in policies}
        hits = total = 0
        for prompt in chosen:
            say(f"acceptance ({p}): replaying {len(policies)} settings on {prompt.id} ...")
            with chunk(), opened(view, encoded[prompt.id], max_new_tokens, table_dir, prompt.id) as table:
                results = replay_many(table, policies, max_new_tokens, costs)
            h, t = table.first_token_agreement(max_new_tokens)
            hits, total = hits + h, total + t
            base = results["autoregressive"].summary()["seconds"]
            for s, res in results.items():
                speedups[s].append(base / res.summary()["seconds"])
        profile.acceptance[p] = hits / total if total else math.nan
        profile.replay[p] = {s: geomean(vs) for s, vs in speedups.items() if vs}
    profile.recommended = profile.recommend()
    profile.preliminary = quick
    profile.seconds = time.perf_counter() - start
    profile.measured_at = time.strftime("%Y-%m-%d %H:%M:%S")
    return profile


def get(pair, models: str, refresh: bool = False, root=None, **kwargs) -> Profile:
    """The cached profile, or a fresh measurement (then cached)."""
    prompts = kwargs.get("prompts", DEFAULT_PROMPTS)
    tokens = kwargs.get("max_new_tokens", DEFAULT_TOKENS)
    if not refresh:
        cached = load_cached(models, pair, prompts, tokens, root)
        if cached is not None:
            return cached
    profile = measure(pair, models, **kwargs)
    save(profile, root)
    return profile
