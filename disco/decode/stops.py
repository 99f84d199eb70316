"""Why an iteration's draft stopped: the trace's ``stop_reason`` values (re-exported by ``disco.decode.trace``).
Their own module so the acceptance formulas (``disco.decode.acceptance``) and the trace both read them without a
circle."""

STOP_CONFIDENCE = "confidence"      # the last drafted token's confidence fell below the threshold
STOP_MAX_LOOKAHEAD = "max_lookahead"  # drafted the policy's K tokens
STOP_LENGTH = "length"              # the draft was capped by max_new_tokens (room kept for the target's token)
STOP_EOS = "eos"                    # the assistant drafted the end-of-sequence token
STOP_ORACLE = "oracle"              # the oracle dropped a draft token the target would reject
STOP_NONE = "none"                  # autoregressive: nothing drafted by design
STOP_SHORT = "short"                # the policy discarded a draft as too short to send (llama.cpp's n-min)
STOP_SOURCE = "source"              # prompt lookup: the source (no match, the match's evidence, EOS) gave fewer than K
STOP_REASONS = (STOP_CONFIDENCE, STOP_MAX_LOOKAHEAD, STOP_LENGTH, STOP_EOS, STOP_ORACLE, STOP_NONE, STOP_SHORT,
                STOP_SOURCE)
