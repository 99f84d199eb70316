"""Per-position conditional acceptance (``disco.decode.trace.position_acceptance``) from hand-made traces, and its
figure."""

from __future__ import annotations

import pandas as pd
import pytest

from disco.decode.trace import position_acceptance


def _frame(rows):
    return pd.DataFrame(rows, columns=["strategy", "lookahead", "accepted"])


def test_hand_made_trace():
    frame = _frame([("a", 3, 3), ("a", 3, 1), ("a", 2, 0), ("a", 0, 0), ("b", 1, 1), ("b", 4, 2)])
    table = position_acceptance(frame)
    a = table[table["strategy"] == "a"].set_index("position")
    # position 1: three drafts reached it, two accepted it; 2: the drafts that accepted position 1 and had a 2nd
    # token (the first two), one accepted; 3: only the first draft reached it, and accepted it
    assert a[["reached", "accepted"]].values.tolist() == [[3, 2], [2, 1], [1, 1]]
    assert a["rate"].tolist() == pytest.approx([2 / 3, 1 / 2, 1.0])
    b = table[table["strategy"] == "b"].set_index("position")
    assert b[["reached", "accepted"]].values.tolist() == [[2, 2], [1, 1], [1, 0]]  # position 4 never reached


def test_product_of_rates_is_the_chance_of_a_run_of_accepts():
    """With every draft of the same length, the product of the first j rates is the share of drafts whose first j
    tokens were all accepted."""
    accepted = [0, 1, 1, 2, 3, 4, 4, 4, 2, 0]
    frame = _frame([("s", 4, a) for a in accepted])
    table = position_acceptance(frame).set_index("position")
    product = 1.0
    for j in range(1, 5):
        product *= table.loc[j, "rate"]
        assert product == pytest.approx(sum(a >= j for a in accepted) / len(accepted))


def test_nothing_drafted_gives_an_empty_table():
    assert position_acceptance(_frame([("ar", 0, 0), ("ar", 0, 0)])).empty
    assert position_acceptance(_frame([])).empty


def test_the_figure_draws_one_line_per_drafting_lane():
    from disco.app import plots

    frame = _frame([("static:3", 3, 1), ("static:3", 3, 3), ("lookup:4", 4, 0), ("autoregressive", 0, 0)])
    frame["stop_reason"] = ["max_lookahead", "max_lookahead", "source", "none"]
    fig = plots.positions_figure(frame)
    assert [t.name for t in fig.data] == ["static:3", "lookup:4"]
    assert list(fig.data[0].y) == pytest.approx([1.0, 0.5, 1.0])
    assert [list(c) for c in fig.data[0].customdata] == [[2, 2], [1, 2], [1, 1]]
