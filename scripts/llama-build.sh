#!/usr/bin/env bash
# Build llama-cpp-python (pinned in requirements-llamacpp.txt) once into a wheelhouse, and install it into .venv.
#
# PyPI has only its source: the build takes ~7 minutes on 2 cores (CMake, the vendored llama.cpp). It is done once;
# later set-ups install the kept wheel in seconds. Build flags:
#   * on Linux x86-64, one build with every CPU's kernels: ggml's CPU backend is built once per instruction-set level
#     (GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS: x64, SSE4.2, AVX, AVX2, AVX-512 with VNNI/VBMI/BF16, AMX ...) as
#     libggml-cpu-NAME.so beside libllama, and disco/models/cpu_variant.py loads the best one this CPU runs at start,
#     so an image or a Space built on one CPU runs on any other and each gets its own kernels. A compiler too old
#     for the AVX-VNNI / AMX variants (GCC < 11) gets the earlier portable AVX2 build instead. CMAKE_ARGS adds flags
#     (a build with other CMAKE_ARGS is another kind: it is rebuilt, not reused);
#   * llamafile's sgemm off: its rows depend on the batch size, and DISCO Lab's exact mode needs a verified row to
#     equal the one-token row (disco/models/llama.py); measured no slower for the embedded pair;
#   * no multimodal library (a quarter of the build, unused).
# The same build also gives llama.cpp's own programs that the benchmark times as this engine's peer: its speculative
# example (llama-speculative-simple) and llama-bench (its plain decoding); they are linked against the wheel's
# libraries and kept beside the wheel (they load the CPU variant named by GGML_BACKEND_PATH, which DISCO Lab sets).
#
# Usage: scripts/llama-build.sh            (from scripts/setup.sh; DISCO_WHEELHOUSE sets where the wheel is kept)
# Never fatal: where the build is not possible, one line says so and the torch engine still works.
set -uo pipefail
cd "$(dirname "$0")/.."
pin="$(grep -E '^llama-cpp-python==' requirements-llamacpp.txt)"
version="${pin#llama-cpp-python==}"
house="${DISCO_WHEELHOUSE:-${DISCO_CACHE:-$HOME/.cache/disco}/wheels}"
py=.venv/bin/python
pyver="$($py -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')"
peers="llama-speculative-simple llama-bench"

say() { echo "setup: $*" >&2; }

# what kind of build this is (and the user's CMAKE_ARGS): a wheel or an install of another kind (an older
# single-CPU build, other flags) is built again
if [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ]; then kind="cpu-variants-1"; else kind="default-1"; fi
flavour="$kind${CMAKE_ARGS:+ +$(printf '%s' "$CMAKE_ARGS" | sha1sum | cut -c1-12)}"
build_flags() {  # build_flags KIND
  local f="-DGGML_LLAMAFILE=OFF -DLLAVA_BUILD=OFF -DGGML_CCACHE=OFF"
  case "$1" in
    cpu-variants-1)
      # the variant modules are installed where ggml's own rule puts backends (CMAKE_INSTALL_BINDIR): beside libllama
      f="-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DCMAKE_INSTALL_BINDIR=llama_cpp/lib $f";;
    portable-avx2)  # the earlier build: one linked x86-64-v3 backend, for compilers without AVX-VNNI / AMX (GCC < 11)
      f="-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON $f";;
  esac
  echo "$f"
}
wheel_build() {  # wheel_build KIND: the wheel into $work/wheel, its build tree in $work/build
  rm -rf "$work/wheel" "$work/build"
  CMAKE_ARGS="$(build_flags "$1") ${CMAKE_ARGS:-}" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    $py -m pip wheel --quiet --disable-pip-version-check --no-deps -w "$work/wheel" -C build-dir="$work/build" "$src" \
    >>"$work/log" 2>&1
}
libdir() { $py -c 'import os, importlib.util as u; print(os.path.join(os.path.dirname(u.find_spec("llama_cpp").origin), "lib"))' 2>/dev/null; }

installed="$($py -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null)"
if [ "$installed" = "$version" ] && [ "$(cat "$(libdir)/disco-build-flavour" 2>/dev/null)" = "$flavour" ] \
   && { [ -x .venv/bin/llama-bench ] || [ ! -e "$house/llama-bench-$version" ]; }; then
  exit 0  # installed (with llama.cpp's own programs where they could be built)
