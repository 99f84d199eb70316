#!/usr/bin/env bash
# Build llama-cpp-python (pinned in requirements-llamacpp.txt) once into a wheelhouse, and install it into .venv.
#
# PyPI has only its source. The build is done once; later set-ups install the kept wheel in seconds. Build flags:
#   * on Linux x86-64, ggml's CPU backend is built once per instruction-set level (GGML_BACKEND_DL: libggml-cpu-NAME.so
#     beside libllama; disco/models/cpu_variant.py loads the best one this CPU runs at start). Which levels
#     (DISCO_LLAMA_VARIANTS):
#       native (default): this CPU's best variant plus x64 (plain x86-64: a venv moved to another CPU still starts),
#                         ~2.5 minutes on 2 cores; a later start on a CPU whose best variant the kept build lacks
#                         builds again (scripts/cpu_variants.py reads ggml's list and this CPU's flags);
#       all:              every variant (x64, SSE4.2, AVX, AVX2, AVX-512 with VNNI/VBMI/BF16, AMX ...), ~6-8 minutes:
#                         for images and Spaces (the Dockerfile sets it), which may start on any x86-64 CPU.
#     A kept build says what it holds (llama-build-flavour-VERSION). A compiler too old for the variant modules
#     (GCC < 11) gets the earlier portable AVX2 build instead. CMAKE_ARGS adds flags (a build with other CMAKE_ARGS
#     is another kind: it is rebuilt, not reused);
#   * llamafile's sgemm off: its rows depend on the batch size, and DISCO Lab's exact mode needs a verified row to
#     equal the one-token row (disco/models/llama.py); measured no slower for the embedded pair;
#   * no multimodal library (a quarter of the build, unused).
#   * without llama.cpp's common library and its HTTP library (llama-cpp-python's CMakeLists forces them on; the
#     Python package never loads them): about half of the build's CPU time.
# llama.cpp's own programs, which the benchmark times as this engine's peer and the This machine tab's kernel price
# runs (its speculative example llama-speculative-simple and llama-bench), need that common library: the `programs`
# phase builds it apart (its objects only, nothing else of the tree) and links them against the kept wheel's
# libraries; they are kept beside the wheel (they load the CPU variant named by GGML_BACKEND_PATH, which DISCO Lab
# sets). The test set-up and the Dockerfile build them (DISCO_LLAMA_PROGRAMS=1); ./run.sh does not (measured: the
# native wheel 189 s instead of 244 s beside the first start's pip install; the programs 175 s more).
#
# Usage: scripts/llama-build.sh [build|programs|install]   (no argument: build and install)
#   build:    make the kept wheel if the kept one does not serve this machine (needs only .venv's python and pip, so
#             scripts/setup.sh runs it beside the pip install); DISCO_BUILD_LOG gets the build's output (its
#             [n/N] steps are the set-up's progress bar)
#   programs: llama.cpp's own programs for the kept wheel, once (about 3 minutes on 2 cores), into .venv if it has
#             the wheel installed
#   install:  put the kept wheel and programs into .venv
# DISCO_WHEELHOUSE sets where the wheel is kept. Never fatal: where the build is not possible, one line says so and
# what to do, and the torch engine still works.
set -uo pipefail
cd "$(dirname "$0")/.."
pin="$(grep -E '^llama-cpp-python==' requirements-llamacpp.txt)"
version="${pin#llama-cpp-python==}"
house="${DISCO_WHEELHOUSE:-${DISCO_CACHE:-$HOME/.cache/disco}/wheels}"
py=.venv/bin/python
pyver="$($py -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')"
peers="llama-speculative-simple llama-bench"

say() { echo "setup: $*" >&2; }
phase="${1:-both}"
case "$phase" in build|programs|install|both) ;; *) say "llama-build.sh: unknown phase '$phase' (build, programs, install or none)"; exit 2;; esac

