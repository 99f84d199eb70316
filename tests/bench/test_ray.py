"""Replay tables built on a Ray cluster (``disco.tables.cluster``, the table phase's executor
``disco.tables.workers.OnRay``), on a real two-node Ray cluster in this process (``ray.cluster_utils.Cluster``: two
raylets of one CPU each) with the tiny pair: the same bytes as a sequential build, the build's only result the cache
(the phase reads the tables back, naming the worker that built each), resumable, a worker that dies mid-question
replaced and the question built elsewhere, one line when the cluster cannot be reached or no worker can load the
pair; and the commands' ``--ray``. Ray is installed by the test
command (requirements-ray.txt), so these run in CI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
import ray
from ray.cluster_utils import Cluster

from disco import cli, suites
from disco.errors import BenchError
from disco.tables import cluster as ray_tables
from disco.tables.fitting import Fitting
from disco.tables.identity import PairSpec
from disco.tables.phase import Here, TablePhase
from disco.tables.workers import OnRay, build_tables
from disco.policies import parse_strategy
from disco.policies.grids import with_baseline

MAX_NEW = 8
GRID = with_baseline([parse_strategy(s) for s in ("static:2", "threshold:0.4:4", "oracle:4", "copy:4:2")])
QUESTIONS = [
    {"question_id": 81, "category": "writing", "turns": ["Write a short poem.", "Now make it rhyme."]},
    {"question_id": 82, "category": "writing", "turns": ["Describe a cat."]},
    {"question_id": 101, "category": "translation", "turns": ["Translate to German: good morning."]},
]


@pytest.fixture(scope="module")
def two_nodes():
    """A Ray cluster of two nodes with one CPU each; the tests connect to it as a user connects to theirs."""
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 100 * 1024 ** 2,
                                                           "include_dashboard": False,
                                                           "_system_config": {"worker_niceness": 0}})
    cluster.add_node(num_cpus=1, object_store_memory=100 * 1024 ** 2)
    yield cluster.address
    if ray.is_initialized():
        ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("suite") / "question.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return suites.pick(suites.Selection(str(path), suites.SuiteOptions(turns="all"))).prompts


def sequential(tiny_pair, prompts, folder: Path) -> dict[str, bytes]:
    TablePhase(PairSpec("tiny"), Fitting(), folder, MAX_NEW, Here(tiny_pair, progress=False)).ensure(prompts, GRID)
    return files(folder)


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.json"))}


class Built:
    """A cluster build through the table phase: what it cost (``run``), where each prompt was built (``built``: the
    phase's record, by prompt id) and the tables the phase read back from the cache (``found``)."""

    def __init__(self, run, built: dict, found):
        self.run, self.built, self.found = run, built, found


def build(address, prompts, folder, log=None, **config) -> Built:
    cfg = ray_tables.ClusterConfig(address, threads=1, **config)
    phase = TablePhase(PairSpec("tiny"), Fitting(), folder, MAX_NEW)
    ray = OnRay(cfg, progress=False, log_line=(log.append if log is not None else lambda line: None))
    found = phase.using(ray).ensure(prompts, GRID)
    return Built(ray.run, phase.built, found)


def test_tables_from_two_nodes_are_the_bytes_of_a_sequential_build_and_resume(two_nodes, prompts, tiny_pair, tmp_path):
    expected = sequential(tiny_pair, prompts, tmp_path / "sequential")
    assert len(expected) == len(prompts)  # one table per turn; the multi-turn question's first turn included
    first = build(two_nodes, prompts, tmp_path / "cluster")
    assert files(tmp_path / "cluster") == expected
    run = first.run
    assert run.workers == 2 and run.cached == 0 and len(first.built) == len(prompts)
    assert len({r["built_by"] for r in first.built.values()}) == 2  # both workers, one on each node, built questions
    summary = run.summary()
    assert summary["prompts_built"] == len(prompts) and summary["overhead_seconds_per_question_median"] >= 0
    # the build's only result is the cache: the phase reads every table back, its row naming the worker
    assert not first.found.missing and set(first.found.tables) == {p.id for p in prompts}
    assert all(r["built_by"].startswith("ray:") and r["unit_seconds"] > 0 for r in first.found.rows)
    # resumable: nothing is sent again ...
    log = []
    again = build(two_nodes, prompts, tmp_path / "cluster", log)
    assert again.run.cached == len(prompts) and not again.built and "nothing to send" in log[0]
    assert {r["built_by"] for r in again.found.rows} == {"cache"}
    # ... but a lost table is, with its question (the later turn needs its first turn's answer)
    lost = next(n for n in expected if n.startswith("81-t2-"))
    (tmp_path / "cluster" / lost).unlink()
    third = build(two_nodes, prompts, tmp_path / "cluster")
    assert set(third.built) == {"81-t1", "81-t2"} and third.run.cached == len(prompts) - 2
    assert files(tmp_path / "cluster") == expected


def test_a_table_missing_chains_is_extended_as_a_sequential_build_extends_it(two_nodes, prompts, tiny_pair, tmp_path):
    full = sequential(tiny_pair, prompts, tmp_path / "full")
    name = next(n for n in full if n.startswith("82-t1-"))
    partial = json.loads(full[name])
    partial["chains"] = dict(list(partial["chains"].items())[:2])
    for folder in ("cluster", "here"):
        (tmp_path / folder).mkdir()
        for other, data in full.items():
            (tmp_path / folder / other).write_bytes(json.dumps(partial).encode() if other == name else data)
    run = build(two_nodes, prompts, tmp_path / "cluster")
    assert list(run.built) == ["82-t1"]
    assert files(tmp_path / "cluster") == sequential(tiny_pair, prompts, tmp_path / "here")


def test_a_worker_that_dies_mid_question_is_replaced_and_the_question_built_elsewhere(two_nodes, prompts, tiny_pair,
                                                                                      tmp_path):
    marker = tmp_path / "died-once"

    def crash_once():  # runs in every worker process (Ray's worker_process_setup_hook); pickled by value
        import os as _os

        from disco.tables import build as table_build

        real = table_build.prepare

        def prepare(pair, prompt, *args, **kwargs):
            if prompt.id == "101" or prompt.id == "101-t1":
                try:
                    fd = _os.open(str(marker), _os.O_CREAT | _os.O_EXCL)
                except FileExistsError:
                    return real(pair, prompt, *args, **kwargs)
                _os.close(fd)
                _os._exit(1)  # the worker process dies in the middle of the question
            return real(pair, prompt, *args, **kwargs)

        table_build.prepare = prepare

    log = []
    run = build(two_nodes, prompts, tmp_path / "cluster", log, runtime_env={"worker_process_setup_hook": crash_once})
    assert marker.exists(), "the fault was never injected"
    assert any("died while building 101" in line for line in log), log
    assert files(tmp_path / "cluster") == sequential(tiny_pair, prompts, tmp_path / "sequential")
    assert set(run.built) == {p.id for p in prompts}


def test_no_worker_can_load_the_pair_is_one_line(two_nodes, prompts, tmp_path):
    cfg = ray_tables.ClusterConfig(two_nodes, threads=1)
    phase = TablePhase(PairSpec(f"{tmp_path}/no-target::{tmp_path}/no-assistant"), Fitting(), tmp_path, MAX_NEW)
    log = []
    with pytest.raises(BenchError) as err:
        build_tables(cfg, phase, prompts, GRID, progress=False, log_line=log.append)
    assert "no Ray worker could load" in str(err.value) and "not found" in str(err.value)
    assert "\n" not in str(err.value) and not list(tmp_path.glob("*.json"))


def test_an_unreachable_cluster_or_a_missing_ray_is_one_line(prompts, tmp_path, monkeypatch):
    with pytest.raises(BenchError, match="cannot reach the Ray cluster at '127.0.0.1:1'"):
        build("127.0.0.1:1", prompts, tmp_path)
    monkeypatch.setitem(__import__("sys").modules, "ray", None)
    with pytest.raises(BenchError, match="requirements-ray.txt"):
        ray_tables.ray_module()


def test_bench_train_and_sampling_take_ray(two_nodes, tmp_path, capsys):
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    out = tmp_path / "out"
    common = ["--models", "tiny", "--suite", str(path), "--ray", two_nodes, "--ray-threads", "1", "--no-progress"]
    assert cli.main(["bench", *common, "--mode", "replay", "--cost-profile", "flat:0.05", "--max-new-tokens", "8",
                     "--static-ks", "1,2", "--taus", "0.4", "--kmaxes", "4", "--strategy", "costaware:4",
                     "--out", str(out)]) == 0  # costaware reads the profile: the workers fill its chains under it
    table = pd.read_csv(out / "prompts.csv", dtype={"prompt_id": str})
    assert set(table["prompt_id"]) == {"81", "82", "101"} and table["built_by"].str.startswith("ray:").all()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["ray"]["prompts_built"] == 3 and meta["models_loaded"] is False  # flat costs: no model here
    text = (out / "summary.md").read_text()
    assert "## The seed's question per kind of prompt" in text and "| writing | 2 |" in text
    assert "## Each kind held out" in text and "Ray (" in text
    weights = tmp_path / "w.json"
    assert cli.main(["train", *common, "--max-new-tokens", "8", "--kmax", "4", "--cost-profile", "flat:0.05",
                     "--out", str(weights)]) == 0
    assert json.loads(weights.read_text())["model"] == "logistic_regression"
    assert "3 prompts to build" in capsys.readouterr().err  # training reads deeper chains: the cluster built them
    assert cli.main(["sampling", *common, "--max-new-tokens", "6", "--temperatures", "1", "--seeds", "1",
                     "--out", str(tmp_path / "sampling")]) == 0
    assert (tmp_path / "sampling" / "sampling.md").is_file()
    assert os.environ.get("DISCO_LLAMA_THREADS") is None  # the workers' thread count never leaks into the driver


def test_ray_local_starts_its_own_ray_with_workers_at_full_priority(two_nodes):
    """``--ray local`` starts a Ray of its own even while another one runs on this machine (the two-node cluster
    here), and its workers run at the driver's niceness, not 15 more (Ray's default: under load they starved)."""
    if ray.is_initialized():
        ray.shutdown()
    try:
        ray_tables.connect(ray_tables.ClusterConfig("local"))
        assert ray.get_runtime_context().gcs_address != two_nodes

        @ray.remote(num_cpus=1)
        def niceness():
            return os.nice(0)

        assert ray.get(niceness.remote()) == os.nice(0)  # the driver's own niceness: none added
    finally:
        ray.shutdown()
