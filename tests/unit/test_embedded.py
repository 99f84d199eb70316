"""Unit tests for disco.embedded on tiny fake data wheels (no real models, no transformers)."""

from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

# Self-contained: importable even before the project's conftest puts the repo root on sys.path.
ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from disco.models import embedded  # noqa: E402
from disco import cache  # noqa: E402
from disco.models import wheels  # noqa: E402
from disco.models.wheels import EmbeddedError, ModelSpec  # noqa: E402

# Importing a data module would run this; the code under test must only locate files.
POISON_INIT = "raise RuntimeError('data modules must not be imported')\n"


def install_fake_dist(site: Path, dist: str, module: str, index: int, data: bytes | None,
                      version: str = "0.1") -> None:
    """Lay out what pip would: a dist-info folder plus <module>/data/partNN.bin."""
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    pkg = site / module
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text(POISON_INIT)
    if data is not None:
        (pkg / "data" / f"part{index:02d}.bin").write_bytes(data)
        # pip's RECORD: path, urlsafe-b64 sha256 without padding, size
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        (info / "RECORD").write_text(f"{module}/data/part{index:02d}.bin,sha256={digest},{len(data)}\n"
                                     f"{module}/__init__.py,,\n")


def make_role(site: Path, role: str, n_parts: int, skip: tuple[int, ...] = ()) -> tuple[ModelSpec, bytes]:
    """Install a fake role's parts and return its spec and the expected joined bytes."""
    prefix = f"fk-{role}-part"
    chunks = [f"<{role} part {i}>".encode() * (i + 3) for i in range(1, n_parts + 1)]
    for i, chunk in enumerate(chunks, start=1):
        if i not in skip:
            install_fake_dist(site, f"{prefix}{i}", f"{prefix.replace('-', '_')}{i}", i, chunk)
    joined = b"".join(chunks)
    spec = ModelSpec(
        role=role, dist_prefix=prefix, module_prefix=prefix.replace("-", "_"), n_parts=n_parts,
        version="0.1", size=len(joined), sha256=hashlib.sha256(joined).hexdigest(),
        hub_id=f"fake/{role}", gguf_name=f"{role}.gguf",
    )
    return spec, joined


@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "site-packages"
    path.mkdir()
    monkeypatch.syspath_prepend(str(path))
    return path


@pytest.fixture
def fake_roles(site, monkeypatch):
    """Two fake roles installed and patched in as the wheels' ROLES; returns ({role: spec}, {role: bytes})."""
    target, target_bytes = make_role(site, "target", 11)
    assistant, assistant_bytes = make_role(site, "assistant", 2)
    table = {"target": target, "assistant": assistant}
    monkeypatch.setattr(wheels, "ROLES", table)
    return table, {"target": target_bytes, "assistant": assistant_bytes}


class FakeExport:
    """Stands in for the transformers conversion; records calls and can fail midway."""

    def __init__(self, fail_with: BaseException | None = None):
        self.calls: list[tuple[Path, bytes]] = []
        self.fail_with = fail_with

    def __call__(self, gguf_path: Path, dest: Path) -> None:
        self.calls.append((gguf_path, gguf_path.read_bytes()))
        (dest / "config.json").write_text("{}")
        (dest / "model.safetensors").write_bytes(b"weights")
        if self.fail_with is not None:
            raise self.fail_with
        (dest / "tokenizer.json").write_text("{}")


def quiet(_msg: str) -> None:
    pass


# --------------------------------------------------------------------------- locate


def test_locate_parts_in_numeric_order_without_importing(fake_roles):
    table, _ = fake_roles
    parts = embedded.locate_parts("target")
    assert [p.name for p in parts] == [f"part{i:02d}.bin" for i in range(1, 12)]
    assert parts.index(next(p for p in parts if p.name == "part10.bin")) == 9
    assert not any(name.startswith(table["target"].module_prefix) for name in sys.modules)


def test_missing_distribution_names_the_package(site, monkeypatch):
    spec, _ = make_role(site, "target", 8, skip=(7,))
    with pytest.raises(EmbeddedError) as err:
        embedded.locate_parts("target", table={"target": spec})
    msg = str(err.value)
    assert f"pip install --force-reinstall {spec.dist_prefix}7==0.1" in msg
    assert f"{spec.dist_prefix}6" not in msg and f"{spec.dist_prefix}8" not in msg


def test_installed_but_missing_part_file_names_the_package(site):
    spec, _ = make_role(site, "target", 3)
    (site / f"{spec.module_prefix}2" / "data" / "part02.bin").unlink()
    with pytest.raises(EmbeddedError, match=rf"--force-reinstall {spec.dist_prefix}2==0\.1$"):
        embedded.locate_parts("target", table={"target": spec})


