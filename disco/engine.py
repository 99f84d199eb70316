"""The draft -> verify -> accept loop (batch size 1), with a KV cache per model.

One ``Decoder`` runs one strategy on one prompt, one iteration per ``step()``:

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
import threading
import time
from dataclasses import dataclass

import torch

from disco.policies import Policy
from disco.trace import (
    SOURCE_AUTOREGRESSIVE, SOURCE_BONUS, SOURCE_CORRECTION, SOURCE_DRAFT, STOP_CONFIDENCE, STOP_EOS, STOP_LENGTH,
    STOP_MAX_LOOKAHEAD, STOP_NONE, STOP_ORACLE, IterationRecord, TokenRecord,
)

MAX_NEW_TOKENS_LIMIT = 4096


class Interrupted(Exception):
    """A step abandoned at the caller's request (Stop in the app); that decoder cannot step again."""


class InputError(ValueError):
    """Bad user input (empty prompt, impossible lengths, ...): shown as one line, never a traceback."""


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


# Stop inside a forward pass: a pre-hook on every transformer layer polls the interrupt of the pass running in
# this thread (none outside Decoder passes, so other users of the same model never see it). A CPU verify pass
# can take seconds; with the hooks Stop waits for one layer. Cost: measured 0.36 us per layer call,
# ~10 us on a 290 ms pass of the embedded target.
_PASS = threading.local()


def _interrupt_hook(module, args) -> None:
    interrupt = getattr(_PASS, "interrupt", None)
    if interrupt is not None and interrupt():
        raise Interrupted("stopped inside a forward pass")


