"""The Sweep tab's engine (``sweep_service.sweep``) and its endpoint: growing results, exact replay, Stop."""

from __future__ import annotations

import pandas as pd
import pytest

from disco import suites
from disco.bench import sweep as sweep_service
from disco.app import sweep_tab
from disco.errors import BenchError, UserError
from disco.limits import upload_limit
from disco.decode.settings import DecodeSettings
from disco.decode.race import run_all
from disco.policies import parse_strategy

SPECS = ["static:2", "threshold:0.4:6", "oracle:6"]
GRID = [parse_strategy(s) for s in SPECS]
MAX_NEW = 12


@pytest.fixture(scope="module")
def prompts():
    return suites.pick_prompts(list(suites.pick(suites.Selection()).prompts), 2)


def test_sweep_grows_one_prompt_at_a_time_and_matches_real_decoding(tiny_pair, prompts, tmp_path):
    updates = list(sweep_service.sweep(tiny_pair, prompts, GRID, MAX_NEW, tmp_path))
    assert [u.done for u in updates] == [1, 2] and all(u.total == 2 for u in updates)
    runs = updates[-1].runs
    assert len(runs) == 2 * (1 + len(SPECS))  # the autoregressive baseline is always replayed
    assert set(runs["strategy"]) == {"autoregressive", *SPECS}
    assert runs["identical_to_autoregressive"].astype(bool).all()
    summary = updates[-1].summary
    assert set(summary["strategy"]) >= {"autoregressive", *SPECS}
    # replay is exact: the passes it counts are the ones the engine makes on the same prompt
    p = prompts[0]
    real = run_all(tiny_pair, p.prompt, SPECS, DecodeSettings(max_new_tokens=MAX_NEW), chat=p.chat)
    for d in real.decoders:
        row = runs[(runs["prompt_id"] == p.id) & (runs["strategy"] == d.strategy)].iloc[0]
        assert row["iterations"] == len(d.records) == row["target_passes"], d.strategy
        assert row["new_tokens"] == len(d.output_ids), d.strategy


@pytest.mark.parametrize("when", ["first", "second"])
def test_stop_drops_the_prompt_in_progress_and_keeps_completed_ones(tiny_pair, prompts, tmp_path, when):
    state = {"done": 0}

    def should_stop():  # fires as soon as the chosen prompt has started
        return state["done"] >= (0 if when == "first" else 1)

    updates = []
    for update in sweep_service.sweep(tiny_pair, prompts, GRID, MAX_NEW, tmp_path, should_stop=should_stop):
        updates.append(update)
        state["done"] = update.done
    expected = 0 if when == "first" else 1
    assert len(updates) == expected
    if updates:
        assert set(updates[-1].runs["prompt_id"]) == {prompts[0].id}
    # the dropped prompt left no table behind; a later sweep computes it afresh and completes
    tables = [f for f in tmp_path.glob("*.json") if f.name.startswith(tuple(p.id for p in prompts))]
    assert len(tables) == expected
    again = list(sweep_service.sweep(tiny_pair, prompts, GRID, MAX_NEW, tmp_path))
    assert again[-1].done == 2


def test_grid_text_is_checked():
    assert [p.spec for p in sweep_tab.grid_policies("1, 3", "0.4", "20", heuristic=False, oracle=False)] == \
        ["autoregressive", "static:1", "static:3", "threshold:0.4:20"]
    for bad in (("x", "0.4", "20"), ("1", "1.5", "20"), ("1", "", "20"), ("1", "0.4", "0")):
        with pytest.raises(BenchError):
            sweep_tab.grid_policies(*bad, heuristic=False, oracle=False)


def test_sweep_endpoint_returns_the_heatmap_table_and_csv(prompts, tmp_path, monkeypatch, serve_app):
    from gradio_client import Client

    import app

    monkeypatch.setenv("DISCO_CACHE", str(tmp_path))
    with serve_app(app.build_demo("tiny")) as url:
        client = Client(url, verbose=False)
        result = client.predict([p.id for p in prompts], "1,3", "0.3,0.6", "4,8", True, False, 16, api_name="/sweep")
        bad = client.predict([p.id for p in prompts], "1", "2.0", "4", False, False, 16, api_name="/sweep")
        # the cost profile menu: the same grid re-costed from the cached tables, nothing decoded again
        flat = client.predict([p.id for p in prompts], "1,3", "0.3,0.6", "4,8", True, False, 16, "flat:0.05", None,
                              api_name="/sweep")
        bad_profiles = [client.predict([prompts[0].id], "1", "0.4", "4", False, False, 16, text, None,
                                       api_name="/sweep")[0] for text in ("gpu", "flat:x", "/etc/hosts.csv")]
    status, csv_path = result[0], result[5]
    assert "2/2 prompts replayed" in status and "for transformers, llama.cpp and vLLM" in status
    runs = pd.read_csv(csv_path)
    assert set(runs["prompt_id"]) == {p.id for p in prompts}
    assert {"static:1", "static:3", "heuristic:5", "threshold:0.3:4", "threshold:0.6:8"} <= set(runs["strategy"])
    assert "⚠" in bad[0] and "outside" in bad[0]
    assert "flat:0.05" in flat[0] and "2/2 prompts replayed" in flat[0]
    recosted = pd.read_csv(flat[5])
    merged = runs.merge(recosted, on=["prompt_id", "strategy"], suffixes=("", "_flat"))
    assert len(merged) == len(runs)
    fixed = ~merged["strategy"].str.startswith(("costaware", "disco"))  # these rules read the profile: their passes may move
    assert (merged[fixed]["target_passes"] == merged[fixed]["target_passes_flat"]).all()
    step = merged[merged["strategy"] == "autoregressive"].set_index("prompt_id")["seconds_flat"] / \
        merged[merged["strategy"] == "autoregressive"].set_index("prompt_id")["target_passes"]
    for _, row in merged.iterrows():
        expected = step[row["prompt_id"]] * (row["target_passes_flat"] + 0.05 * row["assistant_passes_flat"])
        assert row["seconds_flat"] == pytest.approx(expected, rel=1e-6)
    assert all(text.startswith("⚠") for text in bad_profiles), bad_profiles
    assert "unknown cost profile" in bad_profiles[0] and "C must be a number" in bad_profiles[1]
    assert "upload a CSV" in bad_profiles[2]