def test_wrong_version_is_reported(site):
    spec, _ = make_role(site, "target", 2)
    newer = ModelSpec(**{**spec.__dict__, "version": "0.2"})
    with pytest.raises(EmbeddedError, match="version 0.1 installed, 0.2 expected"):
        embedded.locate_parts("target", table={"target": newer})


# --------------------------------------------------------------------------- join


def test_join_gives_the_concatenated_bytes(fake_roles, tmp_path):
    table, data = fake_roles
    spec = table["target"]
    dest = tmp_path / "out" / "t.gguf"
    embedded.join_parts(embedded.locate_parts("target"), dest, spec.size, spec.sha256, progress=False)
    assert dest.read_bytes() == data["target"]
    assert not dest.with_name("t.gguf.partial").exists()


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_join_refuses_corrupt_bytes(fake_roles, tmp_path, damage):
    table, _ = fake_roles
    spec = table["target"]
    parts = embedded.locate_parts("target")
    raw = bytearray(parts[4].read_bytes())
    if damage == "flip":
        raw[3] ^= 0xFF
    else:
        raw = raw[:-1]
    parts[4].write_bytes(raw)
    dest = tmp_path / "t.gguf"
    pip_specs = [spec.pip_spec(d) for d in spec.dists]
    with pytest.raises(EmbeddedError, match="corrupt") as err:
        embedded.join_parts(parts, dest, spec.size, spec.sha256, progress=False, packages=pip_specs)
    assert "pip install --force-reinstall " + " ".join(pip_specs) in str(err.value)
    assert list(tmp_path.glob("t.gguf*")) == []


# --------------------------------------------------------------------------- prepare / convert


def test_prepare_converts_each_role_and_keeps_the_verified_gguf(fake_roles, tmp_path, monkeypatch):
    table, data = fake_roles
    export = FakeExport()
    monkeypatch.setattr(embedded, "_export_bf16", export)
    cache = tmp_path / "cache"

    folders = embedded.prepare(cache, progress=False, log=quiet)

    assert folders == {"target": cache / "models" / "target", "assistant": cache / "models" / "assistant"}
    assert [content for _path, content in export.calls] == [data["target"], data["assistant"]]
    for role, folder in folders.items():
        assert embedded.is_ready(folder, role)
        marker = json.loads((folder / embedded.MARKER_NAME).read_text())
        assert marker["role"] == role and marker["source_sha256"] == table[role].sha256
        assert marker["dtype"] == "bfloat16"
        assert embedded.gguf_ready(role, cache)  # the joined file stays: the llama.cpp engine runs it
        assert embedded.gguf_file(role, cache).read_bytes() == data[role]
    assert sorted(p.name for p in cache.iterdir()) == [".lock", "gguf", "models"]
    assert sorted(p.name for p in (cache / "models").iterdir()) == ["assistant", "target"]


def test_prepare_skips_ready_roles_quickly(fake_roles, tmp_path, monkeypatch):
    monkeypatch.setattr(embedded, "_export_bf16", FakeExport())
    cache = tmp_path / "cache"
    embedded.prepare(cache, progress=False, log=quiet)

    def must_not_run(*_args, **_kwargs):
        raise AssertionError("ready roles must not be located, joined or converted again")

    monkeypatch.setattr(embedded, "_export_bf16", must_not_run)
    monkeypatch.setattr(embedded, "locate_parts", must_not_run)
    monkeypatch.setattr(wheels.hashlib, "sha256", must_not_run)  # "quickly": stats only, nothing is hashed again
    folders = embedded.prepare(cache, progress=False, log=quiet)
    assert all(embedded.is_ready(f, r) for r, f in folders.items())


@pytest.mark.parametrize("failure", [KeyboardInterrupt(), RuntimeError("boom")])
def test_interrupted_conversion_leaves_nothing_ready(fake_roles, tmp_path, monkeypatch, failure):
    cache = tmp_path / "cache"
    monkeypatch.setattr(embedded, "_export_bf16", FakeExport(fail_with=failure))
    with pytest.raises(type(failure)):
        embedded.prepare(cache, progress=False, log=quiet)

    assert not (cache / "models" / "target").exists()
    assert not embedded.is_ready(cache / "models" / "target", "target")
    assert list(cache.glob(".tmp-*")) == []  # cleaned up on the way out
    assert list((cache / "gguf").glob("*.partial")) == []  # no half-written file either
    assert embedded.gguf_ready("target", cache)  # the verified join is kept and reused, not redone

    monkeypatch.setattr(embedded, "_export_bf16", FakeExport())
    folders = embedded.prepare(cache, progress=False, log=quiet)
    assert all(embedded.is_ready(f, r) for r, f in folders.items())


