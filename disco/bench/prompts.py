"""Compatibility: a suite prompt's token ids moved to the table phase (``disco.tables.fitting``: the length rule,
``disco.tables.encoding``: the encoder, ``disco.tables.identity``: what names a table). The names callers imported
from here still resolve; ``PromptEncoder`` keeps its old signature (a cache folder) and builds a later turn's earlier
turns through the phase (``disco.tables.phase.TablePhase.answer_earlier``) before encoding it. New code uses
``disco.tables.phase.TablePhase`` (``ids``, ``table``, ``ensure``)."""

from __future__ import annotations

from pathlib import Path

from disco.suites import SuitePrompt
from disco.tables import encoding
from disco.tables.encoding import Encoded, TurnUnanswered
from disco.tables.fitting import LONG_RULES, MIN_KEPT, Fitting, PromptSkipped, add_arguments, fitting_from_args
from disco.tables.identity import history_sha, table_matches
from disco.tables.phase import TablePhase

__all__ = ["Encoded", "Fitting", "LONG_RULES", "MIN_KEPT", "PromptEncoder", "PromptSkipped", "TurnUnanswered",
           "add_arguments", "fitting_from_args", "history_sha", "table_matches"]


class PromptEncoder(encoding.PromptEncoder):
    """``disco.tables.encoding.PromptEncoder`` with the old signature: ``cache_dir`` holds the earlier turns' tables,
    built (in order, through the phase) when a later turn is asked for."""

    def __init__(self, pair, max_new_tokens: int, cache_dir: Path | None = None, fitting: Fitting | None = None):
        super().__init__(pair, max_new_tokens, fitting)
        self.cache_dir = cache_dir
        self._phase = TablePhase.here(pair, max_new_tokens, cache_dir, self.fitting, encoder=self)

    def ids(self, prompt: SuitePrompt) -> list[int]:
        self._phase.answer_earlier(prompt)
        return super().ids(prompt)