def install_interrupt_hooks(model) -> int:
    """Hook the model's stack of transformer layers (the ModuleList as long as ``num_hidden_layers``) once;
    return how many layers are hooked (0 for an unusual architecture: Stop then waits for the whole pass)."""
    hooked = getattr(model, "_disco_interrupt_layers", None)
    if hooked is not None:
        return hooked
    n_layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    hooked = 0
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and n_layers and len(module) == n_layers:
            for layer in module:
                layer.register_forward_pre_hook(_interrupt_hook)
            hooked = len(module)
            break
    model._disco_interrupt_layers = hooked
    return hooked


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _truncate(cache, length: int) -> None:
    """Crop a DynamicCache to ``length`` tokens (transformers 5 crops by a negative count)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def distribution(logits: torch.Tensor, settings: DecodeSettings) -> torch.Tensor:
    """Probabilities after the logits processors (temperature, top-p), in float32, along the last dim.

    Greedy uses the raw distribution: confidence is then the model's plain softmax probability,
    as in transformers (whose greedy assistant applies no warpers).
    """
    logits = logits.float()
    if not settings.sample:
        return torch.softmax(logits, dim=-1)
    logits = logits / settings.temperature
    if settings.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens ranked above it already reach top_p (the top token always stays)
        drop_sorted = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= settings.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.softmax(logits, dim=-1)


def speculative_accept(p: torch.Tensor, q: torch.Tensor, drafts: list[int], generator: torch.Generator) -> tuple[int, int]:
    """Leviathan et al. rejection rule.

    p: target probabilities, shape [k+1, V] (row i scores the position of draft i; row k is the bonus).
    q: assistant probabilities the drafts were sampled from, shape [k, V].
    Returns (number of accepted drafts n, the target's token at position n).
    """
    for i, token in enumerate(drafts):
        ratio = p[i, token] / q[i, token]
        if torch.rand((), generator=generator, device=p.device) <= ratio:
            continue
        residual = torch.clamp(p[i] - q[i], min=0.0)
        total = residual.sum()
        # p == q up to rounding leaves no residual mass; then p itself is the right distribution
        dist = residual / total if total > 0 else p[i]
        return i, int(torch.multinomial(dist, 1, generator=generator))
    k = len(drafts)
    return k, int(torch.multinomial(p[k], 1, generator=generator))


def greedy_accept(target_logits: torch.Tensor, drafts: list[int]) -> tuple[int, int]:
    """Longest prefix of drafts equal to the target's argmax, plus the target's own next token."""
    choice = target_logits.argmax(dim=-1).tolist()
    n = 0
    while n < len(drafts) and drafts[n] == choice[n]:
        n += 1
    return n, choice[n]


class Decoder:
    """One strategy decoding one prompt. Call ``step()`` until ``done``."""

    def __init__(self, pair, prompt_ids: list[int], policy: Policy, settings: DecodeSettings):
        from transformers import DynamicCache

        if not prompt_ids:
            raise InputError("the prompt encodes to zero tokens")
        if policy.greedy_only and settings.sample:
            raise InputError(f"strategy {policy.spec!r} needs greedy decoding; turn sampling off or remove it")
        self.pair = pair
        self.policy = policy
        self.settings = settings
        self.strategy = policy.spec
        self.prompt_len = len(prompt_ids)
        self.ids = list(prompt_ids)
        self.device = pair.device
        self.eos = set(pair.eos_ids)
        self.t_cache = DynamicCache(config=pair.target.config)
        self.a_cache = DynamicCache(config=pair.assistant.config) if policy.uses_assistant else None
        self.t_len = 0
        self.a_len = 0
        self.generator = torch.Generator(device=self.device).manual_seed(int(settings.seed))
        self.records: list[IterationRecord] = []
        self.tokens: list[TokenRecord] = []
        self.elapsed_ms = 0.0
        self.done = False
        self.finish_reason: str | None = None
        self.interrupted = False
        self.reference_rederived = 0  # oracle: how often its reference was recomputed from its own prefix
        self._interrupt = None  # the running step's interrupt, polled by the layer hooks
        if policy.uses_assistant:
            install_interrupt_hooks(pair.assistant)
        install_interrupt_hooks(pair.target)

    # -- public views -------------------------------------------------------------------------

    @property
    def output_ids(self) -> list[int]:
        return self.ids[self.prompt_len:]

    @property
    def text(self) -> str:
        return self.pair.decode(self.output_ids)

    # -- model calls ----------------------------------------------------------------------------

    def _forward(self, model, cache, tokens: list[int], keep: int) -> tuple[torch.Tensor, float]:
        """Run ``tokens`` through ``model`` on top of ``cache``; return the last ``keep`` logits rows and ms."""
        x = torch.tensor([tokens], dtype=torch.long, device=self.device)
        _PASS.interrupt = self._interrupt  # polled by the layer hooks during the pass
        try:
            if self._interrupt is not None and self._interrupt():  # and once before it (unhooked models too)
                raise Interrupted(self.strategy)
            _sync(self.device)
            start = time.perf_counter()
            out = model(input_ids=x, cache=cache, use_cache=True, logits_to_keep=keep)
        except Interrupted:
            self.interrupted = True  # the caches may hold unverified drafts or half a pass: this decoder is spent
            raise
        finally:
            _PASS.interrupt = None
        logits = out.logits[0, -keep:].float()
        _sync(self.device)
        return logits, (time.perf_counter() - start) * 1000.0

    def _probe_drafts(self, drafts: list[int]) -> list[int]:
        """The longest prefix of ``drafts`` that the target's verification pass over exactly that prefix accepts
        in full (untimed). The pass is the same computation the timed verification will run (same cache, same
        tokens, same shape), so on a deterministic device the timed pass accepts every token kept; each
        shorter prefix is probed again because a different shape can round differently (bf16 near-ties)."""
        while drafts:
            feed = self.ids[self.t_len:] + drafts
            logits, _ = self._forward(self.pair.target, self.t_cache, feed, len(drafts) + 1)
            _truncate(self.t_cache, self.t_len)  # the probe leaves the cache as it found it
            n, _ = greedy_accept(logits, drafts)
            if n == len(drafts):
                break
            drafts = drafts[:n]
        return drafts

    def _rederive_reference(self) -> None:
        """Once the lane's own text leaves the oracle's reference (a bf16 near-tie), the reference no longer
        describes the lane's prefix: recompute it from that prefix (untimed), so the oracle stays an upper bound."""
        out = self.output_ids
        ref = self.policy.reference or []
        if ref[: len(out)] == out:
            return
        remaining = self.settings.max_new_tokens - len(out)
        follow = Decoder(self.pair, list(self.ids), Policy("autoregressive"), DecodeSettings(max_new_tokens=remaining))
        self.policy.reference = out + follow.run(self._interrupt).output_ids
        self.reference_rederived += 1

    def _pick(self, probs: torch.Tensor) -> int:
        if self.settings.sample:
            return int(torch.multinomial(probs, 1, generator=self.generator))
        return int(probs.argmax())

    # -- one iteration ----------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self, interrupt=None) -> IterationRecord:
        """One draft -> verify -> accept iteration. ``interrupt`` (a function returning true to stop) is polled
        before every forward pass; when it fires the iteration is abandoned, nothing of it is recorded, and
        ``Interrupted`` is raised. The model's layers poll it too (``install_interrupt_hooks``), so Stop waits for
        one transformer layer, not for a whole verify pass (seconds on a CPU)."""
        if self.done or self.interrupted:
            raise RuntimeError(f"step() called on a {'finished' if self.done else 'interrupted'} decoder")
        self._interrupt = interrupt
        try:
            return self._step()
        finally:
            self._interrupt = None

    def _step(self) -> IterationRecord:
        policy, settings = self.policy, self.settings
        _sync(self.device)
        t0 = time.perf_counter()
        out_len = len(self.ids) - self.prompt_len
        remaining = settings.max_new_tokens - out_len
        k_policy = policy.budget()
        budget = min(k_policy, remaining - 1) if policy.uses_assistant else 0
        drafts: list[int] = []
        confidences: list[float] = []
        q_rows: list[torch.Tensor] = []
        forward_ms = 0.0
        draft_calls = 0
        stop = STOP_NONE
        threshold = policy.threshold

        # 1. draft
        if policy.uses_assistant:
            stop = STOP_LENGTH if budget < k_policy else STOP_MAX_LOOKAHEAD
            for j in range(budget):
                feed = self.ids[self.a_len:] if j == 0 else [drafts[-1]]
                logits, ms = self._forward(self.pair.assistant, self.a_cache, feed, 1)
                self.a_len += len(feed)
                forward_ms += ms
                draft_calls += 1
                q = distribution(logits[0], settings)
                token = self._pick(q)
                confidence = float(q[token])
                if policy.reject_draft(out_len + len(drafts), token):
                    stop = STOP_ORACLE
                    break
                drafts.append(token)
                confidences.append(confidence)
                if settings.sample:
                    q_rows.append(q)
                if token in self.eos:
                    stop = STOP_EOS
                    break
                if policy.stop_after(confidence):
                    stop = STOP_CONFIDENCE
                    break
        t1 = time.perf_counter()
        if policy.probes_verification and drafts:
            trimmed = self._probe_drafts(drafts)  # untimed: the oracle knows what the target will accept
            if len(trimmed) < len(drafts):
                drafts, confidences, stop = trimmed, confidences[: len(trimmed)], STOP_ORACLE
            probe = time.perf_counter() - t1
            t0, t1 = t0 + probe, t1 + probe

        # 2. verify: one target pass over [everything the target has not seen] + drafts
        feed = self.ids[self.t_len:] + drafts
        logits, ms = self._forward(self.pair.target, self.t_cache, feed, len(drafts) + 1)
        self.t_len += len(feed)
        forward_ms += ms
        if settings.sample:
            p = distribution(logits, settings)
            q = torch.stack(q_rows) if q_rows else p[:0]
            accepted, target_token = speculative_accept(p, q, drafts, self.generator)
        else:
            accepted, target_token = greedy_accept(logits, drafts)

        # 3. accept, then cut at EOS and at max_new_tokens (never emit past either)
        new = drafts[:accepted] + [target_token]
        for i, token in enumerate(new):
            if token in self.eos:
                new = new[: i + 1]
                self.done, self.finish_reason = True, "eos"
                break
        if len(new) >= remaining:
            new = new[:remaining]
            if not self.done:
                self.done, self.finish_reason = True, "length"
        old_len = len(self.ids)
        self.ids.extend(new)

        # roll both caches back to what was accepted
        _truncate(self.t_cache, len(self.ids) - 1)
        self.t_len = min(self.t_len, len(self.ids) - 1)
        if self.a_cache is not None:
            self.a_len = min(self.a_len, old_len + accepted, len(self.ids) - 2)
            _truncate(self.a_cache, self.a_len)
        t2 = time.perf_counter()

        iteration = len(self.records) + 1
        rejected = accepted < len(drafts) or stop == STOP_ORACLE
        # the target's view of each emitted position (its logit for the token, and the runner-up): what makes a
        # greedy divergence between two runs explainable (disco.divergence)
        top_logits, top_ids = torch.topk(logits[: len(new)], k=min(2, logits.shape[-1]), dim=-1)
        top_logits, top_ids = top_logits.tolist(), top_ids.tolist()
        chosen = logits[torch.arange(len(new)), torch.tensor(new)].tolist()
        for i, token in enumerate(new):
            if not policy.uses_assistant:
                source, prob = SOURCE_AUTOREGRESSIVE, math.nan
            elif i < accepted:
                source, prob = SOURCE_DRAFT, confidences[i]
            else:
                source, prob = (SOURCE_CORRECTION if rejected else SOURCE_BONUS), math.nan
            other = 1 if top_ids[i][0] == token else 0  # the best token that is not this one
            runner_id = top_ids[i][other] if len(top_ids[i]) > other else -1
            runner_logit = top_logits[i][other] if len(top_logits[i]) > other else math.nan
            self.tokens.append(TokenRecord(self.strategy, out_len + i, token, self.pair.token_text(token), source, prob,
                                           iteration, chosen[i], runner_id, runner_logit))

        policy.update(len(drafts), accepted)
        _sync(self.device)
        t3 = time.perf_counter()
        if policy.probes_verification and not self.done:
            self._rederive_reference()  # untimed, like the reference itself
            t0 += time.perf_counter() - t3
        iteration_ms = (t3 - t0) * 1000.0
        self.elapsed_ms += iteration_ms
        record = IterationRecord(
            strategy=self.strategy, iteration=iteration, lookahead=len(drafts), accepted=accepted, emitted=len(new),
            stop_reason=stop, min_confidence=min(confidences) if confidences else math.nan,
            threshold=threshold if threshold is not None else math.nan,
            max_lookahead=k_policy if policy.uses_assistant else 0,
            draft_ms=(t1 - t0) * 1000.0, verify_ms=(t2 - t1) * 1000.0, iteration_ms=iteration_ms,
            elapsed_ms=self.elapsed_ms, new_tokens=len(self.ids) - self.prompt_len, target_tokens=len(feed),
            draft_calls=draft_calls, forward_ms=forward_ms, confidences=confidences,
            assistant_precision=self.pair.assistant_precision if policy.uses_assistant else "none",
        )
        self.records.append(record)
        return record

    def run(self, interrupt=None) -> "Decoder":
        while not self.done:
            self.step(interrupt)
        return self
