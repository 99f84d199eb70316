"""The Race tab's logic as plain functions (no Blocks here, so it can be tested without a browser).

``compare`` is the Run button and the ``/compare`` API endpoint: a generator that races the lanes and yields the
page's outputs (status line, lanes, four figures, summary table, two CSV files) at most ``UPDATE_INTERVAL_S``
apart, plus one final update. The controls become ``Policy`` objects once (``race_plan.plan``); everything
shown comes from the trace (``Snapshot``); nothing here touches the models beyond asking the loader for the pair. The controls' checks and the lanes'
policies are ``disco.app.race_plan``'s.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Callable, Iterator

import gradio as gr
import pandas as pd

from disco import limits
from disco.app import plots, quiet
from disco.app.lanes import lanes_html, summary_frame
from disco.app.session import COMPUTE_LOCK, write_csvs
from disco.policies.export import take_away, take_away_md
from disco.decode import divergence
from disco.decode.race import race
from disco.errors import Interrupted, UserError, first_line
from disco.policies import AUTOREGRESSIVE, Autoregressive, Policy, parse_strategy

log = logging.getLogger("disco.app")

UPDATE_INTERVAL_S = 0.25  # lanes, numbers and status: ~4 updates a second
PLOT_INTERVAL_S = 1.0     # gr.Plot redraws whole figures (Plotly.react on 4 charts): more often stalls the browser

from disco.app.race_plan import (  # noqa: F401  (the tab's names: lane_policy, lane_policies, ... for tests)
    Plan, decode_settings, engine_name, lane_policies, lane_policy, pair_for, plan, request_of,
)
from disco.app.race_inputs import (  # noqa: F401  (the tab's names, declared with its controls)
    ASSISTANT_CHOICES, AUTO, DEFAULT_ASSISTANT, DEFAULT_ENGINE, DEFAULTS, ENGINE_CHOICES, LANE_KINDS, RACE_CONTROLS,
    SLIDER_WHAT, RaceRequest,
)

EXAMPLES = [
    ["Write a Python function `is_prime(n)` that checks whether n is prime, with a docstring and two doctests."],
    ["Explain in simple terms why a binary search runs in logarithmic time."],
    ["Summarise in two sentences: Speculative decoding speeds up large language models by letting a small "
     "draft model propose several tokens that the large model verifies in a single forward pass. The output "
     "is identical to what the large model would have produced alone, but far fewer slow forward passes are "
     "needed when the draft model guesses well."],
    ["Write a short story about a lighthouse keeper who finds a message in a bottle."],
    ["Rename the variable `total` to `running_sum` and reply with the whole function only.\n\n"
     "def mean_of_positive(values):\n    total = 0\n    count = 0\n    for value in values:\n        if value > 0:\n"
     "            total += value\n            count += 1\n    return total / count if count else 0.0"],
]

OUTPUT_LABELS = ("status", "lanes", "race", "lookahead", "latency", "confidence", "positions", "summary",
                 "iterations_csv", "tokens_csv", "positions_csv")


def empty_lanes_html(message: str = "press Run to start") -> str:
    lanes = [Autoregressive(), lane_policy(DEFAULTS.lane_a), lane_policy(DEFAULTS.lane_b)]
    return lanes_html(lanes, None, None, message=message)


def _fmt(x: float) -> str:
    return f"{round(float(x), 4):g}"


# ------------------------------------------------------------------------------------------------
# the run


def _status(snapshot, summaries: list[dict], wall: float, final: bool, notes: list[str], stopped: bool = False,
            quiet=None) -> str:
    by = {s["strategy"]: s for s in summaries}
    meta = snapshot.meta
    mode = "greedy" if not snapshot.settings.sample else (
        f"sampling T={_fmt(snapshot.settings.temperature)}, top-p={_fmt(snapshot.settings.top_p)}, "
        f"seed={snapshot.settings.seed}")
    where = f"{meta.get('models', '?')} · {meta.get('dtype', '?')} on {meta.get('device', '?')} · " \
            f"prompt {meta.get('prompt_tokens', '?')} tokens · {mode}"
    progress = " · ".join(f"`{s}` {by[s]['new_tokens']}/{snapshot.settings.max_new_tokens}" for s in snapshot.strategies)
    if stopped:
        why = "".join(f" · {n}" for n in notes if "time budget" in n)
        return (f"■ **Stopped** after {wall:.1f} s · {progress}{why} · the partial trace is in the CSV files below; "
                f"press **Run** to start again  \n<small>{where}</small>")
    if not final:
        return f"● **Running** ({wall:.1f} s) · {progress}  \n<small>{where}</small>"
    parts, live = [], []
    base = by.get(AUTOREGRESSIVE)
    busy = quiet is not None and quiet.busy
    for s in snapshot.strategies:
        if s == AUTOREGRESSIVE:
            continue
        row = by[s]
        if base is not None and not pd.isna(row["speedup"]):
            shown = quiet.speedup(s, AUTOREGRESSIVE) if busy else row["speedup"]
            parts.append(f"`{s}` **{shown:.2f}×**" if shown == shown else f"`{s}` {row['speedup']:.2f}× (live)")
            live.append(f"`{s}` {row['speedup']:.2f}×")
    checks = [by[s]["identical_to_autoregressive"] for s in snapshot.strategies if s != AUTOREGRESSIVE]
    if snapshot.settings.sample:
        same = "sampled: texts may differ from the baseline, the distribution is the target's"
    elif base is None:
        same = "no baseline to compare the texts with"
    elif all(c is True for c in checks):
        same = "every lane's text is identical to the baseline ✓"
    else:
        divs = [(st, by[st].get("divergence")) for st in snapshot.strategies if by[st].get("divergence")]
        same = "; ".join(f"`{st}` leaves the baseline: {divergence.short(d)}" for st, d in divs) or \
            "a lane's text differs from the baseline"
        if any(d["kind"] == divergence.MISMATCH for _, d in divs):
            same += " (a mismatch is a bug: please report it with the CSV)"
        else:
            same += " (bf16 rounding of an almost-tied choice; marked in the lane)"
    speed = (" · speed-up vs autoregressive: " + ", ".join(parts)) if parts else ""
    if busy and parts:  # the live clocks were not the machine's: say so, and which figure the headline is
        speed += (f" (from this machine's quiet pass costs: ⚠ the machine was busy during the race, a lane's live "
                  f"time was {100 * quiet.worst():+.0f} % off its quiet cost; live: {', '.join(live)})")
    elif quiet is not None and quiet.stale and parts:
        speed += (f" (live; a lane ran {-100 * quiet.worst():.0f} % faster than this machine's profile says: its pass "
                  "costs look stale, `python -m disco profile` measures them again)")
    elif quiet is not None and parts:
        speed += " (live; within 10 % of this machine's quiet pass costs)"
    extra = "".join(f" · {n}" for n in notes)
    return f"✓ **Done** in {wall:.1f} s{speed} · {same}{extra}  \n<small>{where}</small>"


def render(snapshot, *, final: bool, wall: float, notes: list[str], decode=None, files=(None, None, None),
           figures: bool = True, stopped: bool = False, quiet=None) -> tuple:
    """All of the page's outputs for one snapshot, in OUTPUT_LABELS order (``gr.skip()`` for what is unchanged:
    the CSV files until the end, the figures when ``figures`` is false). ``quiet``: the final race's quiet-cost
    check (``disco.app.quiet``)."""
    frame = snapshot.iterations()
    summaries = snapshot.summaries(frame)
    figs = plots.all_figures(frame, snapshot.strategies) if figures or final else (gr.skip(),) * 5
    cards = summaries
    if quiet is not None and quiet.busy:  # the lanes' cards lead with the true figures too, marked "quiet"
        cards = [dict(s, speedup=quiet.speedup(s["strategy"], AUTOREGRESSIVE),
                      tokens_per_s=s["new_tokens"] / quiet.quiet_s[s["strategy"]], quiet=True)
                 if quiet.quiet_s.get(s["strategy"]) else s for s in summaries]
    return (
        _status(snapshot, summaries, wall, final, notes, stopped, quiet),
        lanes_html([d.policy for d in snapshot.decoders], snapshot.tokens(), cards, decode),
        *figs,
        summary_frame(summaries, quiet),
        *(path if final else gr.skip() for path in files),
    )


def _blank(status: str, lanes: list[Policy], lane_message: str, plot_message: str) -> tuple:
    """The page's outputs when there is no iteration to show (starting, or stopped before the first)."""
    titles = (plots.RACE_TITLE, plots.LOOKAHEAD_TITLE, plots.LATENCY_TITLE, plots.CONFIDENCE_TITLE, plots.POSITIONS_TITLE)
    return (status, lanes_html(lanes, None, None, message=lane_message),
            *(plots.empty_figure(t, plot_message) for t in titles), summary_frame([]), None, None, None)


