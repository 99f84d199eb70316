"""Race figures that are the machine's (``disco.app.quiet``): each lane's live clock beside what its own iterations
cost under this machine's quiet pass costs; a race whose clocks left those costs by more than 10 % is flagged and
its headline taken from the quiet costs. Checked on a real race of the tiny pair, its clocks doctored to play a busy
machine (a browser on the same cores slows every pass by about the same time)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from disco.app import quiet
from disco.app.race_tab import _status, render
from disco.bench.peer import quiet_columns
from disco.costs.model import CostModel
from disco.decode.race import run_all
from disco.decode.settings import DecodeSettings
from disco.policies import AUTOREGRESSIVE


class Profile:
    """This machine's profile as the race reads it: per-pass costs per assistant precision."""

    def __init__(self, costs: CostModel, precision: str = "model"):
        self.costs, self.precisions, self.measured_at = costs, [precision], "2026-12-05T00:00:00"

    def cost_model(self, precision):
        return self.costs

    cost_model_near = cost_model


COSTS = CostModel([(1, 10.0), (2, 11.0), (64, 40.0)], [(1, 3.0), (2, 3.5), (64, 12.0)])


def _restamp(decoder, extra_ms_per_pass: float = 0.0):
    """The decoder's records with clocks that are exactly the quiet costs, plus ``extra_ms_per_pass`` for every pass
    (target and assistant): what a busy core does to each pass, whatever its size."""
    elapsed, out = 0.0, []
    for r in decoder.records:
        elapsed += COSTS.iteration_ms(r.target_tokens, r.draft_calls, r.assistant_tokens) \
            + extra_ms_per_pass * (1 + r.draft_calls)
        out.append(dataclasses.replace(r, elapsed_ms=elapsed))
    decoder.records[:] = out


@pytest.fixture(scope="module")
def race(tiny_pair):
    return run_all(tiny_pair, "def fib(n):", [AUTOREGRESSIVE, "static:4"], DecodeSettings(max_new_tokens=24))


def test_quiet_clocks_agree_and_a_busy_machine_is_flagged(race):
    for d in race.decoders:
        _restamp(d)
    calm = quiet.check(race.decoders, Profile(COSTS), "model")
    assert not calm.busy and all(calm.ratio(s) == pytest.approx(1.0) for s in calm.quiet_s)
    true_speedup = calm.speedup("static:4", AUTOREGRESSIVE)
    for d in race.decoders:
        _restamp(d, extra_ms_per_pass=20.0)  # every pass 20 ms longer: lanes with different passes lose differently
    busy = quiet.check(race.decoders, Profile(COSTS), "model")
    assert busy.busy and busy.worst() > quiet.TOLERANCE
    assert busy.speedup("static:4", AUTOREGRESSIVE) == pytest.approx(true_speedup)  # the quiet figure does not move
    live = busy.live_s[AUTOREGRESSIVE] / busy.live_s["static:4"]
    assert abs(live / true_speedup - 1) > 0.1  # while the live one moved, as on the page beside a browser


def test_the_headline_is_the_true_figure_and_says_which(race):
    for d in race.decoders:
        _restamp(d, extra_ms_per_pass=20.0)
    checked = quiet.check(race.decoders, Profile(COSTS), "model")
    summaries = race.summaries()
    status = _status(race, summaries, 1.0, True, [], quiet=checked)
    true = checked.speedup("static:4", AUTOREGRESSIVE)
    assert f"`static:4` **{true:.2f}×**" in status and "the machine was busy" in status and "live:" in status
    for d in race.decoders:
        _restamp(d)
    checked = quiet.check(race.decoders, Profile(COSTS), "model")
    assert "within 10 % of this machine's quiet pass costs" in _status(race, race.summaries(), 1.0, True, [],
                                                                      quiet=checked)
    assert "quiet" not in _status(race, race.summaries(), 1.0, True, [], quiet=None)  # no profile yet: live only
    for d in race.decoders:
        _restamp(d, extra_ms_per_pass=20.0)
    busy = quiet.check(race.decoders, Profile(COSTS), "model")
    out = render(race, final=True, wall=1.0, notes=[], quiet=busy)
    assert f"{busy.speedup('static:4', AUTOREGRESSIVE):.2f}× quiet" in out[1]  # the lanes' cards lead with it too
    assert quiet.check(race.decoders, None, "model") is None


