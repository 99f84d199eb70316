"""Model pairs: loading per preset (``tiny``, ``embedded``, ``TARGET::ASSISTANT``), the one session every caller
runs a model through, the embedded pair's wheels and cache, assistant precision, and the numerics chosen by
measurement."""

from disco.models.load import (  # noqa: F401
    EMBEDDED, HUB_PAIR, TINY, load_pair, load_resolved, parse_models_spec, resolve_assistant,
)
from disco.models.pair import ModelLoadError, ModelPair, encode_prompt  # noqa: F401