# what kind of build is wanted (and the user's CMAKE_ARGS): a kept wheel or an install that does not serve it (an
# older single-CPU build, a native build for another CPU, other flags) is built again
want="${DISCO_LLAMA_VARIANTS:-native}"
case "$want" in native|all) ;; *) say "DISCO_LLAMA_VARIANTS=$want: use native (this CPU's kernels) or all (every x86 CPU's)"; exit 2;; esac
if [ "$(uname -s)-$(uname -m)" != Linux-x86_64 ]; then kind="default-1"
elif [ "$want" = all ]; then kind="cpu-variants-1"
else kind="cpu-native-1"; fi
cmake_hash="${CMAKE_ARGS:+$(printf '%s' "$CMAKE_ARGS" | sha1sum | cut -c1-12)}"
table="$house/llama-variants-$version.txt"  # ggml's x86 variants and their features, kept from the source
best_here() { [ -f "$table" ] && $py scripts/cpu_variants.py best "$table" 2>/dev/null; }
serves() {  # serves FLAVOUR: does a build of this flavour serve what is wanted on this CPU?
  local f="$1" held best
  case "$f" in
    *" +"*) [ "${f##* +}" = "$cmake_hash" ] || return 1; f="${f% +*}";;
    *) [ -z "$cmake_hash" ] || return 1;;
  esac
  [ "$f" = "$kind" ] && return 0
  # made only where the compiler is too old for the variant modules (building again won't help), and only for AVX2 CPUs
  [ "$f" = portable-avx2 ] && grep -qw avx2 /proc/cpuinfo 2>/dev/null && return 0
  if [ "$kind" = cpu-native-1 ]; then
    [ "$f" = cpu-variants-1 ] && return 0  # every variant serves any CPU
    case "$f" in
      "cpu-native-1 "*) held="${f#cpu-native-1 }"; best="$(best_here)"
        [ -n "$best" ] && [[ ",$held," == *",$best,"* ]] && return 0;;
    esac
  fi
  return 1
}
build_flags() {  # build_flags KIND
  local f="-DGGML_LLAMAFILE=OFF -DLLAVA_BUILD=OFF -DGGML_CCACHE=OFF"
  case "$1" in
    cpu-variants-1|cpu-native-1)
      # the variant modules are installed where ggml's own rule puts backends (CMAKE_INSTALL_BINDIR): beside libllama;
      # a native build has the list patched down to its variants first (scripts/cpu_variants.py patch)
      f="-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DCMAKE_INSTALL_BINDIR=llama_cpp/lib $f";;
    portable-avx2)  # the earlier build: one linked x86-64-v3 backend, for compilers without AVX-VNNI / AMX (GCC < 11)
      f="-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON $f";;
  esac
  echo "$f"
}
wheel_build() {  # wheel_build KIND: the wheel into $work/wheel, its build tree in $work/build (-v: the build's steps)
  rm -rf "$work/wheel" "$work/build"
  CMAKE_ARGS="$(build_flags "$1") ${CMAKE_ARGS:-}" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    $py -m pip wheel -v --disable-pip-version-check --no-deps -w "$work/wheel" -C build-dir="$work/build" "$src" \
    >>"$log" 2>&1
}
libdir() { $py -c 'import os, importlib.util as u; print(os.path.join(os.path.dirname(u.find_spec("llama_cpp").origin), "lib"))' 2>/dev/null; }
installed_serves() {
  [ "$($py -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null)" = "$version" ] \
    && serves "$(cat "$(libdir)/disco-build-flavour" 2>/dev/null)" \
    && { [ -x .venv/bin/llama-bench ] || [ ! -e "$house/llama-bench-$version" ]; }
}
free_mb() { df -Pm "$1" 2>/dev/null | awk 'NR == 2 {print $4}'; }
kept_wheel() { ls "$house"/llama_cpp_python-"$version"-*.whl 2>/dev/null | head -n 1; }
missing_tool() {  # the first build tool this machine lacks (nothing when it has them all)
  local tool
  for tool in cmake g++ make; do command -v "$tool" >/dev/null 2>&1 || { echo "$tool"; return; }; done
}
copy_programs() {  # the kept llama.cpp programs into .venv (they find the installed wheel's libraries)
  local name
  for name in $peers; do
    if [ -x "$house/$name-$version" ]; then cp "$house/$name-$version" ".venv/bin/$name"; fi
  done
}