def compare(get_pair, request=None, *, interval: float = UPDATE_INTERVAL_S, plot_interval: float = PLOT_INTERVAL_S,
            should_stop: Callable[[], bool] | None = None, get_profile: Callable[[], object] | None = None,
            **values) -> Iterator[tuple]:
    """Race the lanes and stream the page's outputs (see OUTPUT_LABELS).

    ``request`` is a ``RaceRequest``, or the controls' raw values (a mapping, or the prompt with the other controls
    as keywords: ``compare(pair, "def f", k=3)``), checked by ``RACE_CONTROLS`` here.
    ``get_pair`` is a pair or a function returning one (it may wait for start-up loading); it is called with
    ``engine=`` when the run asks for an engine other than the app's default (one engine per run).
    ``should_stop`` is polled before every forward pass: when it turns true the iteration in progress is
    abandoned and the run ends with a "Stopped" status and the completed iterations' trace in the CSV files.
    User mistakes become ``gr.Error`` with the engine's one-line message. ``get_profile`` returns this machine's
    cost profile (or None while it is measured): the ``auto`` lane runs its recommended setting.
    """
    start = time.perf_counter()
    try:
        req = request_of(request, values)
        run = plan(req, get_profile)
    except UserError as exc:
        raise gr.Error(str(exc), print_exception=False) from None
    lanes, notes, budgets, prof = run.lanes, run.notes, run.budgets, run.profile
    for note in notes:
        gr.Warning(note)
    waiting = "warming up" + (" and computing the oracle's reference" if any(p.probes_verification for p in lanes) else "")
    yield _blank(f"○ **Starting** · {', '.join(f'`{p.spec}`' for p in lanes)} · {waiting}…", lanes,
                 waiting + "…", "waiting for the first iteration…")

    holder: list = [None]
    deadline = limits.Deadline(budgets.run_s)
    should_stop = deadline.stop_check(should_stop)
    try:
        pair = pair_for(get_pair, run.engine)
        decode = getattr(pair, "decode", None)
        with COMPUTE_LOCK:  # waits at most one chunk of the background profile
            costs_for = profile_costs(get_profile) if any(p.needs_costs or p.reads_costs for p in lanes) else None
            yield from _race_updates(pair, run.prompt, lanes, run.settings, req.chat, should_stop, start, notes, decode,
                                     interval, plot_interval, holder, costs_for)
    except Interrupted:  # Stop while the oracle's reference was being computed: no iteration has run
        pass
    except UserError as exc:
        raise gr.Error(str(exc), print_exception=False) from None
    except gr.Error:
        raise
    except Exception as exc:  # a bug or an exhausted machine: say so in one line, keep the app alive
        log.exception("run failed")
        first = first_line(exc) if str(exc).strip() else ""
        raise gr.Error(f"the run failed: {type(exc).__name__}: {first}") from None
    snapshot = holder[0]  # the last completed step (a Stop mid-iteration keeps every completed one)
    stopped = (snapshot is None or not snapshot.finished) and should_stop()
    by_budget = stopped and deadline.ended_the_run()
    if by_budget:
        notes = notes + [deadline.reason()]
    if snapshot is None and stopped:
        why = f" ({deadline.reason()})" if by_budget else ""
        yield _blank(f"■ **Stopped** after {time.perf_counter() - start:.1f} s, before any lane finished an "
                     f"iteration{why}; press **Run** to start again", lanes, "stopped",
                     "stopped before the first iteration")
        return
    if snapshot is None:
        raise gr.Error("the run produced no iterations")
    files = write_csvs(snapshot)
    checked = quiet.check(snapshot.decoders, get_profile() if get_profile is not None else None,
                          getattr(pair, "assistant_precision", None)) if not stopped else None
    out = render(snapshot, final=True, wall=time.perf_counter() - start, notes=notes, decode=decode, files=files,
                 stopped=stopped, quiet=checked)
    yield _with_take_away(out, req, prof)


