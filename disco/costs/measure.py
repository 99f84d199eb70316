"""Measured per-pass costs of a loaded pair (the ``measured`` cost profile), timed the way the engine runs the
models (``disco.models.timing``) and kept once per pair: in memory, and in the one cache
(``disco.cache.machine_dir()``) so the app, the Sweep and the commands measure a pair once."""

from __future__ import annotations

import time
from typing import Iterable

from disco import cache
from disco.costs.model import CostModel
from disco.models.pair import pair_key
from disco.models.timing import pass_costs, prefill_costs


def calibrate(pair, context_ids: list[int], prefill_lengths: Iterable[int] = (), verify_sizes: Iterable[int] | None = None,
              assistant_sizes: Iterable[int] = (1, 2, 3), reps: int = 3, kmax: int = 20) -> CostModel:
    """Measure per-pass costs on this machine, the way the engine calls the models.

    ``context_ids``: a realistic prompt (the cache length verification runs on top of). Each size is timed
    ``reps`` times (median kept); prefill sizes are timed on a fresh cache.
    """
    if verify_sizes is None:
        verify_sizes = sorted({1, 2, 3, 4, 5, 6, 7, 9, 11, 13, 17, kmax + 1})
    verify_sizes = list(verify_sizes)
    pair.warmup()
    ctx = list(context_ids) or [pair.eos_ids[0]]
    prefills = sorted(set(int(x) for x in prefill_lengths if int(x) > max(verify_sizes)))
    points = {}
    for role, sizes in (("target", verify_sizes), ("assistant", list(assistant_sizes))):
        new = lambda role=role: pair.session(role)  # noqa: E731
        points[role] = {**pass_costs(new, ctx, sizes, reps, warm=False), **prefill_costs(new, ctx, prefills, reps)}
    meta = dict(pair.describe())
    meta.update(context_tokens=len(ctx), reps=reps, threads=_threads(), measured_at=time.strftime("%Y-%m-%d %H:%M:%S"))
    return CostModel(sorted(points["target"].items()), sorted(points["assistant"].items()), meta)


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def suite_costs(pair, prompt_ids_list: list[list[int]], kmax: int, reps: int = 2) -> CostModel:
    """Calibrate on a suite: verification sizes 1..kmax+1 on a median-length prompt, prefills of a
    median and of the longest prompt (+ a full draft), the sizes iteration 1 feeds the target."""
    lengths = sorted(len(ids) for ids in prompt_ids_list)
    context = prompt_ids_list[[len(i) for i in prompt_ids_list].index(lengths[len(lengths) // 2])]
    prefill = {lengths[len(lengths) // 2], lengths[-1] + kmax + 1}
    return calibrate(pair, context, prefill_lengths=prefill, reps=reps, kmax=kmax)


_COSTS: dict[str, CostModel] = {}


def _costs_path(pair):
    return cache.machine_dir() / f"costs-{pair_key(pair, [0])}.json"


def known_costs(pair) -> CostModel | None:
    """This pair's measured costs if they were measured already (this session or an earlier one), else None;
    never measures."""
    key = pair_key(pair)
    if key not in _COSTS:
        data = cache.read_json(_costs_path(pair))
        try:
            _COSTS[key] = CostModel.from_dict(data)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
    return _COSTS[key]


def cached_costs(pair, prompt_ids_list: list[list[int]], kmax: int = 20, reps: int = 2, store: bool = True) -> CostModel:
    """Per-pass costs for the app and the commands: measured once per pair and kept (in memory, and with
    ``store`` in the cache)."""
    known = known_costs(pair)
    if known is not None:
        return known
    costs = suite_costs(pair, prompt_ids_list, max(kmax, 20), reps=reps)
    if store:
        cache.write_json(_costs_path(pair), costs.to_dict(), indent=None)
    _COSTS[pair_key(pair)] = costs
    return costs