build() {  # the kept wheel for what is wanted, unless it is there already
  local wheel failure list best tmp tool
  installed_serves && return 0
  wheel="$(kept_wheel)"
  if [ -n "$wheel" ] && serves "$(cat "$house/llama-build-flavour-$version" 2>/dev/null)"; then return 0; fi
  tool="$(missing_tool)"
  if [ -n "$tool" ]; then
    say "no $tool here, so llama-cpp-python cannot be built: install it (Debian: apt-get install cmake g++ make libssl-dev) and start again; the torch engine works meanwhile"
    return 0
  fi
  tmp="${TMPDIR:-/tmp}"
  if [ "$(free_mb "$tmp")" -lt 2048 ] 2>/dev/null; then
    say "only $(free_mb "$tmp") MB free in $tmp; the llama-cpp-python build needs ~2 GB there: free some or set TMPDIR, and start again; the torch engine works meanwhile"
    return 0
  fi
  if [ -n "$wheel" ]; then  # removed only now that a build can start (a kept wheel stays where none can)
    say "the kept $(basename "$wheel") ($(cat "$house/llama-build-flavour-$version" 2>/dev/null || echo 'unknown kind')) does not serve this CPU or these flags; building again"
    rm -f "$wheel" "$house/llama-speculative-simple-$version" "$house/llama-bench-$version" "$house/llama-build-flavour-$version"
  fi
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  log="${DISCO_BUILD_LOG:-$work/log}"
  : >"$log"
  start=$SECONDS
  # its source only (--no-binary :all: would build its build dependencies from source too: 4 minutes here, not 5 s)
  if ! $py -m pip download --quiet --disable-pip-version-check --no-deps --no-binary llama-cpp-python "$pin" -d "$work" >>"$log" 2>&1; then
    say "could not download the llama-cpp-python source ($(tail -n 1 "$log")); the torch engine works"; return 0
  fi
  tar -xzf "$work"/llama_cpp_python-"$version".tar.gz -C "$work"
  src="$work/llama_cpp_python-$version"
  mkdir -p "$house"
  cp "$work"/llama_cpp_python-"$version".tar.gz "$house"/  # the programs phase builds from it (no second download)
  sed -i 's/set(LLAMA_BUILD_COMMON ON CACHE BOOL/set(LLAMA_BUILD_COMMON OFF CACHE BOOL/' "$src/CMakeLists.txt"
  grep -q 'set(LLAMA_BUILD_COMMON OFF CACHE BOOL' "$src/CMakeLists.txt" \
    || echo "setup: llama-cpp-python's CMakeLists no longer forces llama.cpp's common library as expected; building it too" >>"$log"
  flavour="$kind"
  if [ "$kind" = cpu-native-1 ] || [ "$kind" = cpu-variants-1 ]; then
    $py scripts/cpu_variants.py table "$src/vendor/llama.cpp/ggml/src/CMakeLists.txt" >"$work/variants.txt" 2>>"$log" \
      && cp "$work/variants.txt" "$table"
  fi
  if [ "$kind" = cpu-native-1 ]; then
    best="$(best_here)"
    list="$best"; [ "$best" = x64 ] || list="$best,x64"
    if [ -z "$best" ] || ! $py scripts/cpu_variants.py patch "$src/vendor/llama.cpp/ggml/src/CMakeLists.txt" "$list" >>"$log" 2>&1; then
      say "could not pick this CPU's variant ($(tail -n 1 "$log")); building every variant"; kind=cpu-variants-1; flavour="$kind"
    else
      flavour="cpu-native-1 $list"
    fi
  fi
  say "building llama-cpp-python $version once ($([ "$kind" = cpu-native-1 ] && echo "this CPU's kernels: $list, ~2.5 minutes" || echo "~6-8 minutes") on $(nproc) cores; kept in $house)"
  if ! wheel_build "$kind"; then
    failure="$(grep -m1 -E 'error:|CMake Error|^ERROR' "$log" | cut -c1-200 || true)"; failure="${failure:-$(tail -n 1 "$log" | cut -c1-200)}"
    if [ "$kind" = default-1 ]; then
      say "the llama-cpp-python build failed ($failure); the torch engine works"; return 0
    fi
    if [ "$(g++ -dumpversion 2>/dev/null | cut -d. -f1)" -ge 11 ] 2>/dev/null; then  # not the old-compiler case
      say "the llama-cpp-python build failed ($failure); the torch engine works (the next start tries again)"
      return 0
    fi
    say "the build with CPU variant modules failed ($failure; g++ $(g++ -dumpversion) is older than 11); building the portable AVX2 one instead"
    flavour=portable-avx2
    if ! wheel_build portable-avx2; then
      say "the llama-cpp-python build failed ($(grep -E 'error:|CMake Error|^ERROR' "$log" | tail -n 1 | cut -c1-200)); the torch engine works"
      return 0
    fi
  fi
  cp "$work"/wheel/*.whl "$house"/
  echo "$flavour${cmake_hash:+ +$cmake_hash}" >"$house/llama-build-flavour-$version"
  say "built $(basename "$(ls "$work"/wheel/*.whl | head -n 1)") ($flavour) in $((SECONDS - start)) s"
}

programs() {  # llama.cpp's own programs for the kept wheel: its common library's objects, then the programs linked
  local wheel tarball b l libs objs name steps line n from tool
  wheel="$(kept_wheel)"
  [ -n "$wheel" ] || return 0  # no wheel: the build said why
  if [ ! -x "$house/llama-speculative-simple-$version" ] || [ ! -x "$house/llama-bench-$version" ]; then
    tool="$(missing_tool)"
    if [ -n "$tool" ]; then
      say "no $tool here, so llama.cpp's own programs cannot be built (the benchmark's llama.cpp peer and the kernel price need them)"
      return 0
    fi
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    log="${DISCO_BUILD_LOG:-$work/log}"
    : >>"$log"
    from=$(($(wc -l <"$log") + 1))  # this phase's own lines of a log the wheel's build may have written first
    tarball="$house/llama_cpp_python-$version.tar.gz"
    if [ ! -f "$tarball" ]; then
      $py -m pip download --quiet --disable-pip-version-check --no-deps --no-binary llama-cpp-python "$pin" -d "$house" >>"$log" 2>&1 \
        || { say "could not download the llama-cpp-python source ($(tail -n 1 "$log")); llama.cpp's own programs are not built"; return 0; }
    fi
    tar -xzf "$tarball" -C "$work"
    l="$work/llama_cpp_python-$version/vendor/llama.cpp" b="$work/build"
    say "building llama.cpp's own programs (llama-speculative-simple, llama-bench) once, ~3 minutes on $(nproc) cores"
    # a standalone configure of the vendored tree; make's TARGET/fast builds a target without its dependencies, so
    # only the common library's objects are compiled (the libraries they call are the wheel's)
    # (TARGET/fast prints no percentages: each compiled object is written as an [n/N] step for the progress line)
    if ! { cmake -S "$l" -B "$b" -G "Unix Makefiles" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
             -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
             -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF -DGGML_CCACHE=OFF >>"$log" 2>&1 \
           && steps="$(cat "$b"/common/CMakeFiles/llama-common*.dir/build.make "$b"/vendor/cpp-httplib/CMakeFiles/cpp-httplib.dir/build.make \
                       | grep -cE '\.o: .*flags\.make$' || true)" \
           && make -C "$b" -j"$(nproc)" llama-common-base/fast cpp-httplib/fast llama-common/fast 2>&1 \
              | { n=0; while IFS= read -r line; do  # line by line as they come (mawk would hold them back in blocks)
                    case "$line" in *"Building C"*) n=$((n + 1)); echo "[$n/$steps] $line";; *) echo "$line";; esac
                  done; } >>"$log"; }; then
      say "llama.cpp's own programs did not build ($(tail -n +"$from" "$log" | grep -m1 -E 'error:|CMake Error' | cut -c1-200 || true); the log: $log); the benchmark's llama.cpp peer and the kernel price will lack them"
      return 0
    fi
    libs="$work/libs"  # the kept wheel's libraries, to link against (the programs find the installed ones at run time)
    $py -m zipfile -e "$wheel" "$libs" >>"$log" 2>&1
    objs="$(for a in libllama-common.a libllama-common-base.a libcpp-httplib.a; do find "$b" -name "$a" | head -n 1; done)"  # in link order
    link() {  # link NAME SOURCES...
      name="$1"; shift
      g++ -std=c++17 -O3 -DNDEBUG -DGGML_SHARED -DLLAMA_SHARED -DLLAMA_SUBPROCESS \
        -I"$l/common" -I"$l/vendor" -I"$l/include" -I"$l/ggml/include" -I"$l/tools/llama-bench" "$@" $objs \
        -L"$libs/llama_cpp/lib" -Wl,-rpath-link,"$libs/llama_cpp/lib" -l:libllama.so.0 -l:libggml.so.0 -l:libggml-base.so.0 \
        -lssl -lcrypto -pthread -Wl,-rpath,"\$ORIGIN/../lib/$pyver/site-packages/llama_cpp/lib" -o "$house/$name-$version" >>"$log" 2>&1 \
        || say "llama.cpp's $name did not link ($(tail -n +"$from" "$log" | grep -m1 -E 'error:|undefined reference' | cut -c1-160 || true); the log: $log); the benchmark's llama.cpp peer will lack it"
    }
    link llama-speculative-simple "$l/examples/speculative-simple/speculative-simple.cpp"
    link llama-bench "$l/tools/llama-bench/llama-bench.cpp" "$l/tools/llama-bench/main.cpp"
  fi
  if [ "$($py -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null)" = "$version" ]; then copy_programs; fi
}

install() {  # the kept wheel and programs into .venv (nothing to do when the build could not be made: it said why)
  local wheel
  installed_serves && return 0
  wheel="$(kept_wheel)"
  [ -n "$wheel" ] && serves "$(cat "$house/llama-build-flavour-$version" 2>/dev/null)" || return 0
  # the kept wheel itself (never another build pip might prefer), then its pinned companions
  if $py -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$wheel" >/dev/null 2>&1 \
     && $py -m pip install --quiet --disable-pip-version-check -r requirements-llamacpp.txt --find-links "$house" >/dev/null 2>&1; then
    :
  else
    say "could not install $(basename "$wheel"); the torch engine works"; return 0
  fi
  copy_programs
  cat "$house/llama-build-flavour-$version" >"$(libdir)/disco-build-flavour"
}

case "$phase" in
  build) build;;
  programs) programs;;
  install) install;;
  both) build; install;;
esac
exit 0
