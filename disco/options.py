"""The command line's shared pieces: one parser class, the argument types, and the options every command declares
the same way (``--models``, the numerics). Each area adds its own subcommand with these (``disco.cli``)."""

from __future__ import annotations

import argparse
import math
import os

from disco.errors import UserError


class UsageError(UserError):
    """A command line that cannot be parsed: one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse prints usage + message; we want one line
        raise UsageError(f"{message} (see {self.prog} --help)")


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def positive(text: str) -> int:
    value = integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def number_list(cast):
    """A comma-separated list of ``cast`` values (``1,2,3``)."""
    def parse(text: str) -> list:
        try:
            return [cast(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}") from None
    return parse


def check_writable(path) -> None:
    """Refuse, before any work, an output path that cannot be written as a file."""
    if path is None:
        return
    target = path.expanduser().resolve()
    if target.is_dir():
        raise UsageError(f"cannot write {path}: it is a folder; give a file name")
    if not target.parent.is_dir():
        raise UsageError(f"cannot write {path}: folder {target.parent} does not exist")


def check_out_dir(path) -> None:
    """Refuse, before any work, an output folder that cannot be made: a file in its place, or no writable folder to
    make it in (it is created when the outputs are written)."""
    target = path.expanduser().resolve()
    if target.exists() and not target.is_dir():
        raise UsageError(f"cannot write into {path}: it is a file; give a folder")
    existing = target
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise UsageError(f"cannot write into {path}: {existing} is not a writable folder")


def json_safe(value):
    """``value`` with every non-finite float as None (JSON has no NaN), through dicts and lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def add_models(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default=os.environ.get("DISCO_MODELS", "embedded"),
                   help="tiny, embedded (default), or TARGET::ASSISTANT (local folders or hub ids)")


def add_numerics(p: argparse.ArgumentParser, assistant_help: str | None = None) -> None:
    """--engine, --dtype, --device and --assistant-precision, shared by generate, profile, train and bench."""
    p.add_argument("--engine", choices=["auto", "torch", "llamacpp"], default=os.environ.get("DISCO_ENGINE") or "auto",
                   help="what runs the models: llamacpp (llama.cpp on GGUF files, CPU), torch (transformers), or auto "
                        "(llama.cpp on a CPU for a pair with GGUF files when it is installed, else torch; "
                        "DISCO_ENGINE sets the default)")
    p.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto",
                   help="torch engine: auto = chosen by timing the passes that matter on this machine (cached)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--assistant-precision", choices=["auto", "model", "int8", "q4_0"],
                   default=os.environ.get("DISCO_ASSISTANT_PRECISION", "auto"),
                   help=assistant_help or "the assistant's weights: model (as the pair ships it), int8 (torch: dynamic "
                        "int8 Linear layers, CPU), q4_0 (llama.cpp: re-quantized by llama.cpp's quantizer), or auto (the "
                        "cheaper one where the calibration shows it faster); a lane's @model / @int8 / @q4_0 overrides it")
