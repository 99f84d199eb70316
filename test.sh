#!/usr/bin/env bash
# Set up everything the tests need (venv, Debian's chromium for the browser tests) and run them all:
# unit (tiny models) -> integration (the real embedded pair) -> app (gradio_client) -> browser (Playwright).
# Extra arguments go to pytest, e.g. ./test.sh tests/unit -x
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh requirements-dev.txt
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "test: installing Debian's chromium for the browser tests" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "test: could not install chromium; browser tests will be skipped" >&2
fi
exec .venv/bin/python -m pytest "${@:-tests}"
