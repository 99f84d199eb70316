"""Live decoding: the models behind the iteration core (batch size 1), with a KV cache per model.

One ``Decoder`` runs one strategy on one prompt, one iteration per ``step()``. The loop itself (budget,
draft-stop, accept and cut, cache lengths, the record) is ``disco.decode.core.IterationCore``; this module is
its live backend: the forward passes, the acceptance rules and the per-token records.

  1. draft:  the assistant proposes up to ``policy.budget()`` tokens, one forward pass each, stopping
             early when the policy says so (confidence below tau), at EOS, or at the length cap;
  2. verify: the target scores the last committed token plus every draft in ONE forward pass;
  3. accept: greedy keeps the longest prefix equal to the target's argmax and appends the target's own
             token; sampling uses the Leviathan et al. rejection rule (so the output follows the target's
             distribution exactly); then both caches are cropped back to what was accepted.

The autoregressive baseline is the same loop with a policy that never drafts, so both are timed
through the same code. Invariants kept between iterations (``ids`` = prompt + output so far):
  * the target cache holds ``ids[:-1]``: every verification feeds ``[ids[-1]] + drafts``
    (iteration 1 feeds the whole prompt: prefill and the first verification are one pass);
  * the assistant cache holds at most ``ids[:-2]`` (as transformers' assisted generation does, so the
    two implementations compute the same numbers), and never a token that was not accepted.
The draft length is capped at ``max_new_tokens - len(output) - 1`` so the target's token always fits;
transformers caps it the same way, which keeps pass counts comparable.
"""

from __future__ import annotations

import math
import time
from typing import Callable

import torch

from disco.decode.core import CoreView, Drafted, IterationCore, Verdict
from disco.decode.sampling import distribution, draft_features, greedy_accept, speculative_accept
from disco.decode.settings import DecodeSettings
from disco.decode.trace import SOURCE_AUTOREGRESSIVE, SOURCE_BONUS, SOURCE_CORRECTION, SOURCE_DRAFT, IterationRecord, TokenRecord
from disco.errors import InputError, Interrupted
from disco.models.pair import prefill_boundary, sync
from disco.policies import Autoregressive, Policy, RunContext

