"""`python -m disco train` on the tiny pair: a loadable JSON the disco lanes run on, and clear refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from disco.policies.classifier import FEATURES, ClassifierWeights, Disco
from disco.policies import AUTOREGRESSIVE, Autoregressive
from disco.replay.run import replay_many
from disco.replay.tables import ReplayTable, cached_table_paths
from disco.suites import Selection, pick, split_of
from disco.bench.train import samples

ROOT = Path(__file__).resolve().parents[2]


def _train(*args):
    return subprocess.run([sys.executable, "-m", "disco", "train", "--models", "tiny", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("train")
    out = tmp / "clf.json"
    done = _train("--max-new-tokens", "16", "--kmax", "5", "--prompts", "code", "--cost-profile", "flat:0.05",
                  "--cache-dir", str(tmp / "tables"), "--out", str(out))
    assert done.returncode == 0, done.stderr
    return out, tmp / "tables", done.stderr


@pytest.mark.slow  # out of the fast tier (./test.sh -m fast): a real process or a long run
def test_train_writes_weights_that_load_with_their_test_split_metrics(trained):
    out, _, log = trained
    data = json.loads(out.read_text())  # plain JSON, not a pickle
    weights = ClassifierWeights.load(out)
    assert len(weights.coef) == len(FEATURES) and 0 <= weights.threshold <= 1
    meta = weights.meta
    which = split_of(pick(Selection()).prompts)
    assert meta["train_prompts"] and meta["test_prompts"]
    assert all(which[p] == "train" for p in meta["train_prompts"]) and all(which[p] == "test" for p in meta["test_prompts"])
    assert meta["test"]["samples"] > 0 and 0 <= meta["test"]["roc_auc"] <= 1
    assert meta["cost_profile"] == "flat:0.05" and data["meta"]["kmax"] == 5
    # the chosen threshold is the best of the train-split replay search, and the log says so
    search = meta["threshold_search"]
    assert search[format(weights.threshold, "g")] == max(search.values())
    assert f"stop threshold {weights.threshold:g}" in log


def test_disco_lane_on_the_trained_weights_is_lossless_in_replay(trained):
    out, tables, _ = trained
    weights = ClassifierWeights.load(out)
    paths = cached_table_paths(tables, "code-csv-parse")
    assert paths
    table = ReplayTable.from_dict(json.loads(paths[0].read_text()), paths[0])
    res = replay_many(table, [Autoregressive(), Disco("disco:5", weights=weights, k=5)], 16)
    assert res["disco:5"].output_ids == res[AUTOREGRESSIVE].output_ids
    xs, ys = samples(table, 16, 5)
    assert len(xs) == len(ys) > 0 and set(ys) <= {0, 1} and all(len(x) == len(FEATURES) for x in xs)


@pytest.mark.parametrize("args,needle", [
    (["--kmax", "0"], "--kmax must be between 1 and 64"),
    (["--prompts", "code-binary-search"], "no train-split prompt"),
    (["--cost-profile", "flat:x"], "C must be a number"),
    (["--out", "/nonexistent-dir/clf.json"], "cannot write"),
])
def test_bad_train_arguments_are_one_line_and_exit_2(args, needle):
    done = _train(*args)
    assert done.returncode == 2
    assert needle in done.stderr and len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
