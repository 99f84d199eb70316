"""What exact kernels cost on this machine, and how far a target pass is from its memory floor.

Exact mode (``disco.models.llama``) turns off llama.cpp's batch-dependent kernels (repacked weights, flash attention,
the tiled K-quant matmul) so that a verified row is the row a one-token pass computes; that is what keeps greedy
lanes identical to the target alone, and it has a price that depends on the CPU. It is measured here with llama.cpp's
own ``llama-bench`` (built by ``scripts/llama-build.sh`` from the same vendored tree, linked to the same libraries), the
same passes both ways: a pass over n = 1, 2, 4, 8, 16 tokens on top of a 40-token cache (verifying n - 1 drafts), a
48-token prefill and plain decoding, with exact kernels (``--repack 0 -fa off``, ``GGML_CPU_TILED_MM=0``) and with
llama.cpp's defaults.

The floor: a target pass reads every weight once, so (the GGUF's tensor bytes, read with ``gguf``) ÷ (this machine's
memory bandwidth: numpy's integer sums over a 512 MiB array, on one thread and on every core, the best of three) is
the least a pass can take; on a busy machine the bandwidth reads low and the floor high. A
one-token pass far above its floor is compute-bound here, and then verifying k tokens costs about k passes (what
decides whether speculation pays).

Cached per machine and target file (``cache.machine_dir()``); ``profile --kernels`` measures it (about a minute) and
the This machine tab shows it.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import logging
import os
import subprocess
import threading
import time
from pathlib import Path

import numpy as np

from disco import cache
from disco.bench.llama_peer import binary
from disco.decode.live import Decoder
from disco.decode.settings import DecodeSettings
from disco.errors import UserError
from disco.machine import cpu_info
from disco.models import llama, numerics
from disco.policies import Autoregressive

log = logging.getLogger(__name__)

SIZES = (1, 2, 4, 8, 16)
DEPTH = 40
PREFILL = 48
GEN = 32
KERNELS = {  # llama-bench flags and environment of each kernel set
    "exact": (["--repack", "0", "-fa", "off"], {"GGML_CPU_TILED_MM": "0"}),
    "default": (["--repack", "1", "-fa", "auto"], {}),
}
BANDWIDTH_MIB = 512
FORMAT = 3  # 3: records name the CPU variant that ran (cpu_variant)


class KernelPriceUnavailable(UserError, RuntimeError):
    """llama-bench is not built here, or it failed (one line)."""


def _run(cmd: list[str], env: dict, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def _bench(model: Path, args: list[str], env: dict, timeout: int = 600, variant: str | None = None) -> list[dict]:
    exe = binary("llama-bench")
    if exe is None:
        raise KernelPriceUnavailable("llama-bench is not built here (scripts/llama-build.sh programs builds it, "
                                     "about 3 minutes; ./run.sh does not)")
    cmd = [str(exe), "-m", str(model), "-t", str(llama.threads()), "-o", "csv", *args]
    # the CPU variant this process runs (a build with several), so llama-bench prices the same kernels; or the
    # variant module named by ``variant``
    full_env = llama.child_env({k: v for k, v in os.environ.items() if k != "GGML_CPU_TILED_MM"} | env)
    full_env |= {"GGML_BACKEND_PATH": variant} if variant else {}
    proc = _run(cmd, full_env, timeout)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or ["(no output)"]
        raise KernelPriceUnavailable(f"llama-bench failed ({proc.returncode}): {tail[0][:200]}")
    return list(csv.DictReader(io.StringIO(proc.stdout)))


def _ms(row: dict) -> float:
    return int(row["avg_ns"]) / 1e6


def measure_kernels(model: Path, reps: int = 3, chunk=None, say=None, variant: str | None = None) -> dict:
    """Pass costs and decode speed with each kernel set (module doc). ``chunk()`` returns the context manager held
    around each llama-bench call (the app's turn lock); ``say`` gets progress lines; ``variant``: the path of a CPU
    variant module to price instead of the one this process runs."""
    chunk = chunk or contextlib.nullcontext
    out: dict = {"passes_ms": {}, "prefill_ms_per_token": {}, "decode_tokens_per_s": {}}
    for name, (flags, env) in KERNELS.items():
        (say or (lambda _m: None))(f"llama.cpp {name} kernels: passes over {', '.join(map(str, SIZES))} tokens ...")
        out["passes_ms"][name] = {}
        for n in SIZES:  # one call a size: the app's turn lock is held for a few seconds at most
            with chunk():
                rows = _bench(model, ["-p", str(n), "-n", "0", "-d", str(DEPTH), "-r", str(reps), *flags], env, variant=variant)
            out["passes_ms"][name][n] = _ms(rows[0])
        with chunk():
            rows = _bench(model, ["-p", "0", "-n", str(GEN), "-d", str(DEPTH), "-r", str(reps), *flags], env, variant=variant)
        out["decode_tokens_per_s"][name] = float(rows[0]["avg_ts"])
        with chunk():
            rows = _bench(model, ["-p", str(PREFILL), "-n", "0", "-r", str(reps), *flags], env, variant=variant)
        out["prefill_ms_per_token"][name] = _ms(rows[0]) / PREFILL
        out["model_size"] = int(rows[0].get("model_size") or 0)
    return out


def bandwidth_gbs(mib: int = BANDWIDTH_MIB, threads: int | None = None, reps: int = 3) -> float:
    """Memory read bandwidth in GB/s: the best of ``reps`` sums of a ``mib`` MiB int64 array split over ``threads``
    threads (numpy releases the GIL in its reductions). Measured on this EPYC: 32 GB/s on one thread and 61 on two
    (float64 sums: 30 and 55; the same sums with both cores busy compiling: 15 and 30)."""
    threads = max(1, threads or os.cpu_count() or 1)
    data = np.ones(mib * (1 << 20) // 8, dtype=np.int64)  # integer adds: the sum waits on memory, not on its adder
    parts = np.array_split(data, threads)
    data.sum()  # touch every page once before timing
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        workers = [threading.Thread(target=part.sum) for part in parts]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - start)
    return data.nbytes / best / 1e9


def weight_bytes(path: Path) -> int:
    """Bytes of every tensor in a GGUF file (what one pass reads), from its header (``gguf``)."""
    from gguf import GGUFReader

    return int(sum(int(t.n_bytes) for t in GGUFReader(str(path), "r").tensors))


def ours_tokens_per_s(pair, reps: int = 3, chunk=None) -> float:
    """Our own target alone (the autoregressive lane through the engine, its per-token work included) decoding GEN
    tokens after a ~40-token prompt: the best of ``reps`` runs, decode only (the prefill iteration left out)."""
    prompt = numerics.context_ids(pair)[:DEPTH]
    best = 0.0
    for _ in range(reps):
        with (chunk or contextlib.nullcontext)():
            d = Decoder(pair, prompt, Autoregressive(), DecodeSettings(max_new_tokens=GEN + 1))
            d.step()  # the prefill and the first token
            start = time.perf_counter()
            d.run()
            best = max(best, (len(d.output_ids) - 1) / (time.perf_counter() - start))
    return best


def measure(model: Path, reps: int = 3, chunk=None, say=None, pair=None) -> dict:
    """The whole record: both kernel sets, the bandwidth on one thread and on every core, the bytes per pass and the
    floor they imply; with ``pair`` (loaded on the llama.cpp engine with exact kernels), our own target alone beside
    llama-bench's."""
    start = time.perf_counter()
    data = measure_kernels(model, reps, chunk, say)
    if pair is not None and pair.describe().get("exact"):  # compared with llama-bench on the same, exact, kernels
        data["ours_tokens_per_s"] = ours_tokens_per_s(pair, reps, chunk)
    with (chunk or contextlib.nullcontext)():
        data["bandwidth_gbs"] = {"1": bandwidth_gbs(threads=1), "all": bandwidth_gbs()}
    data["weight_bytes"] = weight_bytes(model)
    data["floor_ms"] = data["weight_bytes"] / (data["bandwidth_gbs"]["all"] * 1e9) * 1000
    data.update(format=FORMAT, model=str(model), machine=" ".join(cpu_info()["flags"]), cpu=cpu_info()["cpu"],
                threads=llama.threads(), llama_cpp=llama.version(), cpu_variant=llama.kernels(),
                seconds=time.perf_counter() - start,
                measured_at=time.strftime("%Y-%m-%d %H:%M:%S"))
    return data


def measure_variants(model: Path, reps: int = 3, say=None) -> dict[str, dict]:
    """Every CPU variant built here that this CPU runs, priced as ``measure_kernels`` prices this process's own
    (``profile --kernels --variants``; about 40 s a variant, not cached). Empty for a build without variants."""
    say = say or (lambda _m: None)
    out: dict[str, dict] = {}
    for v in llama.runnable_variants():
        try:
            out[v.name] = measure_kernels(model, reps, say=lambda m, name=v.name: say(f"{name}: {m}"), variant=v.path)
        except KernelPriceUnavailable as exc:  # one variant failing (e.g. a crash in llama-bench) spoils no other
            log.warning("llama.cpp CPU variant %s could not be priced: %s", v.name, exc)
            out[v.name] = {"error": str(exc)}
    return out


def variants_markdown(by_variant: dict[str, dict], running: str | None) -> str:
    """One row per variant: the passes that decide speculation (1 and 4 tokens), prefill and plain decoding."""
    rows = ["| CPU variant | exact: 1 token, ms | 4 tokens (× 1) | defaults: 1 token, ms | 4 tokens (× 1) | "
            "prefill, ms a prompt token (exact / defaults) | plain decoding, tokens/s (exact / defaults) |",
            "|---|---|---|---|---|---|---|"]
    for name, d in by_variant.items():
        if "error" in d:
            rows.append(f"| {name} | not priced: {d['error']} | | | | | |")
            continue
        p, pf, dec = d["passes_ms"], d["prefill_ms_per_token"], d["decode_tokens_per_s"]
        cells = [f"{p[k][1]:.0f} | {p[k][4]:.0f} ({p[k][4] / p[k][1]:.2f}×)" for k in ("exact", "default")]
        rows.append(f"| {name}{' ◀' if name == running else ''} | {' | '.join(cells)} | {pf['exact']:.1f} / "
                    f"{pf['default']:.1f} | {dec['exact']:.1f} / {dec['default']:.1f} |")
    return ("**llama.cpp's CPU variants on this machine** (`llama-bench`, passes on a 40-token cache; ◀ the one "
            "this process runs):\n\n" + "\n".join(rows))


def summary(data: dict) -> dict:
    """The derived figures every view shows: exact ÷ default per pass size, k-token ÷ one-token passes for each
    kernel set, the one-token pass ÷ its floor."""
    p = data["passes_ms"]
    ex, de = p.get("exact", {}), p.get("default", {})
    return {"exact_over_default": {n: ex[n] / de[n] for n in ex if n in de and de[n] > 0},
            "verify_over_one": {k: {n: v[n] / v[1] for n in v} for k, v in p.items() if v.get(1)},
            "one_over_floor": {k: v[1] / data["floor_ms"] for k, v in p.items() if v.get(1) and data.get("floor_ms")},
            "prefill_exact_over_default": (data["prefill_ms_per_token"].get("exact", float("nan"))
                                           / data["prefill_ms_per_token"].get("default", float("nan"))),
            # our target alone's time per token over llama-bench's, the same (exact) kernels
            "ours_over_llama_bench": (data["decode_tokens_per_s"].get("exact", float("nan"))
                                      / data.get("ours_tokens_per_s", float("nan")))}


def _path(model: Path, root=None) -> Path:
    stat = Path(model).stat()
    key = json.dumps([str(Path(model).resolve()), stat.st_size, int(stat.st_mtime), cpu_info()["flags"],
                      llama.threads(), llama.version(), llama.exact_mode(),
                      *([llama.kernels()] if llama.kernels() else [])])  # builds without variants keep their key
    folder = Path(root) if root is not None else cache.machine_dir()
    return folder / f"kernels-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def load_cached(model: Path, root=None) -> dict | None:
    path = _path(model, root)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        log.warning("unreadable kernel price %s: measuring again", path, exc_info=True)
        return None
    if data.get("format") != FORMAT:
        return None
    data["passes_ms"] = {k: {int(n): float(v) for n, v in d.items()} for k, d in data["passes_ms"].items()}
    return data


def markdown(data: dict) -> str:
    """The record as a table and two sentences (the This machine tab, ``profile --kernels``)."""
    s = summary(data)
    p = data["passes_ms"]
    head = ["| llama.cpp kernels | " + " | ".join(f"{n} token{'s' * (n > 1)}" for n in SIZES) +
            " | prefill (ms a prompt token) | plain decoding (tokens/s) |", "|---|" + "---|" * (len(SIZES) + 2)]
    rows = []
    for name, label in (("exact", "exact (DISCO Lab's default), ms"), ("default", "llama.cpp's defaults, ms")):
        v = p.get(name, {})
        cells = [f"{v[n]:.0f} ({v[n] / v[1]:.2f}×)" if n in v and v.get(1) else "—" for n in SIZES]
        rows.append(f"| {label} | " + " | ".join(cells) + f" | {data['prefill_ms_per_token'].get(name, float('nan')):.1f}"
                    f" | {data['decode_tokens_per_s'].get(name, float('nan')):.1f} |")
    ratio = s["exact_over_default"]
    rows.append("| exact ÷ defaults | " + " | ".join(f"{ratio[n]:.2f}" if n in ratio else "—" for n in SIZES) +
                f" | {s['prefill_exact_over_default']:.2f} | |")
    bw = data["bandwidth_gbs"]
    floor = (f"A target pass reads {data['weight_bytes'] / 2 ** 30:.2f} GiB of weights; this machine reads "
             f"{bw['1']:.1f} GB/s on one thread and {bw['all']:.1f} GB/s on all cores (numpy sums), so a pass takes "
             f"at least {data['floor_ms']:.0f} ms: the one-token pass is " +
             " and ".join(f"{v:.2f}× that with {'exact kernels' if k == 'exact' else 'the defaults'}"
                          for k, v in s["one_over_floor"].items()) + ".")
    bound = ("Verifying 4 tokens costs " + " and ".join(f"{v[4]:.2f}× a one-token pass ({k})"
                                                         for k, v in s["verify_over_one"].items() if 4 in v) +
             ": near 1× a pass is memory-bound and verification is almost free; near k× it is compute-bound and "
             "each verified token costs about a pass.")
    ours = s["ours_over_llama_bench"]
    if ours == ours:
        bound += (f" Our own target alone decodes {data['ours_tokens_per_s']:.1f} tokens/s: {ours:.2f}× llama-bench's "
                  "time per token with the same exact kernels.")
    variant = f", the {data['cpu_variant']} CPU variant of its kernels" if data.get("cpu_variant") else ""
    return ("**What exact kernels cost here** (`llama-bench`, passes on a 40-token cache, "
            f"{data['threads']} threads{variant}; measured {data['measured_at']}):\n\n" + "\n".join(head + rows) +
            f"\n\n{floor} {bound}")


def get(model: Path, refresh: bool = False, root=None, **kwargs) -> dict:
    """The cached record for this machine and target file, or a fresh measurement (then cached)."""
    if not refresh:
        cached = load_cached(model, root)
        if cached is not None:
            return cached
    data = measure(model, **kwargs)
    path = _path(model, root)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, default=str))
        tmp.replace(path)
    except OSError:
        log.warning("could not cache the kernel price in %s", path, exc_info=True)
    return data
