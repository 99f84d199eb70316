"""GPU check: time the embedded pair's shapes on this GPU, batched, and see how far the roofline is from it.

The roofline (``disco.costs.roofline``) predicts batched pass costs on GPUs we cannot reach from the app's machine.
This script is what to run the day a GPU is at hand, with no network and no model files: it builds the target
(Qwen2.5-Coder-1.5B-Instruct) and the assistant (0.5B) as ``Qwen2ForCausalLM`` with random bf16 weights of the same
shapes (a pass's cost does not depend on the weights' values), and times one forward pass of B rows x (k+1) tokens on
a static KV cache holding C tokens, eager and replayed from a CUDA graph, for B in 1..64, k+1 in 1..16, C in 256 and
2048. It writes the timings as a batched profile CSV (``role,precision,kind,tokens,ms,batch,context,layout``, the
format ``disco.costs.batched.BatchGrid`` reads), prints the roofline's median and worst error on them (datasheet
first, then fitted on part of the grid and tested on the rest), and the first batch size at which a batched greedy
pass's argmax differs from the batch-1 pass over the same row (batch invariance).

Notes: transformers' sdpa path repeats K/V over the query heads when a mask is given (every pass of k+1 > 1 tokens
here), so its attention reads more than the roofline's one-read-per-cache model; random weights give near-tied
logits, so batch invariance fails earlier here than with trained weights (a lower bound on B).

Usage: python scripts/gpu_check.py [--quick] [--out docs/results/gpu-check/profile.csv]
       python scripts/gpu_check.py --device cpu --quick --scale 8   (a tiny grid on the CPU: tests the script)
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["role", "precision", "kind", "tokens", "ms", "batch", "context", "layout"]
GRIDS = {"full": ((1, 2, 4, 8, 16, 32, 64), (1, 2, 4, 8, 16), (256, 2048)),
         "quick": ((1, 8, 64), (1, 4, 16), (256, 2048)),
         "cpu": ((1, 2), (1, 2), (16, 48))}
DEVICE_IDS = (("H200", "h200"), ("H100", "h100"), ("A100", "a100"), ("L4", "l4"), ("4090", "rtx4090"))
# the presets of disco.costs.roofline, used if the disco package cannot be imported on the GPU machine
PRESETS = {"target": (28, 1536, 8960, 12, 2, 128, 151936), "assistant": (24, 896, 4864, 14, 2, 64, 151936)}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "docs/results/gpu-check/profile.csv"), help="profile CSV to write")
    ap.add_argument("--quick", action="store_true", help="a smaller grid (B 1,8,64; k+1 1,4,16)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (a tiny grid that tests the script)")
    ap.add_argument("--scale", type=int, default=1, help="divide layers, widths and vocabulary by this (tests)")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for the grid before it stops early")
    ap.add_argument("--reps", type=int, default=0, help="timed passes per cell (default 10 on a GPU, 2 on a CPU)")
    ap.add_argument("--roofline-device", default="", help="devices.json id to compare with (default: from the GPU)")
    return ap.parse_args(argv)


def shapes(scale: int) -> dict[str, tuple]:
    try:
        sys.path.insert(0, str(ROOT))
        from disco.costs.roofline import ASSISTANT_SHAPE, TARGET_SHAPE
        base = {r: (s.layers, s.hidden, s.intermediate, s.heads, s.kv_heads, s.head_dim, s.vocab)
                for r, s in (("target", TARGET_SHAPE), ("assistant", ASSISTANT_SHAPE))}
    except Exception:  # noqa: BLE001 - the GPU machine may lack the app's other dependencies
        base = PRESETS
    out = {}
    for role, (layers, hidden, inter, heads, kv, head_dim, vocab) in base.items():
        if scale > 1:
            heads = max(kv, heads // scale // kv * kv)
            layers, hidden, inter, vocab = max(1, layers // scale), heads * head_dim, inter // scale, vocab // scale
        out[role] = (layers, hidden, inter, heads, kv, head_dim, vocab)
    return out


def build(shape, device, dtype):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    layers, hidden, inter, heads, kv, head_dim, vocab = shape
    config = Qwen2Config(num_hidden_layers=layers, hidden_size=hidden, intermediate_size=inter,
                         num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, vocab_size=vocab,
                         tie_word_embeddings=True, max_position_embeddings=32768)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return model.to(device=device, dtype=dtype).eval()


def static_cache(config, max_len, batch, device, dtype):
    from transformers import StaticCache

    try:
        return StaticCache(config=config, max_cache_len=max_len)
    except TypeError:  # older transformers
        return StaticCache(config=config, max_batch_size=batch, max_cache_len=max_len, device=device, dtype=dtype)


class Pass:
    """One static-shape forward: ``batch`` rows of ``tokens`` on ``context`` cached tokens (a static cache of exactly
    context + tokens, so attention reads what the pass would read); calling it again rewrites the same positions."""

    def __init__(self, model, batch, tokens, context, device):
        import inspect

        import torch

        self.model, self.context = model, context
        self.cache = static_cache(model.config, context + tokens, batch, device, model.dtype)
        self.ids = torch.randint(model.config.vocab_size, (batch, tokens), device=device)
        pos = torch.arange(context, context + tokens, device=device)
        self.positions = pos.unsqueeze(0).expand(batch, -1).contiguous()
        allowed = torch.arange(context + tokens, device=device)[None, :] <= pos[:, None]
        self.mask = {"full_attention": allowed[None, None].expand(batch, 1, tokens, context + tokens).contiguous()}
        params = inspect.signature(model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.extra = {"cache_position": pos} if "cache_position" in params else {}

    def __call__(self):
        for layer in getattr(self.cache, "layers", []):
            if hasattr(layer, "cumulative_length"):
                layer.cumulative_length.fill_(self.context)
        out = self.model(input_ids=self.ids, position_ids=self.positions, attention_mask=self.mask, use_cache=True,
                         **{self.cache_kw: self.cache}, **self.extra)
        return out.logits


def timed(fn, reps, cuda) -> float:
    """Median ms of ``reps`` calls, each synced (the engine reads the argmax after every pass)."""
    import torch

    times = []
    for _ in range(reps + 1):
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times[1:])


def capture(fn):
    """``fn`` captured in a CUDA graph (after warm-up passes on a side stream); returns its replay."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph


def run_grid(models, grid, device, reps, deadline) -> tuple[dict[str, list[dict]], bool]:
    """Eager and graph timings of every cell (small passes first, so an early stop keeps the cheap ones)."""
    import torch

    cuda = device.startswith("cuda")
    rows = {"eager": [], "graph": []}
    graphs_ok, stopped = cuda, False
    batches, tokens, contexts = grid
    for b in batches:
        for k in tokens:
            for c in contexts:
                for role, model in models.items():
                    if time.monotonic() > deadline:
                        stopped = True
                        break
                    cell = {"role": role, "precision": "bf16", "kind": "step", "tokens": k, "batch": b,
                            "context": c, "layout": "padded"}
                    try:
                        with torch.inference_mode():
                            p = Pass(model, b, k, c, device)
                            rows["eager"].append({**cell, "ms": round(timed(p, reps, cuda), 4)})
                            if graphs_ok:
                                try:
                                    graph = capture(p)
                                    rows["graph"].append({**cell, "ms": round(timed(graph.replay, reps, cuda), 4)})
                                    del graph
                                except Exception as exc:  # noqa: BLE001 - the graph path is optional
                                    graphs_ok = False
                                    print(f"CUDA graph path failed ({type(exc).__name__}: "
                                          f"{str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ''}); "
                                          "eager only from here", flush=True)
                            del p
                    except torch.cuda.OutOfMemoryError:
                        print(f"out of memory at {role} B={b} k+1={k} C={c}; skipped", flush=True)
                    if cuda:
                        torch.cuda.empty_cache()
    if stopped:
        print(f"time guard: the grid stopped early after {len(rows['eager'])} cells (raise --budget or use --quick)")
    if not rows["graph"]:
        rows.pop("graph")
    return rows, stopped


def batch_invariance(model, batches, device, length=32) -> dict:
    """The first batch size whose greedy (argmax) rows differ from batch-1 passes over the same rows."""
    import torch

    top = max(batches)
    torch.manual_seed(1)
    ids = torch.randint(model.config.vocab_size, (top, length), device=device)
    with torch.inference_mode():
        ref = [model(input_ids=ids[i:i + 1], use_cache=False).logits.argmax(-1)[0] for i in range(top)]
        for b in batches:
            out = model(input_ids=ids[:b], use_cache=False).logits.argmax(-1)
            differ = sum(1 for i in range(b) if not torch.equal(out[i], ref[i]))
            if differ:
                return {"first_batch": b, "rows_differing": differ, "rows": b, "length": length}
    return {"first_batch": None, "up_to": top, "length": length}