class Decoder(CoreView):
    """One strategy decoding one prompt: the live backend of the iteration core (``disco.decode.core``).
    Call ``step()`` until ``done``."""

    def __init__(self, pair, prompt_ids: list[int], policy: Policy, settings: DecodeSettings, costs=None,
                 prefill_upto: int | None = None):
        if not prompt_ids:
            raise InputError("the prompt encodes to zero tokens")
        if policy.greedy_only and settings.sample:
            raise InputError(f"strategy {policy.spec!r} needs greedy decoding; turn sampling off or remove it")
        self.pair = pair
        self.policy = policy
        self.settings = settings
        self.strategy = policy.spec
        self.prompt_len = len(prompt_ids)
        self.device = pair.device
        self.core = IterationCore(policy, prompt_ids, settings.max_new_tokens, pair.eos_ids, self)
        self.assistant_precision = pair.assistant_precision
        self.target = pair.session("target")
        self.assistant = pair.session("assistant") if policy.uses_assistant else None
        upto = self.prompt_len - 1 if prefill_upto is None else prefill_upto  # the prompt's prefix, shared by all lanes
        for session in (self.target, self.assistant):
            prefill_boundary(session, upto)
        self.generator = torch.Generator(device=self.device).manual_seed(int(settings.seed))
        self.tokens: list[TokenRecord] = []
        self.interrupted = False
        self.reference_rederived = 0  # oracle: how often its reference was recomputed from its own prefix
        self._interrupt = None  # the running step's interrupt, polled before and during every pass
        self._untimed_s = 0.0   # the oracle's probes and reference: excluded from this lane's clock
        self._q_rows: list[torch.Tensor] = []
        self._logits: torch.Tensor | None = None
        policy.bind(RunContext(costs=costs, reference=getattr(policy, "reference", None), sample=settings.sample))

    @property
    def t_len(self) -> int:
        return self.core.t_len

    @property
    def a_len(self) -> int:
        return self.core.a_len

    @property
    def text(self) -> str:
        return self.pair.decode(self.output_ids)

    # -- model calls ----------------------------------------------------------------------------

    def _forward(self, session, tokens: list[int], keep: int) -> tuple[torch.Tensor, float]:
        """Run ``tokens`` through one model's session; return the last ``keep`` logits rows and ms."""
        try:
            return session.forward(tokens, keep, self._interrupt)
        except Interrupted:
            self.interrupted = True  # the caches may hold unverified drafts or half a pass: this decoder is spent
            raise

    # -- the core's backend ---------------------------------------------------------------------

    def clock(self) -> float:
        sync(self.device)
        return (time.perf_counter() - self._untimed_s) * 1000.0

    def draft(self, core: IterationCore, index: int, fed: int) -> Drafted:
        if index == 0:
            self._q_rows = []
        feed = core.ids[core.a_len: core.a_len + fed] if index == 0 else [self._last_draft]
        logits, ms = self._forward(self.assistant, feed, 1)
        q = distribution(logits[0], self.settings)
        token = int(torch.multinomial(q, 1, generator=self.generator)) if self.settings.sample else int(q.argmax())
        if self.settings.sample:
            self._q_rows.append(q)
        self._last_draft = token
        prob, entropy, margin, top10 = draft_features(q, token)
        return Drafted(token, prob, entropy, margin, ms, top10)

    def probe(self, core: IterationCore, drafts: list[int]) -> int:
        """How many of ``drafts`` the target's verification pass over exactly that prefix accepts in full (untimed).
        The pass is the same computation the timed verification will run (same cache, same tokens, same shape),
        so on a deterministic device the timed pass accepts every token kept; each shorter prefix is probed
        again because a different shape can round differently (bf16 near-ties)."""
        start = time.perf_counter()
        while drafts:
            feed = core.ids[core.t_len:] + drafts
            logits, _ = self._forward(self.target, feed, len(drafts) + 1)
            self.target.crop(core.t_len)  # the probe leaves the cache as it found it
            n, _ = greedy_accept(logits, drafts)
            if n == len(drafts):
                break
            drafts = drafts[:n]
        self._untimed_s += time.perf_counter() - start
        return len(drafts)

    def verify(self, core: IterationCore, fed: int, steps) -> Verdict:
        drafts = [s.token for s in steps]
        feed = core.ids[core.t_len:] + drafts
        logits, ms = self._forward(self.target, feed, len(drafts) + 1)
        if self.settings.sample:
            p = distribution(logits, self.settings)
            if core.drafter == "lookup":  # a copied draft is a point mass on the copied token
                q = torch.zeros_like(p[: len(drafts)])
                q[torch.arange(len(drafts)), torch.tensor(drafts, dtype=torch.long)] = 1.0
            else:
                q = torch.stack(self._q_rows[: len(drafts)]) if drafts else p[:0]
            accepted, token = speculative_accept(p, q, drafts, self.generator)
        else:
            accepted, token = greedy_accept(logits, drafts)
        self._logits = logits
        return Verdict(accepted, token, ms)

    def rollback(self, t_len: int, a_len: int) -> None:
        self.target.crop(t_len)
        if self.assistant is not None:
            self.assistant.crop(a_len)

    def commit(self, core: IterationCore, new: list[int], steps, accepted: int, rejected: bool, iteration: int) -> None:
        """Per-token records, with the target's view of each emitted position (its logit for the token and the
        runner-up): what makes a greedy divergence between two runs explainable (disco.decode.divergence)."""
        logits = self._logits
        out_len = core.out_len - len(new)
        top_logits, top_ids = torch.topk(logits[: len(new)], k=min(2, logits.shape[-1]), dim=-1)
        top_logits, top_ids = top_logits.tolist(), top_ids.tolist()
        chosen = logits[torch.arange(len(new)), torch.tensor(new)].tolist()
        for i, token in enumerate(new):
            if not self.policy.drafts:
                source, prob = SOURCE_AUTOREGRESSIVE, math.nan
            elif i < accepted:
                source, prob = SOURCE_DRAFT, steps[i].prob
            else:
                source, prob = (SOURCE_CORRECTION if rejected else SOURCE_BONUS), math.nan
            other = 1 if top_ids[i][0] == token else 0  # the best token that is not this one
            runner_id = top_ids[i][other] if len(top_ids[i]) > other else -1
            runner_logit = top_logits[i][other] if len(top_logits[i]) > other else math.nan
            self.tokens.append(TokenRecord(self.strategy, out_len + i, token, self.pair.token_text(token), source, prob,
                                           iteration, chosen[i], runner_id, runner_logit))

    def settle(self, core: IterationCore) -> None:
        """Once the lane's own text leaves the oracle's reference (a bf16 near-tie), the reference no longer
        describes the lane's prefix: recompute it from that prefix (untimed), so the oracle stays an upper bound."""
        if not self.policy.probes_verification or core.done:
            return
        out = core.output_ids
        ref = self.policy.reference or []
        if ref[: len(out)] == out:
            return
        start = time.perf_counter()
        remaining = self.settings.max_new_tokens - len(out)
        self.policy.reference = out + greedy_continuation(self.pair, list(core.ids), remaining, self._interrupt,
                                                          prefill_upto=self.prompt_len - 1)
        self.reference_rederived += 1
        self._untimed_s += time.perf_counter() - start

    # -- one iteration ----------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self, interrupt=None) -> IterationRecord:
        """One draft -> verify -> accept iteration. ``interrupt`` (a function returning true to stop) is polled
        before every forward pass; when it fires the iteration is abandoned, nothing of it is recorded, and
        ``Interrupted`` is raised. The model polls it during the pass too (``disco.models.pair.TorchSession``), so
        Stop waits for one transformer layer, not for a whole verify pass (seconds on a CPU)."""
        if self.done or self.interrupted:
            raise RuntimeError(f"step() called on a {'finished' if self.done else 'interrupted'} decoder")
        self._interrupt = interrupt
        try:
            record = self.core.step()
        except Interrupted:
            self.release()
            raise
        finally:
            self._interrupt = None
        if self.done:
            self.release()
        return record

    def release(self) -> None:
        """Hand the model sessions back as soon as this decoder can no longer step (finished or interrupted): a
        llama.cpp session's context returns to its pool at once, a torch session drops its KV cache. The records,
        tokens and text stay."""
        for session in (self.target, self.assistant):
            if session is not None:  # no assistant session for a drafter without a model
                session.close()

    def run(self, interrupt=None) -> "Decoder":
        while not self.done:
            self.step(interrupt)
        return self


def greedy_continuation(pair, prompt_ids: list[int], max_new_tokens: int, interrupt: Callable[[], bool] | None = None,
                        progress: Callable[[int, int], None] | None = None, prefill_upto: int | None = None) -> list[int]:
    """The target's own greedy continuation of ``prompt_ids`` (what the oracle knows and replay tables store), by
    the autoregressive lane itself. ``interrupt`` as for ``Decoder.step``; ``progress(done, max_new_tokens)`` after
    every token."""
    decoder = Decoder(pair, list(prompt_ids), Autoregressive(), DecodeSettings(max_new_tokens=max_new_tokens),
                      prefill_upto=prefill_upto)
    while not decoder.done:
        decoder.step(interrupt)
        if progress is not None:
            progress(len(decoder.output_ids), max_new_tokens)
    return decoder.output_ids
