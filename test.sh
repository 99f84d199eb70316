#!/usr/bin/env bash
# Set up everything the tests need (venv, Debian's chromium for the browser tests) and run them all:
# unit (tiny models), integration (the real embedded pair), app (gradio_client), browser (Playwright), on one
# pytest-xdist worker per core, at most two (DISCO_TEST_WORKERS; each worker pinned to its core by tests/conftest.py; a
# module's tests stay on one worker, the modules in the order collected: the long app and integration modules first,
# the many short unit modules last).
# Extra arguments go to pytest, e.g. ./test.sh tests/unit -x, ./test.sh -m fast (the fast tier), ./test.sh -n 0 (one
# process, e.g. for --pdb)
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh requirements-dev.txt
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "test: installing Debian's chromium for the browser tests" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "test: could not install chromium; browser tests will be skipped" >&2
fi
workers="${DISCO_TEST_WORKERS:-$(.venv/bin/python -c 'from disco.machine import usable_cpus; print(min(2, usable_cpus()))')}"
case "$workers" in ''|*[!0-9]*) echo "test: DISCO_TEST_WORKERS=$workers: use a number of workers (0: one process)" >&2; exit 2;; esac
[ "$workers" -ge 2 ] || workers=0  # one core: no workers, the tests run in this process
exec .venv/bin/python -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder "${@:-tests}"
