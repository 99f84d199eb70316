"""The length rule: how a suite prompt is fitted to the models' context and the prompt budget.

A prompt fits when its tokens plus ``max_new_tokens`` are within the models' context and its tokens within
``max_prompt_tokens`` (the operator's or the user's budget, if any). One that does not is ``skip``-ped (the default:
counted and named in the report, never replayed), or cut in the ``middle``: the user's text loses tokens from its
middle until it fits, keeping its beginning and its end, where instructions sit (the rule LongBench uses, Bai et al.
2023), its earlier turns and the template untouched; a prompt whose template and earlier turns alone leave fewer than
``MIN_KEPT`` tokens is skipped. Either way the report counts it (``disco.tables.encoding`` applies the rule).
"""

from __future__ import annotations

from dataclasses import dataclass

from disco.errors import BenchError

LONG_RULES = ("skip", "middle")
MIN_KEPT = 16  # tokens of the user's text a cut prompt keeps at least


class PromptSkipped(BenchError):
    """The prompt does not fit the context or the prompt budget and the rule is to skip it."""


@dataclass(frozen=True)
class Fitting:
    """How prompts are fitted to the context: the budget (None: the context alone) and the rule for the rest."""

    max_prompt_tokens: int | None = None
    rule: str = "skip"

    def __post_init__(self):
        if self.rule not in LONG_RULES:
            raise BenchError(f"--long-prompts must be one of {', '.join(LONG_RULES)}, got {self.rule!r}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < MIN_KEPT:
            raise BenchError(f"--max-prompt-tokens must be at least {MIN_KEPT}, got {self.max_prompt_tokens}")

    def words(self) -> str:
        budget = f"at most {self.max_prompt_tokens} prompt tokens and " if self.max_prompt_tokens else ""
        how = "skipped" if self.rule == "skip" else "cut in the middle (beginning and end kept)"
        return f"a prompt must fit {budget}the context with the new tokens; longer ones are {how}"


def add_arguments(p) -> None:
    g = p.add_argument_group("long prompts")
    g.add_argument("--max-prompt-tokens", type=int, default=None, metavar="N",
                   help="a prompt budget in tokens (default: the models' context less the new tokens)")
    g.add_argument("--long-prompts", choices=LONG_RULES, default="skip",
                   help="a prompt over the context or the budget: skip it (default) or cut its text in the middle "
                        "(beginning and end kept); either way the report counts it")


def fitting_from_args(args) -> Fitting:
    return Fitting(args.max_prompt_tokens, args.long_prompts)
