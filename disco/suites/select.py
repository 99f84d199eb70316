"""Which prompts of a suite a run uses, and which split each is in.

* ``sample_units``: a seeded sample of N questions stratified by kind (``--limit N --sample-seed S``): each kind gets
  N in proportion to its share of the suite (largest remainders, at least one per kind while N allows), chosen at
  random within the kind with ``random.Random(S)``; the suite's order is kept. A multi-turn question counts once and
  keeps all its turns.
* ``assign_splits``: by default, within each kind in suite order, questions go alternately to train and test (so
  every kind is on both sides); with ``holdout_kinds`` the named kinds are the test split and every other kind the
  train split (parameters chosen on some categories, reported on the others).
* ``filter_prompts`` keeps ids or kinds (``--prompts``); ``pick_prompts`` spreads a few over the kinds (timed runs).
"""

from __future__ import annotations

import dataclasses
import random

from disco.errors import BenchError
from disco.suites.record import SuitePrompt

SPLITS = ("all", "train", "test")


def _units(prompts: list[SuitePrompt]) -> dict[str, list[SuitePrompt]]:
    units: dict[str, list[SuitePrompt]] = {}
    for p in prompts:
        units.setdefault(p.unit, []).append(p)
    return units


def allocation(sizes: dict[str, int], n: int) -> dict[str, int]:
    """How many of ``n`` each kind gets: the floor of its proportional share, at least one per kind while ``n``
    allows, then the rest one at a time by largest remainder (ties: the kinds' order), never more than a kind holds."""
    total = sum(sizes.values())
    if n >= total:
        return dict(sizes)
    share = {k: n * s / total for k, s in sizes.items()}
    alloc = {k: max(int(share[k]), 1 if n >= len(sizes) else 0) for k in sizes}
    by_remainder = sorted(sizes, key=lambda k: -(share[k] - int(share[k])))  # stable: ties keep the kinds' order
    while sum(alloc.values()) > n:  # the at-least-one rule overshot: take back where the share is furthest exceeded
        k = max((k for k in alloc if alloc[k] > 1), key=lambda k: alloc[k] - share[k])
        alloc[k] -= 1
    while sum(alloc.values()) < n:
        for k in by_remainder:
            if alloc[k] < sizes[k] and sum(alloc.values()) < n:
                alloc[k] += 1
    return alloc


def sample_units(prompts: list[SuitePrompt], n: int, seed: int = 0) -> list[SuitePrompt]:
    """A seeded sample of ``n`` questions stratified by kind (see the module doc); all when ``n`` covers them."""
    if n < 1:
        raise BenchError(f"--limit must be at least 1, got {n}")
    units = _units(prompts)
    by_kind: dict[str, list[str]] = {}
    for unit, members in units.items():
        by_kind.setdefault(members[0].kind, []).append(unit)
    alloc = allocation({k: len(v) for k, v in by_kind.items()}, n)
    rng = random.Random(seed)
    chosen = set()
    for kind, members in by_kind.items():
        chosen.update(rng.sample(members, alloc[kind]))
    return [p for p in prompts if p.unit in chosen]


def assign_splits(prompts: list[SuitePrompt], holdout_kinds: list[str] | None = None) -> list[SuitePrompt]:
    """Each prompt with its split (module doc)."""
    if holdout_kinds:
        kinds = {p.kind for p in prompts}
        unknown = [k for k in holdout_kinds if k not in kinds]
        if unknown:
            raise BenchError(f"--holdout-kinds: no prompt of kind {unknown[0]!r} (kinds: {', '.join(sorted(kinds))})")
        if set(holdout_kinds) >= kinds:
            raise BenchError("--holdout-kinds holds out every kind: leave at least one to choose the settings on")
        which = {p.unit: "test" if p.kind in holdout_kinds else "train" for p in prompts}
    else:
        which, seen = {}, {}
        for p in prompts:
            if p.unit in which:
                continue
            i = seen.get(p.kind, 0)
            seen[p.kind] = i + 1
            which[p.unit] = "train" if i % 2 == 0 else "test"
    return [dataclasses.replace(p, split=which[p.unit]) for p in prompts]


def split_of(prompts: list[SuitePrompt]) -> dict[str, str]:
    """Each prompt's split by id (the one assigned, or the default rule where none is)."""
    if all(p.split for p in prompts):
        return {p.id: p.split for p in prompts}
    return {p.id: p.split for p in assign_splits(prompts)}


def split_prompts(prompts: list[SuitePrompt], split: str | None) -> list[SuitePrompt]:
    """The prompts of one split (``all`` or None: every prompt)."""
    if not split or split == "all":
        return list(prompts)
    if split not in SPLITS:
        raise BenchError(f"unknown split {split!r}: use {', '.join(SPLITS)}")
    which = split_of(prompts)
    return [p for p in prompts if which[p.id] == split]


def filter_prompts(prompts: list[SuitePrompt], selection: str | None) -> list[SuitePrompt]:
    """Keep prompts whose id, question or kind is in a comma-separated selection."""
    if not selection:
        return list(prompts)
    wanted = {s.strip() for s in selection.split(",") if s.strip()}
    known = {p.id for p in prompts} | {p.kind for p in prompts} | {p.unit for p in prompts}
    unknown = wanted - known
    if unknown:
        raise BenchError(f"unknown prompt id or kind: {sorted(unknown)[0][:80]}")
    return [p for p in prompts if p.id in wanted or p.kind in wanted or p.unit in wanted]


def pick_prompts(prompts: list[SuitePrompt], count: int | None) -> list[SuitePrompt]:
    """``count`` prompts spread over the kinds (round-robin in suite order); all when count is None."""
    if count is None or count >= len(prompts):
        return list(prompts)
    by_kind: dict[str, list[SuitePrompt]] = {}
    for p in prompts:
        by_kind.setdefault(p.kind, []).append(p)
    chosen: list[SuitePrompt] = []
    while len(chosen) < count:
        for kind in list(by_kind):
            if by_kind[kind] and len(chosen) < count:
                chosen.append(by_kind[kind].pop(0))
    order = {p.id: i for i, p in enumerate(prompts)}
    return sorted(chosen, key=lambda p: order[p.id])
