"""A public deployment's guards that need no server: which engines are offered, a second pair only when it fits and
needs no conversion, failures that are named (cache writes, the PNG export, a rename while preparing models), cost
CSVs read with bounds, and a bad operator variable stopping the app with one line."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from disco import cache
from disco.app import loader as app_loader
from disco.costs import model as cost_model
from disco.errors import InputError
from disco.models import ModelLoadError, memory

ROOT = Path(__file__).resolve().parents[2]


def test_the_operator_chooses_the_engines_a_deployment_offers(monkeypatch):
    monkeypatch.delenv("DISCO_ENGINES", raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert app_loader.offered_engines() is None
    monkeypatch.setenv("DISCO_ENGINES", "torch, llamacpp")
    assert app_loader.offered_engines() == ("torch", "llamacpp")
    for bad in ("vulkan", ",", "torch,cuda"):
        monkeypatch.setenv("DISCO_ENGINES", bad)
        with pytest.raises(InputError, match="DISCO_ENGINES"):
            app_loader.offered_engines()
    monkeypatch.setenv("DISCO_ENGINES", "torch")
    assert app_loader.ModelLoader("tiny").engines() == ["torch"]
    monkeypatch.delenv("DISCO_ENGINES")
    monkeypatch.setenv("SPACE_ID", "lab/disco")  # a Space offers its start-up engine only, unless asked
    assert app_loader.ModelLoader("tiny").engines() == ["torch"]


def test_a_second_pair_is_refused_when_it_does_not_fit_or_needs_a_conversion(monkeypatch, tmp_path):
    target, assistant = tmp_path / "t.gguf", tmp_path / "a.gguf"
    target.write_bytes(b"\0" * 3000)
    assistant.write_bytes(b"\0" * 1000)
    spec = f"{target}::{assistant}"
    assert memory.need_bytes(memory.pair_weights(spec, "llamacpp")) == int(4000 * memory.OVERHEAD)
    monkeypatch.setattr(memory, "available_bytes", lambda: 4000)
    with pytest.raises(ModelLoadError, match="needs about .* of memory and this machine has"):
        app_loader.check_room(spec, "llamacpp")
    monkeypatch.setattr(memory, "available_bytes", lambda: 10**9)
    app_loader.check_room(spec, "llamacpp")  # fits: no error
    from disco.models import embedded

    monkeypatch.setattr(embedded, "is_ready", lambda folder, role, table=None: False)
    with pytest.raises(ModelLoadError, match="models prepare --engine torch"):  # never a conversion in a request
        app_loader.check_room("embedded", "torch")
    assert memory.pair_weights("tiny", "torch") is None  # built in code: nothing to measure


def test_the_free_memory_is_the_machines_or_its_containers(monkeypatch):
    monkeypatch.setattr(memory, "_meminfo_available", lambda: 8 << 30)
    monkeypatch.setattr(memory, "_cgroup_available", lambda: 3 << 30)
    assert memory.available_bytes() == 3 << 30
    monkeypatch.setattr(memory, "_cgroup_available", lambda: None)
    assert memory.available_bytes() == 8 << 30


def test_a_cache_write_that_fails_is_logged_with_its_path(tmp_path, caplog):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    target = blocked / "profile.json"
    with caplog.at_level(logging.WARNING, logger="disco.cache"):
        assert cache.write_json(target, {"a": 1}) is None
    assert str(target) in caplog.text and "measured again" in caplog.text
    with pytest.raises(OSError):
        cache.write_json(target, {"a": 1}, quiet=False)


def test_a_failed_png_export_names_its_cause(monkeypatch, tmp_path):
    import types

    import plotly.graph_objects as go

    from disco.bench import report

    monkeypatch.setitem(sys.modules, "kaleido", types.ModuleType("kaleido"))
    fig = go.Figure()
    monkeypatch.setattr(go.Figure, "write_image", lambda self, path: (_ for _ in ()).throw(RuntimeError("no chrome")))
    meta, files = {}, {}
    report._write_png(fig, tmp_path, files, meta)
    assert meta["heatmap_png"] == "failed (RuntimeError: no chrome)" and "heatmap_png" not in files
    monkeypatch.setitem(sys.modules, "kaleido", None)
    report._write_png(fig, tmp_path, files, meta)
    assert meta["heatmap_png"] == "skipped (kaleido not installed)"


@pytest.mark.parametrize("tokens", ["inf", "1e400", "2.5", "0", "nan", str(2**40)])
def test_a_cost_csv_with_an_impossible_token_count_is_one_line(tmp_path, tokens):
    path = tmp_path / "costs.csv"
    path.write_text(f"role,precision,kind,tokens,ms\ntarget,bf16,step,{tokens},3\nassistant,model,step,1,1\n")
    with pytest.raises(cost_model.CostProfileError) as err:
        cost_model.resolve(str(path))
    assert "\n" not in str(err.value) and "tokens" in str(err.value)


def test_a_cost_csv_is_read_with_bounds(tmp_path):
    big = tmp_path / "big.csv"
    big.write_text("role,precision,kind,tokens,ms\n" + "target,bf16,step,1,3\n" * 60_000)
    with pytest.raises(cost_model.CostProfileError, match="at most"):
        cost_model.resolve(str(big))
    rows = tmp_path / "rows.csv"
    rows.write_text("role,precision,kind,tokens,ms\n" + "target,bf16,step,1,3\n" * 10_001)
    with pytest.raises(cost_model.CostProfileError, match="more than 10,000 rows"):
        cost_model.resolve(str(rows))


def test_the_cli_refuses_an_infinite_token_count_with_exit_2(tmp_path):
    path = tmp_path / "costs.csv"
    path.write_text("role,precision,kind,tokens,ms\ntarget,bf16,step,inf,3\nassistant,model,step,1,1\n")
    run = subprocess.run([sys.executable, "-m", "disco", "bench", "--models", "tiny", "--cost-profile", str(path),
                          "--out", str(tmp_path / "o"), "--prompts", "code-complete-fib", "--no-progress"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert len(run.stderr.strip().splitlines()) == 1 and "tokens" in run.stderr


@pytest.mark.parametrize("name, value", [("DISCO_QUEUE_MAX", "x"), ("DISCO_LLAMA_THREADS", "0"),
                                         ("DISCO_ENGINES", "vulkan"), ("DISCO_MAX_UPLOAD_MB", "-1"),
                                         ("DISCO_RUN_BUDGET_S", "inf")])
@pytest.mark.slow  # out of the fast tier (./test.sh -m fast): a real process or a long run
def test_a_bad_operator_variable_stops_the_app_with_one_line(name, value):
    env = {**os.environ, name: value, "DISCO_MODELS": "tiny", "GRADIO_SERVER_PORT": "1"}
    run = subprocess.run([sys.executable, "app.py"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 2, run.stderr[-2000:]
    lines = [line for line in run.stderr.strip().splitlines() if line.startswith("disco: error:")]
    assert len(lines) == 1 and name in lines[0] and "Traceback" not in run.stderr, run.stderr[-2000:]


def test_a_conversion_that_cannot_be_moved_into_place_is_kept_and_adopted(monkeypatch, tmp_path):
    """A failed rename never deletes the converted weights: the complete folder stays, and the next start adopts it
    instead of converting again."""
    from disco.models import embedded

    done = tmp_path / ".tmp-target-xyz"
    done.mkdir()
    (done / "weights.safetensors").write_text("w")
    target = embedded.model_dir("target", tmp_path)
    real_rename = os.rename
    monkeypatch.setattr(embedded.os, "rename", lambda a, b: (_ for _ in ()).throw(OSError(18, "cross-device")))
    with pytest.raises(OSError):
        embedded.swap_into_place(done, target)
    assert (done / "weights.safetensors").exists()  # nothing deleted
    monkeypatch.setattr(embedded.os, "rename", real_rename)
    monkeypatch.setattr(embedded, "is_ready", lambda folder, role, table=None: Path(folder).name.startswith(".tmp-")
                        or (Path(folder) / "weights.safetensors").exists())
    logs = []
    embedded._sweep_stale(tmp_path, logs.append, {"target": None, "assistant": None})
    assert (target / "weights.safetensors").read_text() == "w" and not done.exists()
    assert any("adopted" in line for line in logs)


def test_a_folder_counts_one_weight_format_and_cgroup_v1_is_read(tmp_path, monkeypatch):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"\0" * 100)
    (folder / "pytorch_model.bin").write_bytes(b"\0" * 100)  # an old copy beside it: not counted twice
    assert memory.weight_bytes([folder]) == 100
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "limit").write_text("4000\n")
    (v1 / "usage").write_text("1000\n")
    monkeypatch.setattr(memory, "CGROUPS", ((str(tmp_path / "none"), str(tmp_path / "none")),
                                            (str(v1 / "limit"), str(v1 / "usage"))))
    assert memory._cgroup_available() == 3000
    (v1 / "limit").write_text(str(1 << 62))  # v1's "no limit"
    assert memory._cgroup_available() is None


def test_an_uploaded_file_must_be_one_gradio_received(tmp_path):
    from disco.app import sweep_inputs
    from disco.errors import BenchError

    for bad in ({"path": "/etc/passwd"}, {"path": "a\0b"}, {"path": 3}, ["x"], 5):
        with pytest.raises(BenchError):
            sweep_inputs.uploaded(bad, "suite file")
    assert sweep_inputs.uploaded(None, "suite file") is None


def test_the_status_line_says_what_loading_waits_for():
    """Before the pair is ready the page's status line names the loading step now under way (issue 35)."""
    from disco.app import loader as app_loader

    loader = app_loader.ModelLoader("tiny", profile=False)
    assert "now: starting" in loader.status()
    loader._say("[disco] target: joining 22 parts (1.12 GB) and checking sha256 ...")
    assert "now: target: joining 22 parts" in loader.status() and "[disco]" not in loader.status()
    loader._say("<b>" + "x" * 500)
    assert "&lt;b&gt;" in loader.status() and len(loader.status()) < 400  # escaped and cut
