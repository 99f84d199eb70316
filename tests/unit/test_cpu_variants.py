"""One llama.cpp build, each CPU's kernels (``disco.models.cpu_variant``): which variant is chosen and how one is
named, that the choice reaches every key a variant's rows are filed under and llama.cpp's own programs, and that
exact mode keeps every verified row the one-token row on every variant this CPU runs (each in its own process)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import variant_rows  # tests/ is on the path
from disco.models import cpu_variant
from disco.models.cpu_variant import Variant, VariantError, built, choose


def fake(**scores) -> list[Variant]:
    return sorted((Variant(name, f"/x/libggml-cpu-{name}.so", s) for name, s in scores.items()),
                  key=lambda v: (-v.score, v.name))


def test_the_best_scoring_variant_this_cpu_runs_is_chosen_and_amx_only_by_name():
    found = fake(x64=1, haswell=50, zen4=300, sapphirerapids=900, alderlake=0)
    assert choose(found).name == "zen4"  # sapphirerapids scores higher but is opt-in
    assert choose(found, "sapphirerapids").name == "sapphirerapids"
    assert choose(found, "haswell").name == "haswell"


@pytest.mark.parametrize("wanted,says", [("alderlake", "needs instructions this CPU lacks"),
                                          ("power9", "is not built here")])
def test_a_named_variant_that_cannot_run_is_one_line(wanted, says):
    with pytest.raises(VariantError) as err:
        choose(fake(x64=1, haswell=50, alderlake=0), wanted)
    text = str(err.value)
    assert says in text and "DISCO_LLAMA_CPU_VARIANT" in text and "haswell" in text and "\n" not in text


def test_no_runnable_variant_is_an_error_and_no_variants_is_a_linked_build():
    with pytest.raises(VariantError, match="none of"):
        choose(fake(zen4=0, sapphirerapids=0))
    assert choose([]) is None
    with pytest.raises(VariantError, match="one CPU backend linked in"):
        choose([], "haswell")


def test_only_variant_modules_are_read_from_the_library_folder(tmp_path):
    for name in ["libggml-cpu-haswell.so", "libggml-cpu-zen4.so", "libggml-cpu.so", "libggml-base.so",
                 "libggml-cpu-haswell.so.0", "libllama.so"]:
        (tmp_path / name).write_bytes(b"")
    scores = {"haswell": 50, "zen4": 300}
    found = built(tmp_path, score=lambda path: scores[Path(path).name[len("libggml-cpu-"):-3]])
    assert [(v.name, v.score) for v in found] == [("zen4", 300), ("haswell", 50)]
    assert built(tmp_path / "missing", score=lambda path: 1) == []


def test_an_unloadable_module_scores_zero_and_is_logged(tmp_path, caplog):
    (tmp_path / "libggml-cpu-broken.so").write_bytes(b"not an ELF file")
    found = built(tmp_path)  # the real scorer: dlopen fails
    assert found == [Variant("broken", str(tmp_path / "libggml-cpu-broken.so"), 0)]
    assert "does not load here" in caplog.text


def test_programs_are_given_the_variant_this_process_runs(monkeypatch):
    monkeypatch.setattr(cpu_variant, "_LOADED", Variant("zen4", "/lib/libggml-cpu-zen4.so", 300))
    assert cpu_variant.child_env({"A": "1"}) == {"A": "1", "GGML_BACKEND_PATH": "/lib/libggml-cpu-zen4.so"}
    monkeypatch.setattr(cpu_variant, "_LOADED", None)
    assert cpu_variant.child_env({"A": "1"}) == {"A": "1"}


def test_a_variant_keys_tables_apart_and_a_linked_build_keeps_its_keys():
    from disco.models.pair import pair_key

    class Pair:
        def __init__(self, **extra):
            self.info = {"models": "m", "target": "t", "assistant": "a", "engine": "llamacpp", "exact": True, **extra}

        def describe(self):
            return self.info

    assert pair_key(Pair()) == pair_key(Pair(cpu_variant=None))  # the keys of builds without variants are unchanged
    assert len({pair_key(Pair()), pair_key(Pair(cpu_variant="zen4")), pair_key(Pair(cpu_variant="haswell"))}) == 3


class FakeGgml:
    """libggml's registry as ``_ensure_a_backend`` sees it: how many backends after each load."""

    def __init__(self, counts_after_load):
        self.count, self.after, self.loaded_from = 0, counts_after_load, None
        self.ggml_backend_reg_count = lambda: self.count

        def load_all(path):
            self.loaded_from, self.count = path, self.after

        self.ggml_backend_load_all_from_path = load_all  # a function, as ctypes' are: restype/argtypes can be set


