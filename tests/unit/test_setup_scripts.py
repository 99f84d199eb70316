"""The set-up's helpers (issue 35): which llama.cpp CPU variants a start on this machine builds, and the progress
line the set-up prints while pip and the build run side by side. Hand-made CMake lists, cpuinfo files and logs."""

from __future__ import annotations

import importlib.util
import io
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look the module up by name
    spec.loader.exec_module(module)
    return module


cv = _load("cpu_variants")
progress = _load("progress")

# the shape of ggml/src/CMakeLists.txt's list (nested `if (NOT MSVC)` included), other architectures after it
CMAKE = """\
if (GGML_CPU_ALL_VARIANTS)
    if (GGML_SYSTEM_ARCH STREQUAL "x86")
        ggml_add_cpu_backend_variant(x64)
        ggml_add_cpu_backend_variant(sse42              SSE42)
        if (NOT MSVC)
            ggml_add_cpu_backend_variant(piledriver     SSE42 AVX F16C FMA)
        endif()
        ggml_add_cpu_backend_variant(haswell            SSE42 AVX F16C FMA AVX2 BMI2)
        ggml_add_cpu_backend_variant(skylakex           SSE42 AVX F16C FMA AVX2 BMI2 AVX512)
        if (NOT MSVC)
            ggml_add_cpu_backend_variant(zen4           SSE42 AVX F16C FMA AVX2 BMI2 AVX512 AVX512_VBMI AVX512_VNNI AVX512_BF16)
        endif()
        ggml_add_cpu_backend_variant(alderlake          SSE42 AVX F16C FMA AVX2 BMI2 AVX_VNNI)
        if (NOT MSVC)
            ggml_add_cpu_backend_variant(sapphirerapids SSE42 AVX F16C FMA AVX2 BMI2 AVX512 AVX512_VBMI AVX512_VNNI AVX512_BF16 AMX_TILE AMX_INT8)
        endif()
    elseif(GGML_SYSTEM_ARCH STREQUAL "ARM")
        ggml_add_cpu_backend_variant(armv8.0_1)
    endif()
endif()
"""
BASE = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma bmi2"
EPYC_NO_AVX512 = BASE + " avx2"
EPYC_ZEN4 = EPYC_NO_AVX512 + " avx512f avx512cd avx512vl avx512dq avx512bw avx512vbmi avx512_vnni avx512_bf16"
XEON_AMX = EPYC_ZEN4 + " avx_vnni amx_tile amx_int8 amx_bf16"


@pytest.fixture
def cmakelists(tmp_path):
    path = tmp_path / "CMakeLists.txt"
    path.write_text(CMAKE)
    return path


def test_table_reads_only_the_x86_list(cmakelists):
    names = [name for name, _ in cv.table(str(cmakelists))]
    assert names == ["x64", "sse42", "piledriver", "haswell", "skylakex", "zen4", "alderlake", "sapphirerapids"]
    assert dict(cv.table(str(cmakelists)))["haswell"] == ["SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2"]


@pytest.mark.parametrize("flags, expected", [
    (EPYC_ZEN4, "zen4"),
    (EPYC_NO_AVX512, "haswell"),
    (XEON_AMX, "zen4"),  # AMX only when named, as disco/models/cpu_variant.py
    (BASE.replace(" avx f16c fma bmi2", ""), "sse42"),
    ("fpu sse sse2", "x64"),
    (EPYC_ZEN4.replace(" avx512bw", ""), "haswell"),  # ggml's AVX512 needs F, CD, VL, DQ and BW
])
def test_best_is_ggml_loaders_choice(cmakelists, flags, expected):
    assert cv.best(cv.table(str(cmakelists)), set(flags.split())) == expected


