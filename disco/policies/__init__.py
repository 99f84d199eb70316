"""Lookahead policies: how many tokens the assistant drafts, when it stops, how that adapts.

The protocol, the spec grammar and the registry are in ``disco.policies.base``; one module per family of
rules registers its kinds on import; ``disco.policies.grids`` builds the grids the benchmark and the Sweep
replay from the kinds' metadata. Adding a policy = one ``Policy`` subclass (imported here) + its tests.
"""

from disco.policies.base import (  # noqa: F401
    ASSISTANT_SUFFIXES, MAX_LOOKAHEAD_LIMIT, DraftStep, Param, Policy, RunContext, StrategyError, canonical_spec,
    format_value, grammar_line, parse_strategy, policy_class, policy_kinds, spec_kind, split_precision,
)
from disco.policies.classic import (  # noqa: F401
    DEFAULT_MAX_LOOKAHEAD, DEFAULT_THRESHOLD, KMAXES, STATIC_KS, TAUS, Autoregressive, Heuristic, Oracle, Static,
    Threshold,
)
from disco.policies.adaptive import Adaptive  # noqa: F401,E402
from disco.policies.entropy import Entropy  # noqa: F401,E402
from disco.policies.cumulative import Cumulative  # noqa: F401,E402
from disco.policies.costaware import CostAware  # noqa: F401,E402
from disco.policies.classifier import Disco  # noqa: F401,E402
from disco.policies.pmin import PMin  # noqa: F401,E402
from disco.policies.lookup import Copy, Lookup, NGram  # noqa: F401,E402
from disco.policies.suffix import Suffix  # noqa: F401,E402
from disco.policies.sglang import SGLangAdaptive  # noqa: F401,E402
from disco.policies.bandit import Bandit  # noqa: F401,E402
from disco.policies.hybrid import Hybrid  # noqa: F401,E402

AUTOREGRESSIVE = Autoregressive.kind
REFERENCE = Threshold.canonical  # transformers' defaults (tau 0.4, at most 20 drafts): the seed's setting
DEFAULT_STRATEGIES = (AUTOREGRESSIVE, Static.canonical, REFERENCE)