def _with_take_away(out: tuple, req: RaceRequest, prof) -> tuple:
    """The final outputs, with the ``auto`` lane's recommended setting for the engine the user deploys on."""
    auto = [lane_policy(AUTO, assistant=a, profile=prof) for lane, a in ((req.lane_a, req.lane_a_assistant),
                                                                          (req.lane_b, req.lane_b_assistant))
            if str(lane).strip() == AUTO]
    if not auto:
        return out
    table = prof.batch_table(auto[0].assistant_precision) if auto[0].assistant_precision else None
    block = take_away_md(take_away(auto[0], table or None))
    return (f"{out[0]}\n\n<details><summary>auto's setting for transformers, llama.cpp and vLLM</summary>\n\n"
            f"{block}\n\n</details>", *out[1:])


def profile_costs(get_profile: Callable[[], object] | None):
    """``costs_for(precision)`` from this machine's profile (what the cost-aware lane reads), or None while it is
    still being measured (the race then calibrates the pair once itself)."""
    prof = get_profile() if get_profile is not None else None
    if prof is None:
        return None

    def costs_for(precision: str):
        try:
            return prof.cost_model(precision)
        except (KeyError, AttributeError):
            return None
    return costs_for


def _race_updates(pair, prompt, lanes, settings, chat, should_stop, start, notes, decode, interval, plot_interval,
                  holder: list, costs_for=None):
    """The streamed (non-final) updates of one race; the last snapshot is left in ``holder[0]``."""
    last = last_plot = -math.inf
    cost = 0.0
    for snapshot in race(pair, prompt, lanes, settings, chat=bool(chat), should_stop=should_stop,
                         costs_for=costs_for):
        holder[0] = snapshot
        now = time.perf_counter()
        # never spend more than about a third of the wall time on drawing (the lanes' own clocks don't
        # count it, but a visitor waits for it)
        # (interval 0: every step, whatever drawing costs: what the tests ask for, on any machine)
        if not snapshot.finished and now - last >= (max(interval, 2.0 * cost) if interval > 0 else 0.0):
            # the browser redraws four whole Plotly charts per update: they get a slower cadence than the text
            with_figures = now - last_plot >= max(plot_interval, interval)
            update = render(snapshot, final=False, wall=now - start, notes=notes, decode=decode, figures=with_figures)
            cost = time.perf_counter() - now
            last_plot = now if with_figures else last_plot
            yield update
            last = time.perf_counter()
