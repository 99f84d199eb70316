"""The batched replay checked live (``profile --batch ... --live 2,4``): B suite requests decoded in one llama.cpp batch
(``disco.decode.batch_decoder``), beside what the batched replay predicts for the same schedule.

For each B and setting: the live run is repeated ``reps`` times (wall time of its passes per run, their spread, and
each batch iteration's drafting + verification ms); its outputs are compared with batch-1 greedy outputs (the
prompts' replay tables, ``disco.replay.tables.build_table``); the prediction is the batched replay
(``disco.replay.batched.simulate``) of the same requests through B slots with no refill, priced by the batched profile
measured *before* the live runs (a ``BatchGrid``; never the live run's own records), in the layout that matches
llama.cpp's: ``llama-split`` for one KV stream per sequence, ``ragged`` for the unified buffer."""

from __future__ import annotations

import statistics

from disco.costs.batched import BatchCosts
from disco.decode.batch_decoder import BatchDecoder
from disco.replay.batched import Request, simulate
from disco.replay.layouts import Pricer
from disco.replay.tables import build_table

SETTINGS = ("autoregressive", "static:4", "threshold:0.4:20")
REPLAY_LAYOUT = {"streams": "llama-split", "unified": "ragged"}


def _pct(pred: float, live: float) -> float:
    return 100.0 * (pred - live) / live if live else float("nan")


def check(pair, prompts: list[list[int]], costs: BatchCosts, batch: int, layout: str = "streams",
          settings=SETTINGS, max_new_tokens: int = 32, reps: int = 3, cache_dir=None) -> list[dict]:
    """One row per setting: live wall time (median, min, max over reps), predicted, errors, outputs equal?"""
    ids = prompts[:batch]
    tables = [build_table(pair, p, max_new_tokens, cache_dir, name=f"live-{i}") for i, p in enumerate(ids)]
    rows = []
    for spec in settings:
        walls, per_iter, outputs = [], [], None
        for _ in range(reps):
            decoder = BatchDecoder(pair, ids, spec, max_new_tokens, layout)
            try:
                outputs = decoder.run()
            finally:
                decoder.close()
            walls.append(sum(it.draft_ms + it.verify_ms for it in decoder.log))
            per_iter.append([it.draft_ms + it.verify_ms for it in decoder.log])
        stream = [Request(i, t) for i, t in enumerate(tables)]
        log = simulate(spec, stream, batch, Pricer(costs, REPLAY_LAYOUT[layout]), max_new_tokens)
        predicted = [it[3] + it[4] for it in log.iterations]
        live_iters = [statistics.median(x) for x in zip(*per_iter)] if len({len(p) for p in per_iter}) == 1 else []
        iter_err = ([abs(_pct(p, q)) for p, q in zip(predicted, live_iters)]
                    if len(live_iters) == len(predicted) else [])
        references = [t.reference_for(max_new_tokens) for t in tables]
        same = all(out == ref[: len(out)] and len(out) == len(log.output[i]) for i, (out, ref) in
                   enumerate(zip(outputs, references)))
        wall = statistics.median(walls)
        rows.append({"batch": batch, "layout": layout, "strategy": spec, "reps": reps, "live_ms_median": wall,
                     "live_ms_min": min(walls), "live_ms_max": max(walls), "predicted_ms": sum(predicted),
                     "error_pct": _pct(sum(predicted), wall), "iterations_live": len(live_iters) or len(per_iter[0]),
                     "iterations_predicted": len(predicted),
                     "iteration_error_pct_median": statistics.median(iter_err) if iter_err else float("nan"),
                     "iteration_error_pct_p90": sorted(iter_err)[int(0.9 * (len(iter_err) - 1))] if iter_err
                     else float("nan"),
                     "outputs_equal_batch1": same})
    return rows
