"""How a run decodes: greedy or sampling (temperature, top-p, seed) and its length, checked once."""

from __future__ import annotations

import math
from dataclasses import dataclass

from disco.errors import InputError

MAX_NEW_TOKENS_LIMIT = 4096


@dataclass(frozen=True)
class DecodeSettings:
    max_new_tokens: int = 64
    sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0

    def validate(self) -> None:
        if not isinstance(self.max_new_tokens, int) or not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
            raise InputError(f"max_new_tokens must be an integer between 1 and {MAX_NEW_TOKENS_LIMIT}, got {self.max_new_tokens}")
        if self.sample:
            if not (self.temperature > 0 and math.isfinite(self.temperature)) or self.temperature > 100:
                raise InputError(f"temperature must be in (0, 100], got {self.temperature}")
            if not 0 < self.top_p <= 1:
                raise InputError(f"top_p must be in (0, 1], got {self.top_p}")
