"""Each iteration of a live batched llama.cpp run beside the batched replay's prediction for it: where a live check's
miss comes from (``disco.bench.batch_live`` compares whole runs). Loads the embedded pair on llama.cpp.

    python scripts/live_iterations.py PROFILE.csv B SPEC[;SPEC...] [--reps 3] [--tokens 32]

PROFILE.csv is a ``profile --batch`` CSV (the prediction's prices, layout ``streams``); the prompts are the live
check's (``code-binary-search,explain-gil,summ-email,prose-advice``), the first B of them.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from disco.bench import machine_profile  # noqa: E402
from disco.costs.batched import grid_from_rows  # noqa: E402
from disco.decode.batch_decoder import BatchDecoder  # noqa: E402
from disco.models.load import load_resolved  # noqa: E402
from disco.replay.batched import Request, simulate  # noqa: E402
from disco.replay.layouts import Pricer  # noqa: E402
from disco.replay.tables import build_table  # noqa: E402
from disco.tables.phase import TablePhase  # noqa: E402

PROMPTS = ("code-binary-search", "explain-gil", "summ-email", "prose-advice")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("batch", type=int)
    ap.add_argument("specs")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    grid = grid_from_rows(list(csv.DictReader(args.profile.open())), str(args.profile), layout="streams")
    pair = load_resolved("embedded", log=lambda _m: None, engine="llamacpp")
    phase = TablePhase.here(pair, args.tokens, None)
    ids = [phase.ids(p) for p in machine_profile.suite_prompts(PROMPTS)][: args.batch]
    tables = [build_table(pair, p, args.tokens, None, name=f"live-{i}") for i, p in enumerate(ids)]
    print(f"prompt tokens {[len(i) for i in ids]}; live: median of {args.reps}; predicted from {args.profile}")
    for spec in args.specs.split(";"):
        logs = []
        for _ in range(args.reps):
            decoder = BatchDecoder(pair, ids, spec, args.tokens, "streams")
            try:
                decoder.run()
            finally:
                decoder.close()
            logs.append(decoder.log)
        predicted = simulate(spec, [Request(i, t) for i, t in enumerate(tables)], args.batch,
                             Pricer(grid, "llama-split"), args.tokens).iterations
        print(f"\n{spec}\n| iteration | rows | draft passes | live draft ms | predicted | live verify ms | predicted |")
        print("|---|---|---|---|---|---|---|")
        total_live = total_pred = 0.0
        for j, it in enumerate(predicted):
            if any(len(log) <= j for log in logs):
                break
            draft = statistics.median(log[j].draft_ms for log in logs)
            verify = statistics.median(log[j].verify_ms for log in logs)
            total_live, total_pred = total_live + draft + verify, total_pred + it[3] + it[4]
            print(f"| {j + 1} | {logs[0][j].rows} | {logs[0][j].draft_passes} | {draft:.0f} | {it[3]:.0f} | "
                  f"{verify:.0f} | {it[4]:.0f} |")
        print(f"whole run: live {total_live:.0f} ms, predicted {total_pred:.0f} ms "
              f"({100 * (total_pred - total_live) / total_live:+.1f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
