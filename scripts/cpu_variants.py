#!/usr/bin/env python3
"""Which of ggml's x86 CPU-backend variants a llama.cpp build holds (issue 35; stdlib only: runs before the venv has
anything in it).

ggml builds its CPU backend once per instruction-set level when asked for all of them (``GGML_CPU_ALL_VARIANTS``:
14 modules on x86-64, most of the ~8-minute build). An image or a Space needs all of them (it may start on any CPU);
a start on this machine needs only the one this CPU runs best, plus ``x64`` (plain x86-64, runs anywhere) so that a
venv moved to another CPU still starts. This script reads the variant list from the vendored
``ggml/src/CMakeLists.txt`` itself (never a copy of it), picks this CPU's best the way ggml's loader scores them
(``ggml/src/ggml-cpu/arch/x86/cpu-feats.cpp``: a variant whose features this CPU lacks scores 0, otherwise each
feature adds its weight), and patches the list down to the chosen ones.

    cpu_variants.py table CMAKELISTS                 # "name FEATURE ..." per x86 variant (kept beside the wheel)
    cpu_variants.py best TABLE [--cpuinfo FILE]      # this CPU's best variant (AMX's ``sapphirerapids`` only by name)
    cpu_variants.py patch CMAKELISTS NAME[,NAME...]  # keep only these x86 variants in the build
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

# ggml's feature name -> the /proc/cpuinfo flags it needs (cpu-feats.cpp checks AVX512F, CD, VL, DQ and BW for AVX512)
FLAGS = {
    "SSE42": ["sse4_2"], "AVX": ["avx"], "F16C": ["f16c"], "FMA": ["fma"], "AVX2": ["avx2"], "BMI2": ["bmi2"],
    "AVX_VNNI": ["avx_vnni"], "AVX512": ["avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"],
    "AVX512_VBMI": ["avx512vbmi"], "AVX512_VNNI": ["avx512_vnni"], "AVX512_BF16": ["avx512_bf16"],
    "AMX_TILE": ["amx_tile"], "AMX_INT8": ["amx_int8"],
}
# cpu-feats.cpp's weights (features it does not score, e.g. AMX_TILE, add nothing)
WEIGHTS = {"FMA": 1, "F16C": 2, "SSE42": 4, "BMI2": 8, "AVX": 16, "AVX2": 32, "AVX_VNNI": 64, "AVX512": 128,
           "AVX512_VBMI": 256, "AVX512_BF16": 512, "AVX512_VNNI": 1024, "AMX_INT8": 2048}
OPT_IN = {"sapphirerapids"}  # as disco/models/cpu_variant.py: built, chosen only when named
PORTABLE = "x64"
_CALL = re.compile(r"^(?P<indent>\s*)ggml_add_cpu_backend_variant\((?P<name>[\w.]+)(?P<feats>[^)]*)\)")


def _x86_block(lines: list[str]) -> range:
    """The line numbers of the x86 branch of the ``GGML_CPU_ALL_VARIANTS`` list."""
    start = next((i for i, line in enumerate(lines) if 'GGML_SYSTEM_ARCH STREQUAL "x86"' in line
                  and any("ggml_add_cpu_backend_variant(x64" in later for later in lines[i:i + 4])), None)
    if start is None:
        raise SystemExit("cpu_variants: no x86 variant list in this CMakeLists.txt (ggml changed its layout)")
    indent = len(lines[start]) - len(lines[start].lstrip())  # the branch ends at its own elseif / else / endif
    end = next(i for i in range(start + 1, len(lines)) if re.match(r"\s*(elseif|else|endif)\b", lines[i])
               and len(lines[i]) - len(lines[i].lstrip()) <= indent)
    return range(start + 1, end)


def table(cmakelists: str) -> list[tuple[str, list[str]]]:
    lines = Path(cmakelists).read_text().splitlines()
    return [(m["name"], m["feats"].split()) for i in _x86_block(lines) if (m := _CALL.match(lines[i]))]


def read_table(path: str) -> list[tuple[str, list[str]]]:
    return [(parts[0], parts[1:]) for line in Path(path).read_text().splitlines() if (parts := line.split())]


def score(features: list[str], flags: set[str]) -> int:
    if not all(flag in flags for feat in features for flag in FLAGS.get(feat, [f"?{feat}"])):
        return 0
    return 1 + sum(WEIGHTS.get(feat, 0) for feat in features)


def best(variants: list[tuple[str, list[str]]], flags: set[str]) -> str:
    scored = [(score(feats, flags), name) for name, feats in variants if name not in OPT_IN]
    top = max(scored, default=(0, ""))
    if top[0] == 0:
        raise SystemExit("cpu_variants: none of ggml's x86 variants runs on this CPU")
    return top[1]


def cpu_flags(cpuinfo: str) -> set[str]:
    for line in Path(cpuinfo).read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def patch(cmakelists: str, keep: list[str]) -> None:
    path = Path(cmakelists)
    lines = path.read_text().splitlines(keepends=True)
    block = _x86_block([line.rstrip("\n") for line in lines])
    names = {m["name"] for i in block if (m := _CALL.match(lines[i]))}
    missing = [name for name in keep if name not in names]
    if missing:
        raise SystemExit(f"cpu_variants: no variant {', '.join(missing)} in this llama.cpp ({', '.join(sorted(names))})")
    for i in block:
        m = _CALL.match(lines[i])
        if m and m["name"] not in keep:
            lines[i] = f"{m['indent']}# (not built here: scripts/cpu_variants.py) {lines[i].lstrip()}"
    path.write_text("".join(lines))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("table").add_argument("cmakelists")
    b = sub.add_parser("best")
    b.add_argument("table")
    b.add_argument("--cpuinfo", default="/proc/cpuinfo")
    p = sub.add_parser("patch")
    p.add_argument("cmakelists")
    p.add_argument("names")
    args = ap.parse_args(argv)
    if args.cmd == "table":
        print("\n".join(" ".join([name, *feats]) for name, feats in table(args.cmakelists)))
    elif args.cmd == "best":
        print(best(read_table(args.table), cpu_flags(args.cpuinfo)))
    else:
        patch(args.cmakelists, [n for n in args.names.split(",") if n])


if __name__ == "__main__":
    sys.exit(main())