def test_best_from_a_kept_table_and_a_cpuinfo_file(cmakelists, tmp_path):
    kept = tmp_path / "variants.txt"
    kept.write_text(subprocess.run([sys.executable, str(ROOT / "scripts/cpu_variants.py"), "table", str(cmakelists)],
                                   capture_output=True, text=True, check=True).stdout)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {EPYC_NO_AVX512}\n\nprocessor\t: 1\nflags\t\t: {EPYC_NO_AVX512}\n")
    out = subprocess.run([sys.executable, str(ROOT / "scripts/cpu_variants.py"), "best", str(kept),
                          "--cpuinfo", str(cpuinfo)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "haswell"


def test_patch_keeps_only_the_chosen_variants(cmakelists):
    cv.patch(str(cmakelists), ["zen4", "x64"])
    assert [name for name, _ in cv.table(str(cmakelists))] == ["x64", "zen4"]
    text = cmakelists.read_text()
    assert "ggml_add_cpu_backend_variant(armv8.0_1)" in text.splitlines()[-3]  # other architectures untouched
    assert text.count("endif()") == CMAKE.count("endif()")


def test_patch_refuses_a_variant_ggml_lacks(cmakelists):
    with pytest.raises(SystemExit, match="no variant zen9"):
        cv.patch(str(cmakelists), ["zen9", "x64"])
    assert cmakelists.read_text() == CMAKE  # nothing half-written


# ---- the progress line ---------------------------------------------------------------------------------------------

class _Clock:
    """time.monotonic and sleep that advance together, so the test reads no real time."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t

    def sleep(self, seconds):
        self.t += seconds


def _run(monkeypatch, jobs, script, every=10.0, tty=False):
    """Feed each job's log line by line, one line per simulated second (script: {second: [(path, text)]})."""
    clock = _Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    for job in jobs:
        job.started = clock.t
    start = clock.t

    def sleep(seconds):
        clock.sleep(seconds)
        for path, text in script.get(int(round(clock.t - start)), []):
            with open(path, "a") as fh:
                fh.write(text)

    out = io.StringIO()
    rc = progress.watch(jobs, every, out=out, tty=tty, sleep=sleep)
    return rc, out.getvalue().split("\n")[:-1]


def test_progress_reads_pip_and_ninja_and_never_goes_quiet(tmp_path, monkeypatch):
    pip_log, pip_rc = tmp_path / "install.log", tmp_path / "install.rc"
    build_log, build_rc = tmp_path / "build.log", tmp_path / "build.rc"
    script = {}
    for i in range(10):  # ten packages collected over 20 s, then pip installs for 15 s
        script.setdefault(2 * i + 1, []).append((pip_log, f"Collecting pkg{i}==1.0\n  Downloading pkg{i}.whl (1 MB)\n"))
    script[22] = [(pip_log, "Installing collected packages: pkg0, pkg1\n")]
    script[37] = [(pip_log, "Successfully installed pkg0-1.0\n"), (pip_rc, "0\n")]
    for step in range(1, 41):  # a 40-step ninja build, one step a second
        script.setdefault(step, []).append((build_log, f"  [{step}/40] Building CXX object ggml-cpu.o\n"))
    script.setdefault(42, []).append((build_rc, "0\n"))
    jobs = [progress.Job("install", "pip", pip_log, pip_rc, expect=20),
            progress.Job("build", "build", build_log, build_rc)]
    rc, lines = _run(monkeypatch, jobs, script)
    assert rc == 0
    assert 4 <= len(lines) <= 6  # one line every 10 s of a 42 s set-up, and the last
    assert "10/~20 packages collected" in lines[1] and "[10/40] steps" not in lines[1]
    assert "20/40 steps" in lines[1] and "~0:20 left" in lines[1]  # half the steps in 20 s: 20 s left
    assert "install done in 0:37" in lines[-1] and "build done in 0:42" in lines[-1]


def test_a_second_build_phase_gets_its_own_estimate(tmp_path, monkeypatch):
    """The build job builds the wheel (100 steps) and then llama.cpp's programs (their own 20 steps, slower): the
    estimate counts from the programs' first step, not from the wheel's."""
    log, rc_file = tmp_path / "build.log", tmp_path / "build.rc"
    script = {}
    for step in range(1, 11):  # the wheel: 100 steps in 10 s
        script.setdefault(step, []).append((log, f"  [{10 * step}/100] Building C object\n"))
    for step in range(1, 21):  # the programs: 20 steps, one every 2 s
        script.setdefault(10 + 2 * step, []).append((log, f"[{step}/20] Building CXX object common.o\n"))
    script.setdefault(52, []).append((rc_file, "0\n"))
    rc, lines = _run(monkeypatch, [progress.Job("build", "build", log, rc_file)], script)
    at_30 = next(line for line in lines if "(0:30" in line)
    assert rc == 0 and "10/20 steps" in at_30 and "~0:20 left" in at_30, lines


def test_progress_on_a_terminal_redraws_each_second(tmp_path, monkeypatch):
    log, rc_file = tmp_path / "b.log", tmp_path / "b.rc"
    script = {s: [(log, f"[{s}/5] step\n")] for s in range(1, 6)}
    script[6] = [(rc_file, "0")]
    rc, lines = _run(monkeypatch, [progress.Job("build", "build", log, rc_file)], script, tty=True)
    assert rc == 0 and len(lines) == 1 and lines[0].count("\r\033[K") >= 6 and "build done in 0:06" in lines[0]


def test_progress_reports_a_failed_job_with_its_log(tmp_path, monkeypatch):
    log, rc_file = tmp_path / "install.log", tmp_path / "install.rc"
    script = {1: [(log, "Collecting nothere==9\nERROR: No matching distribution found for nothere==9\n")],
              2: [(rc_file, "1\n")]}
    rc, lines = _run(monkeypatch, [progress.Job("install", "pip", log, rc_file)], script)
    assert rc == 1
    assert "FAILED (exit 1)" in "\n".join(lines) and "No matching distribution found" in lines[-1]


def test_progress_says_nothing_when_all_is_there_already(tmp_path, monkeypatch):
    rc_file = tmp_path / "b.rc"
    rc_file.write_text("0\n")
    out = io.StringIO()
    clock = _Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    job = progress.Job("build", "build", tmp_path / "none.log", rc_file)
    assert progress.watch([job], 10, out=out, tty=False, sleep=clock.sleep, quiet_under=3) == 0
    assert out.getvalue() == ""


def test_progress_refuses_a_bad_job_spec():
    with pytest.raises(SystemExit, match="bad job"):
        progress.parse_job("install:npm:a.log:a.rc")


@pytest.mark.parametrize("args, env, says", [
    (["bogus"], {}, "unknown phase 'bogus'"),
    (["build"], {"DISCO_LLAMA_VARIANTS": "some"}, "DISCO_LLAMA_VARIANTS=some: use native"),
])
def test_the_build_script_refuses_a_bad_request_in_one_line(args, env, says):
    import os

    proc = subprocess.run(["bash", str(ROOT / "scripts/llama-build.sh"), *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60)
    assert proc.returncode == 2 and says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_the_set_up_refuses_an_unknown_variant_choice_before_starting_anything():
    import os

    proc = subprocess.run(["bash", str(ROOT / "scripts/setup.sh")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DISCO_LLAMA_VARIANTS": "every"})
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "setup: DISCO_LLAMA_VARIANTS=every: use native (this CPU's kernels) or all (every x86 CPU's)"]


def test_the_programs_phase_without_a_kept_wheel_builds_nothing_and_says_nothing(tmp_path):
    """``scripts/llama-build.sh programs`` links llama.cpp's own programs against the kept wheel: with none kept (the
    build could not be made and said why), it has nothing to do."""
    import os

    proc = subprocess.run(["bash", str(ROOT / "scripts/llama-build.sh"), "programs"], capture_output=True, text=True,
                          env={**os.environ, "DISCO_WHEELHOUSE": str(tmp_path / "house")}, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "" and not (tmp_path / "house").exists()