def roofline_report(rows, device_id, shape_of) -> dict:
    """The roofline's errors on the timings: datasheet (uncalibrated) first, then fitted on part, tested on the rest."""
    try:
        sys.path.insert(0, str(ROOT))
        from disco.costs import roofline, roofline_fit
        from disco.errors import UserError
    except Exception as exc:  # noqa: BLE001
        print(f"roofline comparison skipped: disco could not be imported ({type(exc).__name__}: {exc})")
        return {}
    shape = {r: roofline.ModelShape(*s, tied_embeddings=True) for r, s in shape_of.items()}
    report = {}
    for kind, points in rows.items():
        graphs = kind == "graph"
        costs = roofline.RooflineCosts(device_id, "bf16", graphs, None, shape["target"], shape["assistant"])
        errs = roofline_fit.prediction_errors(costs, points)
        print(f"roofline vs {kind} passes, {costs.label}: median {errs['median_abs_pct']:.1f}% "
              f"worst {errs['worst_abs_pct']:.1f}% over {errs['n']} passes")
        report[kind] = {"datasheet": errs, "held_out": {}}
        for split in roofline_fit.SPLITS:
            try:
                held = roofline_fit.held_out_report(points, split, shape["target"], shape["assistant"], device_id,
                                                fmt="bf16", graphs=graphs)
            except UserError as exc:
                print(f"  fitted ({split}): skipped ({exc})")
                continue
            factors = ", ".join(f"{k} {v:.3g}" for k, v in held["factors"].items())
            print(f"  fitted on {len(held['train'])}, tested on {len(held['test'])} ({split}): median "
                  f"{held['median_abs_pct']:.1f}% worst {held['worst_abs_pct']:.1f}% [{factors}]")
            report[kind]["held_out"][split] = {k: held[k] for k in ("factors", "median_abs_pct", "worst_abs_pct", "n")}
    return report


def write_csv(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def main(argv=None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    import torch

    device = args.device
    cuda = device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print("no CUDA device here: use --device cpu --quick to test the script on a CPU", file=sys.stderr)
        return 2
    grid = GRIDS["cpu" if not cuda else "quick" if args.quick else "full"]
    name = torch.cuda.get_device_name() if cuda else "CPU"
    device_id = args.roofline_device or ("this" if not cuda else
                                         next((i for key, i in DEVICE_IDS if key in name), ""))
    print(f"{name}: torch {torch.__version__}, grid B {grid[0]}, k+1 {grid[1]}, contexts {grid[2]}", flush=True)
    shape_of = shapes(max(1, args.scale))
    models = {role: build(shape, device, torch.bfloat16) for role, shape in shape_of.items()}
    reps = args.reps or (10 if cuda else 2)
    rows, stopped = run_grid(models, grid, device, reps, began + args.budget)
    out = Path(args.out)
    primary = "graph" if "graph" in rows else "eager"
    write_csv(rows[primary], out)
    if primary == "graph":
        write_csv(rows["eager"], out.with_name(out.stem + "-eager" + out.suffix))
    print(f"wrote {out} ({primary} timings, {len(rows[primary])} passes)", flush=True)
    report = roofline_report(rows, device_id, shape_of) if device_id else {}
    if not device_id:
        print(f"roofline comparison skipped: no devices.json entry for {name!r} (name one with --roofline-device)")
    invariance = batch_invariance(models["target"], grid[0], device)
    first = invariance["first_batch"]
    print("batch invariance (bf16, target, random weights): " +
          (f"argmax rows first differ from batch-1 passes at B={first} "
           f"({invariance['rows_differing']} of {first} rows)" if first else
           f"no difference up to B={invariance['up_to']}"))
    summary = {"device": name, "roofline_device": device_id, "torch": torch.__version__, "grid": grid,
               "timings": primary, "stopped_early": stopped, "roofline": report, "batch_invariance": invariance,
               "seconds": round(time.monotonic() - began, 1)}
    out.with_name(out.stem + "-summary.json").write_text(json.dumps(summary, indent=1))
    print(f"done in {summary['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