def test_a_timed_benchmark_run_carries_the_same_check(race):
    d = next(d for d in race.decoders if d.strategy == "static:4")
    _restamp(d, extra_ms_per_pass=5.0)
    cols = quiet_columns(d.records, COSTS)
    assert cols["live_over_quiet"] > 1 and cols["quiet_seconds"] == pytest.approx(COSTS.records_ms(d.records) / 1000)
    assert math.isnan(quiet_columns(d.records, None)["live_over_quiet"])


def test_a_lane_whose_assistant_the_costs_did_not_measure_is_left_out(race):
    d = next(d for d in race.decoders if d.strategy == "static:4")
    costs = dataclasses.replace(COSTS, meta={"assistant_precision": "model"})
    assert not math.isnan(quiet_columns(d.records, costs, "model")["live_over_quiet"])
    assert math.isnan(quiet_columns(d.records, costs, "int8")["live_over_quiet"])  # another assistant's steps
    ar = next(d for d in race.decoders if d.strategy == AUTOREGRESSIVE)
    assert not math.isnan(quiet_columns(ar.records, costs, "int8")["live_over_quiet"])  # no drafts: target only


def test_a_timed_only_benchmark_takes_the_machine_profile_for_the_check(tmp_path, monkeypatch):
    """``bench --mode timed`` measures no costs of its own: the quiet check (and any cost-reading lane) reads this
    machine's cached profile, as a race in the app does."""
    import pandas as pd

    from disco import cli
    from disco.costs import profile as profiles

    monkeypatch.setattr(profiles, "latest", lambda models, pair, root=None: Profile(
        dataclasses.replace(COSTS, meta={"assistant_precision": "model"})))
    out = tmp_path / "timed"
    code = cli.main(["bench", "--models", "tiny", "--mode", "timed", "--timed-prompts", "1", "--max-new-tokens", "8",
                     "--timed-strategies", "autoregressive,static:3,costaware:8", "--no-peer", "--no-progress",
                     "--out", str(out)])
    assert code == 0
    runs = pd.read_csv(out / "runs.csv")
    ours = runs[(runs["mode"] == "timed") & (runs["implementation"] == "ours")]
    assert set(ours["strategy"]) == {"autoregressive", "static:3", "costaware:8"}
    assert ours["live_over_quiet"].notna().all() and (ours["live_over_quiet"] > 0).all()


def test_lanes_faster_than_the_profile_say_it_is_stale_not_that_the_machine_was_busy(race):
    """Live clocks below the quiet costs mean the profile overstates the machine (it was measured at a busier moment):
    the live figures stay the headline, and the status says the profile looks stale."""
    import pandas as pd

    from disco.bench.analysis import quiet_outcome

    q = quiet.QuietCheck(live_s={AUTOREGRESSIVE: 0.80, "static:4": 0.84}, quiet_s={AUTOREGRESSIVE: 1.0, "static:4": 1.0})
    assert q.stale and not q.busy
    status = _status(race, race.summaries(), 1.0, True, [], quiet=q)
    assert "faster than this machine's profile" in status and "busy" not in status
    live = next(s for s in race.summaries() if s["strategy"] == "static:4")["speedup"]
    assert f"`static:4` **{live:.2f}×**" in status  # the live figure leads
    mixed = quiet.QuietCheck(live_s={AUTOREGRESSIVE: 1.3, "static:4": 0.8}, quiet_s={AUTOREGRESSIVE: 1.0, "static:4": 1.0})
    assert mixed.busy and not mixed.stale
    runs = pd.DataFrame({"mode": "timed", "implementation": "ours", "live_over_quiet": [0.8, 1.0, 1.3, 1.05]})
    assert quiet_outcome(runs) | {"median": 0, "worst": 0} == {"checked": 4, "busy": 1, "faster": 1, "median": 0,
                                                               "worst": 0}