def test_profile_choice_prefers_an_uploaded_csv_and_refuses_typed_paths(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("role,precision,kind,tokens,ms\ntarget,bf16,step,1,3\nassistant,model,step,1,1\n")
    assert sweep_tab.profile_choice("flat:0.4", str(path)) == str(path)
    assert sweep_tab.profile_choice("flat:.4", None) == "flat:0.4"
    assert sweep_tab.profile_choice(None, None) == "measured"
    with pytest.raises(BenchError, match="upload a CSV"):
        sweep_tab.profile_choice(str(path), None)


def _questions(path):
    rows = [{"question_id": i, "category": kind, "turns": [f"{kind} question {i}"]}
            for i, kind in enumerate(["writing", "writing", "qa", "qa", "qa"])]
    path.write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    return path


def test_the_sweep_picks_ticked_prompts_or_a_stratified_sample(tmp_path):
    from disco.app import sweep_suites

    suite = sweep_suites.load(sweep_suites.UPLOAD, str(_questions(tmp_path / "q.jsonl")))
    assert [p.id for p in sweep_suites.picked(suite, ["2", "0"], 0, 0)] == ["2", "0"]
    sample = sweep_suites.picked(suite, [], 2, 5)
    assert sorted(p.kind for p in sample) == ["qa", "writing"] and all(p.split for p in sample)
    assert sweep_suites.default_ticks(suite) == ["0", "2"]
    cases = [(([], 0, 0), "pick at least one"), ((["9"], 0, 0), "unknown prompt '9'"), ((["0"], -1, 0), "sample size"),
             ((["0"], 2, -3), "sample seed"), ((["0"], "x", 0), "must be a number")]
    for args, needle in cases:
        with pytest.raises(UserError, match=needle):
            sweep_suites.picked(suite, *args)
    humaneval = sweep_suites.load(sweep_suites.HUMANEVAL, None)
    assert len(humaneval.prompts) == 164 and len(sweep_suites.choices(humaneval)) == 164
    with pytest.raises(BenchError, match="upload a suite file first"):
        sweep_suites.load(sweep_suites.UPLOAD, None)
    big = tmp_path / "big.jsonl"
    big.write_bytes(b" " * (upload_limit() + 1))
    with pytest.raises(BenchError, match="MB; at most"):
        sweep_suites.load(sweep_suites.UPLOAD, str(big))


def test_the_sweep_endpoint_replays_an_uploaded_benchmark_and_answers_per_kind(tmp_path, monkeypatch, serve_app):
    from gradio_client import Client, handle_file

    import app
    from disco.app import sweep_suites

    monkeypatch.setenv("DISCO_CACHE", str(tmp_path / "cache"))
    path = _questions(tmp_path / "question.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    with serve_app(app.build_demo("tiny")) as url:
        client = Client(url, verbose=False)
        result = client.predict([], "1,2", "0.4", "4", False, False, 8, "flat:0.05", None, [], sweep_suites.UPLOAD,
                                handle_file(str(path)), 2, 0, api_name="/sweep")
        refused = client.predict([], "1", "0.4", "4", False, False, 8, "flat:0.05", None, [], sweep_suites.UPLOAD,
                                 handle_file(str(bad)), 0, 0, api_name="/sweep")[0]
    status, csv_file, kinds = result[0], result[5], result[6]  # the API leaves the State out of its outputs
    assert "2/2 prompts replayed" in status
    runs = pd.read_csv(csv_file, dtype={"prompt_id": str})
    assert sorted(runs.drop_duplicates("prompt_id")["kind"]) == ["qa", "writing"]
    table = pd.DataFrame(kinds["data"], columns=kinds["headers"])
    assert list(table["kind"]) == ["all", "writing", "qa"] or list(table["kind"]) == ["all", "qa", "writing"]
    assert refused.startswith("⚠") and "line 1 is not JSON" in refused and "\n" not in refused