def test_hard_kill_leftovers_are_never_ready_and_get_swept(fake_roles, tmp_path, monkeypatch):
    """A SIGKILL mid-conversion leaves a .tmp-* folder (even one with a marker) and a GGUF."""
    table, _ = fake_roles
    cache = tmp_path / "cache"
    monkeypatch.setattr(embedded, "_export_bf16", FakeExport())
    stale = cache / ".tmp-target-dead"
    stale.mkdir(parents=True)
    embedded._export_bf16(Path(__file__), stale)
    embedded._write_marker(stale, {"role": "target", "source_sha256": table["target"].sha256})
    (cache / "gguf").mkdir()
    (cache / "gguf" / "target.gguf.partial").write_bytes(b"half")
    other = cache / "gguf" / f"assistant-q4_0-abc.gguf.{os.getpid()}.partial"  # a living process's, in progress
    other.write_bytes(b"busy")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = cache / "gguf" / f"assistant-q4_0-def.gguf.{gone.stdout.strip()}.partial"  # its process was killed
    orphan.write_bytes(b"half")
    assert embedded.is_ready(stale, "target")  # complete by itself, but not where anyone looks
    assert not embedded.is_ready(cache / "models" / "target", "target")

    logs: list[str] = []
    embedded.prepare(cache, progress=False, log=logs.append)
    assert not stale.exists() and not (cache / "gguf" / "target.gguf.partial").exists()
    assert other.exists() and not orphan.exists()  # another process's leftovers only once it is gone
    assert any(".tmp-target-dead" in line for line in logs)
    assert embedded.is_ready(cache / "models" / "target", "target")


def test_prepare_gguf_joins_once_and_rejoins_a_damaged_file(fake_roles, tmp_path, monkeypatch):
    table, data = fake_roles
    cache = tmp_path / "cache"
    files = embedded.prepare_gguf(cache, progress=False, log=quiet)
    assert {r: f.read_bytes() for r, f in files.items()} == data
    assert all(embedded.gguf_ready(r, cache) for r in table)
    join = embedded.join_parts
    monkeypatch.setattr(embedded, "join_parts", lambda *a, **k: pytest.fail("joined again"))
    assert embedded.prepare_gguf(cache, progress=False, log=quiet) == files  # a stat and a marker read
    monkeypatch.setattr(embedded, "join_parts", join)
    with open(files["target"], "ab") as f:
        f.write(b"x")  # grown since it was verified
    assert not embedded.gguf_ready("target", cache)
    embedded.prepare_gguf(cache, progress=False, log=quiet)
    assert files["target"].read_bytes() == data["target"] and embedded.gguf_ready("target", cache)


def test_broken_or_outdated_folder_is_not_ready_and_is_replaced(fake_roles, tmp_path, monkeypatch):
    table, _ = fake_roles
    cache = tmp_path / "cache"
    monkeypatch.setattr(embedded, "_export_bf16", FakeExport())
    embedded.prepare(cache, progress=False, log=quiet)
    target = cache / "models" / "target"

    (target / "model.safetensors").write_bytes(b"short")  # truncated weights
    assert not embedded.is_ready(target, "target")
    embedded.prepare(cache, progress=False, log=quiet)
    assert embedded.is_ready(target, "target")

    changed = {**table, "target": ModelSpec(**{**table["target"].__dict__, "sha256": "0" * 64})}
    assert not embedded.is_ready(target, "target", table=changed)  # a different source GGUF
    (target / embedded.MARKER_NAME).write_text("{not json")
    assert not embedded.is_ready(target, "target")


