"""What identifies a replay table: the pair it was computed by (``PairSpec``, what a run asks for; a table's meta, what
a loaded pair computed: ``disco.replay.tables.pair_meta``) and the prompt as the run encodes it (``prompt_about``:
its text's fingerprint, how the length rule fitted it, and for a later turn of a chat the earlier turns and answers
it follows, ``history_sha``). ``table_matches`` says whether a cached table found by the prompt's id is this run's."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass

from disco.models import load_resolved
from disco.suites import SuitePrompt
from disco.tables.fitting import Fitting

PAIR_FIELDS = ("engine", "dtype", "assistant_precision")  # "auto" in a run's options matches any one of them
META_DEFAULTS = {"engine": "torch", "assistant_precision": "model"}  # what a table from before these fields meant


@dataclass(frozen=True)
class PairSpec:
    """The model pair a command names (its model options, ``auto`` where the command leaves the choice to the
    loader): what it loads here, what each Ray worker loads, and which cached tables are its."""

    models: str
    engine: str = "auto"
    dtype: str = "auto"
    device: str = "auto"
    assistant_precision: str = "auto"

    @classmethod
    def from_args(cls, args) -> "PairSpec":
        return cls(args.models, args.engine, args.dtype, args.device, args.assistant_precision)

    @classmethod
    def of(cls, pair) -> "PairSpec":
        """The spec of a loaded pair: every field as it resolved."""
        info = pair.describe()
        return cls(info["models"], info.get("engine", "torch"), info.get("dtype", "auto"), info.get("device", "auto"),
                   info.get("assistant_precision", "model"))

    @classmethod
    def coerce(cls, spec) -> "PairSpec":
        """A spec, or the ``{"models": ..., "engine": ..., ...}`` dict callers gave before there was one."""
        if isinstance(spec, cls):
            return spec
        return cls(**{k: v for k, v in dict(spec).items() if k in cls.__dataclass_fields__})

    def matches(self, meta: dict) -> bool:
        """Whether a table's meta (or a loaded pair's ``describe()``) is of this pair: the same models, and the same
        engine, dtype and assistant precision wherever this spec names one."""
        if meta.get("models") != self.models:
            return False
        want = asdict(self)
        return all(want[k] == "auto" or meta.get(k, META_DEFAULTS.get(k)) == want[k] for k in PAIR_FIELDS)

    def load(self, log=print):
        """The pair loaded here (``disco.models.load_resolved``)."""
        return load_resolved(self.models, self.dtype, self.device, self.assistant_precision, log=log,
                             engine=self.engine)


def history_sha(turns: list[tuple[list[int], list[int]]]) -> str:
    """A short hash of the earlier turns a later turn follows: each one's token ids and the target's answer to it."""
    return hashlib.sha1(json.dumps(turns, separators=(",", ":")).encode()).hexdigest()[:16]


def prompt_about(prompt: SuitePrompt, cut: int, context: int, fitting: Fitting, limit: float, max_new_tokens: int,
                 history: str | None = None) -> dict:
    """What a table of this prompt records about it (``disco.replay.tables.build_table``'s ``about``): its text's
    fingerprint, how many tokens the rule cut (and under which rule and limit), the context, and for a later turn how
    long the earlier answers are and exactly which earlier turns and answers it follows."""
    info = {"sha": prompt.fingerprint, "cut": cut, "context": context}
    if cut:
        info.update(rule=fitting.rule, limit=int(limit))
    if prompt.history:
        info["answers"] = max_new_tokens  # the earlier turns' answers are this long at most
        info["history"] = history
    return info


def table_matches(meta: dict, prompt: SuitePrompt, fitting: Fitting, max_new_tokens: int,
                  history: str | None = None) -> bool:
    """Whether a cached table (found by the prompt's id, without the models) was built from this prompt as this run
    would encode it: the same text (fingerprint), cut only if this run cuts it and to the same length, and for a later
    turn the same earlier turns and answers (``history``: ``history_sha`` of the earlier turns' cached tables, which
    must match this run too). A table from before suites described their prompts matches by id alone."""
    about = meta.get("prompt")
    if not about:
        return not prompt.history
    if about.get("sha") != prompt.fingerprint or (prompt.history and about.get("answers") != max_new_tokens):
        return False
    if prompt.history and about.get("history") != history:  # the earlier turns as cached now (their cut, answers)
        return False
    limit = min(int(about.get("context", 0)) - max_new_tokens, fitting.max_prompt_tokens or math.inf)
    if about.get("cut"):
        return fitting.rule == about.get("rule") and about.get("limit") == limit
    return int(meta.get("prompt_tokens") or 0) <= limit
