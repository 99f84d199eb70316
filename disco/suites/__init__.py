"""Prompt suites: where a benchmark's prompts come from (DISCO Lab's own suite, HumanEval, Spec-Bench / MT-Bench
question files, hub datasets, any JSONL or CSV), all turned into one record (``SuitePrompt``: id, kind, chat, prompt,
and the earlier turns of a multi-turn chat); how a run picks some of them (seeded samples stratified by kind) and
splits them (alternately within each kind, or whole kinds held out). Nothing below this layer knows where a prompt
came from."""

from disco.suites.options import Picked, Selection, add_arguments, pick, selection_from_args
from disco.suites.ours import BUILTIN, BUILTIN_KINDS
from disco.suites.record import TURNS, Suite, SuiteOptions, SuitePrompt, turn_id
from disco.suites.select import (
    SPLITS, allocation, assign_splits, filter_prompts, pick_prompts, sample_units, split_of, split_prompts,
)
from disco.suites.sources import BUILTIN_NAME, HUMANEVAL, load_suite

__all__ = ["BUILTIN", "BUILTIN_KINDS", "BUILTIN_NAME", "HUMANEVAL", "SPLITS", "TURNS", "Picked", "Selection", "Suite",
           "SuiteOptions", "SuitePrompt", "add_arguments", "allocation", "assign_splits", "filter_prompts", "load_suite",
           "pick", "pick_prompts", "sample_units", "selection_from_args", "split_of", "split_prompts", "turn_id"]
