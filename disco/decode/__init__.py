"""Decoding: the one iteration core behind every backend (``core``), the live backend over a pair's model sessions
(``live``), the trace it writes (``trace``), why two greedy runs can differ (``divergence``), the sampling numerics
(``sampling``) and the race of several lanes on one prompt (``race``)."""