@pytest.mark.parametrize("after", [1, 0])
def test_a_build_without_variant_modules_still_gets_a_backend_or_says_why(monkeypatch, tmp_path, after):
    fake_ggml = FakeGgml(after)
    monkeypatch.setattr(cpu_variant, "_ggml_of_libllama", lambda: fake_ggml)
    monkeypatch.setattr(cpu_variant, "_LOADED", None)
    if after:
        assert cpu_variant.load(tmp_path) is None and fake_ggml.loaded_from == str(tmp_path).encode()
    else:
        with pytest.raises(VariantError, match="no CPU backend"):
            cpu_variant.load(tmp_path)


def test_a_linked_backend_needs_nothing_loaded(monkeypatch, tmp_path):
    fake_ggml = FakeGgml(5)
    fake_ggml.count = 1  # the CPU backend linked into libggml registers itself
    monkeypatch.setattr(cpu_variant, "_ggml_of_libllama", lambda: fake_ggml)
    monkeypatch.setattr(cpu_variant, "_LOADED", None)
    assert cpu_variant.load(tmp_path) is None and fake_ggml.loaded_from is None


def test_pricing_every_variant_leaves_amx_out_unless_it_runs(monkeypatch):
    from disco.models import llama

    found = fake(zen4=300, haswell=50, sapphirerapids=900, alderlake=0)
    by_name = {v.name: v for v in found}
    monkeypatch.setattr(cpu_variant, "built", lambda libdir: found)
    monkeypatch.setattr(llama, "kernels", lambda: cpu_variant.loaded().name)
    monkeypatch.setattr(cpu_variant, "_LOADED", by_name["zen4"])
    assert [v.name for v in llama.runnable_variants()] == ["zen4", "haswell"]
    monkeypatch.setattr(cpu_variant, "_LOADED", by_name["sapphirerapids"])
    assert [v.name for v in llama.runnable_variants()] == ["sapphirerapids", "zen4", "haswell"]


# ---- the real build (where it has variants) ----

def test_this_process_runs_the_best_default_variant_and_says_so():
    llama = variant_rows.require_variants()
    from disco.models.keys import machine_key

    libdir = Path(cpu_variant.loaded().path).parent
    runnable = cpu_variant.runnable(with_opt_in=True)
    assert "x64" in {v.name for v in runnable}  # every x86-64 CPU runs it
    named = os.environ.get("DISCO_LLAMA_CPU_VARIANT")
    expected = named or choose(built(libdir)).name
    assert llama.kernels() == expected and (named or expected not in cpu_variant.OPT_IN)
    assert machine_key("m", "cpu", "llamacpp")["cpu_variant"] == expected


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    import tiny_gguf

    target, _ = tiny_gguf.write_pair(tmp_path_factory.mktemp("variant-gguf"), "Q8_0")
    return target


@pytest.mark.parametrize("variant", variant_rows.runnable())
def test_exact_rows_are_the_one_token_rows_on_every_variant(variant, tiny_target):
    variant_rows.require_variants()
    result = variant_rows.run_on(variant, tiny_target)
    assert result["kernels"] == variant
    assert all(result["equal"].values()), result
