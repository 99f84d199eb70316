"""The costs package's one error: a cost profile that cannot be parsed, read or used (one line for the user).

Its own module so every source of costs (``model``, ``batched``, ``roofline``) raises it without importing another."""

from __future__ import annotations

from disco.errors import UserError


class CostProfileError(UserError, ValueError):
    """A cost profile that cannot be parsed or read (one line for the user)."""