def test_concurrent_prepare_waits_for_the_lock(fake_roles, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    export = FakeExport()
    monkeypatch.setattr(embedded, "_export_bf16", export)
    logs: list[str] = []
    errors: list[BaseException] = []

    waiting = threading.Event()

    def log(line: str) -> None:
        logs.append(line)
        if "waiting" in line:
            waiting.set()

    def run():
        try:
            embedded.prepare(cache, progress=False, log=log)
        except BaseException as exc:  # surface failures in the main thread
            errors.append(exc)

    with embedded._locked(cache, quiet):  # another "process" is busy converting
        worker = threading.Thread(target=run)
        worker.start()
        assert waiting.wait(timeout=120), "prepare never reached the busy lock"  # an event, whatever the speed
        assert worker.is_alive() and export.calls == []
    worker.join(timeout=120)
    assert not errors and len(export.calls) == 2


# --------------------------------------------------------------------------- status & helpers


def test_status_and_preflight_check_of_all_packages(site, tmp_path, monkeypatch):
    target, _ = make_role(site, "target", 3, skip=(2,))
    assistant, _ = make_role(site, "assistant", 2)
    monkeypatch.setattr(wheels, "ROLES", {"target": target, "assistant": assistant})
    export = FakeExport()
    monkeypatch.setattr(embedded, "_export_bf16", export)
    cache = tmp_path / "cache"

    before = embedded.status(cache)
    assert before["target"]["packages_installed"] is False
    assert before["target"]["missing_packages"] == [f"{target.dist_prefix}2==0.1"]
    assert before["assistant"]["packages_installed"] is True
    assert before["assistant"]["ready"] is False and before["assistant"]["size_bytes"] == 0

    # Every role's packages are checked before any slow work starts.
    with pytest.raises(EmbeddedError, match=f"{target.dist_prefix}2==0.1"):
        embedded.prepare(cache, progress=False, log=quiet)
    assert export.calls == []

    install_fake_dist(site, f"{target.dist_prefix}2", f"{target.module_prefix}2", 2, b"<target part 2>" * 5)
    embedded.prepare(cache, progress=False, log=quiet)
    after = embedded.status(cache)
    for role in ("target", "assistant"):
        assert after[role]["ready"] and after[role]["packages_installed"]
        assert after[role]["path"] == cache / "models" / role
        assert after[role]["size_bytes"] == embedded.dir_size(cache / "models" / role) > 0


def test_a_conversion_in_the_old_layout_is_adopted_not_redone(fake_roles, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setattr(embedded, "_export_bf16", FakeExport())
    embedded.prepare(cache, progress=False, log=quiet)
    for role in ("target", "assistant"):  # where a cache made before the one layout kept them
        (cache / "models" / role).rename(cache / role)
    monkeypatch.setattr(embedded, "_export_bf16", lambda *a: pytest.fail("converted again"))
    folders = embedded.prepare(cache, progress=False, log=quiet)
    assert all(embedded.is_ready(folders[role], role) for role in ("target", "assistant"))
    assert not (cache / "target").exists() and folders["target"] == cache / "models" / "target"


def test_cache_dir_default_and_dir_size(tmp_path, monkeypatch):
    monkeypatch.setenv("DISCO_CACHE", str(tmp_path / "c"))
    assert cache.root() == tmp_path / "c" and embedded.model_dir("target") == tmp_path / "c" / "models" / "target"
    monkeypatch.delenv("DISCO_CACHE")
    assert cache.root() == Path.home() / ".cache" / "disco"
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "a").write_bytes(b"123")
    (tmp_path / "d" / "e" / "b").write_bytes(b"45")
    assert embedded.dir_size(tmp_path / "d") == 5
    assert embedded.dir_size(tmp_path / "missing") == 0


# --------------------------------------------------------------------------- errors with advice


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_part_names_only_its_package(fake_roles, tmp_path, monkeypatch, damage):
    table, _ = fake_roles
    monkeypatch.setattr(embedded, "_export_bf16", FakeExport())
    part = embedded.locate_parts("target")[4]
    raw = bytearray(part.read_bytes())
    if damage == "flip":
        raw[3] ^= 0xFF
    else:
        raw = raw[:-1]
    part.write_bytes(raw)
    with pytest.raises(EmbeddedError) as err:
        embedded.prepare(tmp_path / "cache", progress=False, log=quiet)
    message = str(err.value)
    spec = table["target"]
    assert spec.dists[4] in message and "--force-reinstall " + spec.pip_spec(spec.dists[4]) in message
    assert spec.dists[3] not in message and spec.dists[5] not in message
    assert embedded.damaged_parts(spec, embedded.locate_parts("target"), hashes=True) == [spec.dists[4]]


@pytest.mark.parametrize("error,needle", [
    (OSError(errno.ENOSPC, "No space left on device", "/c/gguf/target.gguf.partial"), "the disk is full"),
    (PermissionError(errno.EACCES, "Permission denied", "/c/.lock"), "cannot write the model cache"),
    (OSError(errno.EROFS, "Read-only file system", "/c/.lock"), "cannot write the model cache"),
])
def test_cache_errors_name_the_path_and_disco_cache(fake_roles, tmp_path, monkeypatch, error, needle):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(embedded, "join_parts", fail)
    with pytest.raises(EmbeddedError) as err:
        embedded.prepare(tmp_path / "cache", progress=False, log=quiet)
    message = str(err.value)
    assert needle in message and "DISCO_CACHE" in message and error.filename in message
    assert str(tmp_path / "cache") in message and "\n" not in message