fi

wheel="$(ls "$house"/llama_cpp_python-"$version"-*.whl 2>/dev/null | head -n 1)"
if [ -n "$wheel" ] && [ "$(cat "$house/llama-build-flavour-$version" 2>/dev/null)" != "$flavour" ]; then
  say "the kept $(basename "$wheel") is another kind of build; building this kind"
  rm -f "$wheel" "$house/llama-speculative-simple-$version" "$house/llama-bench-$version"
  wheel=""
fi
if [ -z "$wheel" ]; then
  for tool in cmake g++ make; do
    command -v "$tool" >/dev/null 2>&1 || { say "no $tool here, so llama-cpp-python cannot be built; the torch engine still works"; exit 0; }
  done
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  say "building llama-cpp-python $version once (~7 minutes on 2 cores; kept in $house) ..."
  start=$SECONDS
  if ! $py -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: "$pin" -d "$work" >"$work/log" 2>&1; then
    say "could not download the llama-cpp-python source ($(tail -n 1 "$work/log")); the torch engine still works"; exit 0
  fi
  tar -xzf "$work"/llama_cpp_python-"$version".tar.gz -C "$work"
  src="$work/llama_cpp_python-$version"
  mkdir -p "$house"
  if ! wheel_build "$kind"; then
    failure="$(grep -m1 -iE 'error' "$work/log" || tail -n 1 "$work/log")"
    if [ "$kind" != cpu-variants-1 ]; then
      say "the llama-cpp-python build failed ($failure); the torch engine still works"; exit 0
    fi
    say "the build with every CPU's kernels failed ($failure); building the portable AVX2 one instead"
    if ! wheel_build portable-avx2; then
      say "the llama-cpp-python build failed ($(grep -iE 'error' "$work/log" | tail -n 1)); the torch engine still works"
      exit 0
    fi
  fi
  # llama.cpp's own programs from the same tree, against the same libraries (seconds, once built)
  b="$work/build"
  l="$src/vendor/llama.cpp"
  objs="$(find "$b/vendor/llama.cpp/common/CMakeFiles/llama-common.dir" -name '*.o' | sort)"
  link() {  # link NAME SOURCES...
    local name="$1"; shift
    g++ -std=c++17 -O3 -DNDEBUG -DGGML_SHARED -DLLAMA_SHARED -DLLAMA_SUBPROCESS \
      -I"$l/common" -I"$l/vendor" -I"$l/include" -I"$l/ggml/include" -I"$l/tools/llama-bench" "$@" \
      $objs "$b/vendor/llama.cpp/common/libllama-common-base.a" "$b/vendor/llama.cpp/vendor/cpp-httplib/libcpp-httplib.a" \
      -L"$b/bin" -l:libllama.so.0 -l:libggml.so.0 -l:libggml-base.so.0 -lssl -lcrypto -pthread \
      -Wl,-rpath,"\$ORIGIN/../lib/$pyver/site-packages/llama_cpp/lib" -o "$house/$name-$version" >>"$work/log" 2>&1 \
      || say "llama.cpp's $name did not link (the benchmark's llama.cpp peer will lack it)"
  }
  link llama-speculative-simple "$l/examples/speculative-simple/speculative-simple.cpp"
  link llama-bench "$l/tools/llama-bench/llama-bench.cpp" "$l/tools/llama-bench/main.cpp"
  cp "$work"/wheel/*.whl "$house"/
  echo "$flavour" >"$house/llama-build-flavour-$version"
  wheel="$(ls "$house"/llama_cpp_python-"$version"-*.whl | head -n 1)"
  say "built $(basename "$wheel") in $((SECONDS - start)) s"
fi
if ! $py -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$wheel" >/dev/null 2>&1 \
   || ! $py -m pip install --quiet --disable-pip-version-check -r requirements-llamacpp.txt --find-links "$house" >/dev/null 2>&1; then
  say "could not install $(basename "$wheel"); the torch engine still works"; exit 0
fi
for name in $peers; do
  if [ -x "$house/$name-$version" ]; then cp "$house/$name-$version" ".venv/bin/$name"; fi
done
echo "$flavour" >"$(libdir)/disco-build-flavour"
exit 0
