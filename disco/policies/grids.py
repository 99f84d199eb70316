"""The grids of settings the benchmark, the Sweep tab and the machine profile replay, built from policy metadata.

A grid is a list of ``Policy`` objects (never spec strings to parse back): the classic kinds from explicit values
(static K, τ × KMAX, the heuristic's start, the oracle), then each stopping rule over its own parameters' grid
(``Param.grid``), with KMAX taken from the grid's KMAX values where the rule has one. A policy object is reused
across prompts: every run binds it afresh (``Policy.bind`` resets its state).
"""

from __future__ import annotations

from typing import Iterable

from disco.policies.base import Policy, canonical_spec, policy_class, policy_kinds
from disco.policies.classic import KMAXES, STATIC_KS, TAUS, Autoregressive, Heuristic, Oracle, Static, Threshold

CLASSIC_KINDS = ("autoregressive", "static", "heuristic", "threshold", "oracle")
COARSE_TAUS = tuple(round(0.1 * i, 1) for i in range(1, 10))  # 0.1 .. 0.9: the Sweep's and the profile's default


def rule_kinds() -> list[str]:
    """The stopping rules beyond the classic grid (adaptive, entropy, cumulative, costaware, disco, ...), in
    registration order; ``disco`` only once a trained classifier exists."""
    return [cls.kind for cls in policy_kinds()
            if cls.kind not in CLASSIC_KINDS and cls.in_default_grid and cls.unavailable() is None]


def kind_grid(kind: str, kmaxes: Iterable[int] | None = None) -> list[Policy]:
    """A kind's grid from its parameters' metadata; its KMAX values replaced by ``kmaxes`` when given."""
    cls = policy_class(kind)
    if cls.composite:  # its own grid of parts (``Hybrid.grid``)
        return cls.grid()
    combos = [{}]
    for p in cls.params:
        values = tuple(kmaxes) if (kmaxes is not None and p.slider == "kmax") else (p.grid or (p.default,))
        combos = [{**c, p.name: v} for v in values for c in combos]  # the first parameter varies fastest
    return [cls(**c) for c in combos]


def default_grid(static_ks: Iterable[int] = STATIC_KS, taus: Iterable[float] = TAUS, kmaxes: Iterable[int] = KMAXES,
                 heuristic: Iterable[int] = (5,), oracle: bool = True, kinds: Iterable[str] | None = None) -> list[Policy]:
    """The benchmark's default grid (autoregressive first): the classic kinds from the given values, then each
    stopping rule in ``kinds`` (default: every one available, ``rule_kinds``) from its own parameters' grid."""
    kmaxes = list(kmaxes)
    grid: list[Policy] = [Autoregressive()]
    grid += [Static(k=k) for k in static_ks]
    grid += [Heuristic(k=k) for k in heuristic]
    grid += [Threshold(tau=t, k=k) for k in kmaxes for t in taus]
    if oracle:
        grid.append(Oracle(k=max(kmaxes) if kmaxes else Oracle.params[0].default))
    for kind in (rule_kinds() if kinds is None else kinds):
        grid += kind_grid(kind, kmaxes or None)
    return unique(grid)


def unique(policies: Iterable[Policy]) -> list[Policy]:
    """The policies with duplicate specs dropped (the first kept), in order."""
    seen: dict[str, Policy] = {}
    for p in policies:
        seen.setdefault(p.spec, p)
    return list(seen.values())


def with_baseline(policies: Iterable[Policy]) -> list[Policy]:
    """``policies`` with the autoregressive baseline first (added when missing): every speed-up needs it."""
    policies = unique(policies)
    if not any(p.kind == Autoregressive.kind for p in policies):
        policies.insert(0, Autoregressive())
    return policies


def deepest_draft(policies: Iterable[Policy]) -> int:
    """The longest draft any of ``policies`` can send (its ``k``: a hybrid's covers both its parts), at least 1: how
    far the per-pass costs must be measured."""
    return max([getattr(p, "k", None) or p.values.get("k", 1) for p in policies] + [1])


def threshold_spec(tau: float, kmax: int) -> str:
    return canonical_spec("threshold", tau=tau, k=kmax)
