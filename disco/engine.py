"""Live decoding: the models behind the iteration core (batch size 1), with a KV cache per model.

One ``Decoder`` runs one strategy on one prompt, one iteration per ``step()``. The loop itself (budget,
draft-stop, accept and cut, cache lengths, the record) is ``disco.core.IterationCore``; this module is
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
import threading
import time
from dataclasses import dataclass

import torch

from disco.core import Drafted, IterationCore, Verdict
from disco.policies import Policy, RunContext
from disco.policies.classic import Autoregressive
from disco.trace import SOURCE_AUTOREGRESSIVE, SOURCE_BONUS, SOURCE_CORRECTION, SOURCE_DRAFT, IterationRecord, TokenRecord

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


def draft_features(q: torch.Tensor, token: int) -> tuple[float, float, float]:
    """What a policy sees of one draft distribution: the drafted token's probability, the entropy (nats) and the
    top-1 minus top-2 margin. Replay tables store the same three numbers (``disco.replay.ChainBuilder``)."""
    top = torch.topk(q, k=min(2, q.shape[-1])).values.tolist()
    margin = top[0] - top[1] if len(top) > 1 else top[0]
    return float(q[token]), float(torch.special.entr(q).sum()), float(margin)


class Decoder:
    """One strategy decoding one prompt: the live backend of the iteration core (``disco.core``).
    Call ``step()`` until ``done``."""

    def __init__(self, pair, prompt_ids: list[int], policy: Policy, settings: DecodeSettings, costs=None):
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
        self.device = pair.device
        self.core = IterationCore(policy, prompt_ids, settings.max_new_tokens, pair.eos_ids, self)
        self.assistant_precision = pair.assistant_precision
        self.t_cache = DynamicCache(config=pair.target.config)
        self.a_cache = DynamicCache(config=pair.assistant.config) if policy.uses_assistant else None
        self.generator = torch.Generator(device=self.device).manual_seed(int(settings.seed))
        self.tokens: list[TokenRecord] = []
        self.interrupted = False
        self.reference_rederived = 0  # oracle: how often its reference was recomputed from its own prefix
        self._interrupt = None  # the running step's interrupt, polled by the layer hooks
        self._untimed_s = 0.0   # the oracle's probes and reference: excluded from this lane's clock
        self._q_rows: list[torch.Tensor] = []
        self._logits: torch.Tensor | None = None
        if policy.uses_assistant:
            install_interrupt_hooks(pair.assistant)
        install_interrupt_hooks(pair.target)
        policy.bind(RunContext(costs=costs, reference=getattr(policy, "reference", None), sample=settings.sample))

    # -- public views -------------------------------------------------------------------------

    @property
    def ids(self) -> list[int]:
        return self.core.ids

    @property
    def records(self) -> list[IterationRecord]:
        return self.core.records

    @property
    def t_len(self) -> int:
        return self.core.t_len

    @property
    def a_len(self) -> int:
        return self.core.a_len

    @property
    def done(self) -> bool:
        return self.core.done

    @property
    def finish_reason(self) -> str | None:
        return self.core.finish_reason

    @property
    def elapsed_ms(self) -> float:
        return self.core.elapsed_ms

    @property
    def output_ids(self) -> list[int]:
        return self.core.output_ids

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

    # -- the core's backend ---------------------------------------------------------------------

    def clock(self) -> float:
        _sync(self.device)
        return (time.perf_counter() - self._untimed_s) * 1000.0

    def draft(self, core: IterationCore, index: int, fed: int) -> Drafted:
        if index == 0:
            self._q_rows = []
        feed = core.ids[core.a_len: core.a_len + fed] if index == 0 else [self._last_draft]
        logits, ms = self._forward(self.pair.assistant, self.a_cache, feed, 1)
        q = distribution(logits[0], self.settings)
        token = int(torch.multinomial(q, 1, generator=self.generator)) if self.settings.sample else int(q.argmax())
        if self.settings.sample:
            self._q_rows.append(q)
        self._last_draft = token
        prob, entropy, margin = draft_features(q, token)
        return Drafted(token, prob, entropy, margin, ms)

    def probe(self, core: IterationCore, drafts: list[int]) -> int:
        """How many of ``drafts`` the target's verification pass over exactly that prefix accepts in full (untimed).
        The pass is the same computation the timed verification will run (same cache, same tokens, same shape),
        so on a deterministic device the timed pass accepts every token kept; each shorter prefix is probed
        again because a different shape can round differently (bf16 near-ties)."""
        start = time.perf_counter()
        while drafts:
            feed = core.ids[core.t_len:] + drafts
            logits, _ = self._forward(self.pair.target, self.t_cache, feed, len(drafts) + 1)
            _truncate(self.t_cache, core.t_len)  # the probe leaves the cache as it found it
            n, _ = greedy_accept(logits, drafts)
            if n == len(drafts):
                break
            drafts = drafts[:n]
        self._untimed_s += time.perf_counter() - start
        return len(drafts)

    def verify(self, core: IterationCore, fed: int, steps) -> Verdict:
        drafts = [s.token for s in steps]
        feed = core.ids[core.t_len:] + drafts
        logits, ms = self._forward(self.pair.target, self.t_cache, feed, len(drafts) + 1)
        if self.settings.sample:
            p = distribution(logits, self.settings)
            q = torch.stack(self._q_rows[: len(drafts)]) if drafts else p[:0]
            accepted, token = speculative_accept(p, q, drafts, self.generator)
        else:
            accepted, token = greedy_accept(logits, drafts)
        self._logits = logits
        return Verdict(accepted, token, ms)

    def rollback(self, t_len: int, a_len: int) -> None:
        _truncate(self.t_cache, t_len)
        if self.a_cache is not None:
            _truncate(self.a_cache, a_len)

    def commit(self, core: IterationCore, new: list[int], steps, accepted: int, rejected: bool, iteration: int) -> None:
        """Per-token records, with the target's view of each emitted position (its logit for the token and the
        runner-up): what makes a greedy divergence between two runs explainable (disco.divergence)."""
        logits = self._logits
        out_len = core.out_len - len(new)
        top_logits, top_ids = torch.topk(logits[: len(new)], k=min(2, logits.shape[-1]), dim=-1)
        top_logits, top_ids = top_logits.tolist(), top_ids.tolist()
        chosen = logits[torch.arange(len(new)), torch.tensor(new)].tolist()
        for i, token in enumerate(new):
            if not self.policy.uses_assistant:
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
        follow = Decoder(self.pair, list(core.ids), Autoregressive(), DecodeSettings(max_new_tokens=remaining))
        self.policy.reference = out + follow.run(self._interrupt).output_ids
        self.reference_rederived += 1
        self._untimed_s += time.perf_counter() - start

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
            return self.core.step()
        finally:
            self._interrupt = None

    def run(self, interrupt=None) -> "Decoder":
        while not self.done:
            self.step(interrupt)
        return self
