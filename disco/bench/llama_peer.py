"""llama.cpp's own programs as the timed peer of the llama.cpp engine (transformers' ``generate`` is the torch one):
``llama-speculative-simple`` (its speculative decoding) for the settings it has (``pmin`` lanes:
``--spec-draft-p-min / n-max / n-min``; ``ngram`` lanes: ``--spec-type ngram-simple``; their hybrid: the comma-separated
``--spec-type ngram-simple,draft-simple``), and ``llama-bench`` for its plain decoding (the ``autoregressive``
lane). Both are built by ``scripts/llama-build.sh`` from the same vendored tree as the wheel and linked against
its libraries, so the kernels are the same; they run with llama.cpp's own defaults (weight repacking, its tiled
matmul, flash attention auto), which is what a llama.cpp user gets.

What is compared: the decode phase (llama-bench's ``tg`` test has no prompt; the example reports its prompt's
encoding apart), so the ``seconds`` of a peer row are decode seconds and our side of the comparison uses our
``decode_seconds`` (iteration 1, the prefill, excluded). The example's text is compared with ours over the tokens
both produced (it generates a few more than asked: its loop stops once it has more than ``-n``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from disco.errors import MissingResult
from disco.models import llama
from disco.policies import Autoregressive, Policy

PREFIX = "llama:"
BIN_ENV = "DISCO_LLAMA_BIN"  # a folder holding llama-speculative-simple and llama-bench (default: the venv's bin)


PROGRAMS = ("llama-speculative-simple", "llama-bench")  # scripts/llama-build.sh programs


def binary(name: str) -> Path | None:
    folder = Path(os.environ.get(BIN_ENV) or Path(sys.prefix) / "bin")
    path = folder / name
    return path if path.is_file() and os.access(path, os.X_OK) else None


def missing_programs() -> list[str]:
    """Which of llama.cpp's own programs are not built here (``./run.sh`` builds none of them)."""
    return [name for name in PROGRAMS if binary(name) is None]


def has_peer(policy: Policy) -> bool:
    """Whether llama.cpp has this setting (so it can be timed as the peer)."""
    if isinstance(policy, Autoregressive):
        return binary("llama-bench") is not None
    args = getattr(policy, "llama_args", None)  # a hybrid has them only when both its parts are llama.cpp's rules
    return args is not None and args() is not None and binary("llama-speculative-simple") is not None


def _env() -> dict:
    env = dict(os.environ)
    env.pop("GGML_CPU_TILED_MM", None)  # llama.cpp's defaults, not our exact mode
    return llama.child_env(env)  # the CPU variant our own lanes run (a build with several)


def plain(pair, max_new_tokens: int, reps: int = 1) -> dict:
    """llama.cpp's plain decoding of the target: ``llama-bench -p 0 -n N`` (tokens per second of generation)."""
    cmd = [str(binary("llama-bench")), "-m", str(pair.target_path), "-p", "0", "-n", str(max_new_tokens),
           "-t", str(llama.threads()), "-r", str(max(1, reps)), "-o", "csv"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=_env())
    if proc.returncode != 0:
        raise RuntimeError(f"llama-bench failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    header, row = lines[0].split(","), lines[-1].split(",")
    values = dict(zip((h.strip('"') for h in header), (v.strip('"') for v in row)))
    tps = float(values["avg_ts"])
    return {"seconds": max_new_tokens / tps, "tokens_per_s": tps, "new_tokens": max_new_tokens, "text": None,
            "command": " ".join(cmd)}


STAT = re.compile(r"\b(n_draft|n_predict|n_drafted|n_accept)\s*=\s*(\d+)")
DECODED = re.compile(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds")
# llama.cpp's log is printed by a thread of its own, and its logger is deliberately never destroyed (vendored
# common/log.cpp, common_log_main: "logs may be lost if not flushed before the program exits"); the example does not
# flush it, so on a busy machine it exits with 0 before the closing statistics (and the last tokens of its text) are
# printed: 7 of 40 runs here with both cores loaded, and once in CI. Such a run is repeated; a run that printed its
# statistics printed everything before them (one queue, in order), so its figures and text are whole. The log can
# also end inside the figures (n_drafted printed, n_accept lost: once here with both cores loaded), so a run counts
# only with the last of them, the "accept = …%" line, printed.
ATTEMPTS = 4
ACCEPT_LINE = re.compile(r"(?<![\w])accept\s*=\s*\S+%")  # "accept    = 71.429%" (not n_accept's line)
FIGURES = ("n_predict", "n_drafted", "n_accept")


def statistics(stderr: str) -> dict | None:
    """The closing figures of llama.cpp's speculative example (``seconds`` of decoding, ``n_predict``, ``n_drafted``,
    ``n_accept``), or None when its log ended before all of them were printed."""
    stats = {k: int(v) for k, v in STAT.findall(stderr)}
    decoded = DECODED.search(stderr)
    if decoded is None or any(k not in stats for k in FIGURES) or ACCEPT_LINE.search(stderr) is None:
        return None
    return stats | {"seconds": float(decoded.group(2))}


class NoStatistics(MissingResult, RuntimeError):
    """llama.cpp's example exited every time before its logger printed the figures (a busy machine): the bench goes on
    without that peer row and its report says so."""


def speculative(pair, prompt_ids: list[int], policy: Policy, max_new_tokens: int) -> dict:
    """llama.cpp's speculative example on the same pair and setting, greedy (``--temp 0 --top-k 1``)."""
    prompt = pair.tokenizer.decode(prompt_ids, skip_special_tokens=False)  # llama.cpp tokenizes it back (same ids)
    assistant = getattr(pair.assistant_model, "path", pair.assistant_path)
    cmd = [str(binary("llama-speculative-simple")), "-m", str(pair.target_path), "-md", str(assistant),
           *policy.llama_args(), "-p", prompt, "-n", str(max_new_tokens), "-t", str(llama.threads()),
           "-c", str(pair.context_length), "--temp", "0", "--top-k", "1", "--seed", "0"]
    for _ in range(ATTEMPTS):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=_env())
        if proc.returncode != 0:
            raise RuntimeError(f"llama-speculative-simple failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
        stats = statistics(proc.stderr)
        if stats is not None:
            break
    else:
        tail = " | ".join((proc.stderr or proc.stdout or "(nothing)").strip().splitlines()[-6:])
        raise NoStatistics(f"llama-speculative-simple printed no statistics in {ATTEMPTS} runs: {tail}")
    text = proc.stdout.split("\n\n", 1)[-1] if "\n\n" in proc.stdout else proc.stdout
    if text.startswith(prompt):
        text = text[len(prompt):]
    return {"seconds": stats["seconds"], "new_tokens": stats["n_predict"], "drafted": stats["n_drafted"],
            "accepted": stats["n_accept"], "text": text.rstrip("\n"), "command": " ".join(cmd)}
