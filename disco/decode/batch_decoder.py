"""A live batched greedy decoder on llama.cpp: B sequences in one batch, drafting and verifying together.

It runs the iteration core's rules (``disco.decode.core``: budget capped by the room left, the draft-stop loop with
``drop`` / EOS / ``stop_after``, ``keep``, greedy acceptance, EOS and length cuts, cache lengths) for every row at
once, the way the batched replay (``disco.replay.batched``, ``disco.replay.layouts``) prices them:

* each draft step is one assistant pass over every row that drafts this iteration; a row that already stopped still
  takes part (it feeds its last token again and the result is thrown away, as batched engines spend that slot), so
  the iteration drafts as deep as its deepest drafter and its cache is cropped back afterwards;
* verification is one target pass over every row's unseen tokens and drafts (llama.cpp lays it out as its context
  says: ``streams`` or ``unified``, ``disco.models.llama_batch``).

No slot is refilled: the B requests start together and the batch shrinks as they finish (what the live check of the
batched replay compares, ``disco.bench.batch_live``). Policies that draft from the context (lookup) are not run here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from disco.decode.sampling import draft_features
from disco.errors import InputError
from disco.models.llama_batch import LlamaBatch
from disco.policies import DraftStep, Policy, RunContext, parse_strategy


@dataclass
class _Row:
    policy: Policy
    ids: list[int]
    prompt_len: int
    max_new: int
    t_len: int = 0
    a_len: int = 0
    done: bool = False
    iterations: list[dict] = field(default_factory=list)

    @property
    def out(self) -> list[int]:
        return self.ids[self.prompt_len:]


@dataclass
class BatchIteration:
    draft_ms: float
    verify_ms: float
    wall_ms: float
    rows: int
    draft_passes: int
    target_tokens: list[int]


def _features(logits: np.ndarray) -> tuple[int, float, float, float, float]:
    probs = torch.softmax(torch.from_numpy(logits).float(), dim=-1)
    token = int(probs.argmax())
    return (token, *draft_features(probs, token))


class BatchDecoder:
    """Greedy speculative decoding of several prompts in one llama.cpp batch (module docstring)."""

    def __init__(self, pair, prompts: list[list[int]], spec: str, max_new_tokens: int, layout: str = "streams"):
        if getattr(pair, "engine", None) != "llamacpp":
            raise InputError("the live batched decoder runs on the llama.cpp engine")
        probe = parse_strategy(spec)
        if probe.proposes or probe.probes_verification:
            raise InputError(f"{spec!r}: the live batched decoder runs assistant-drafting rules only")
        if type(probe).batch_shared:
            raise InputError(f"{spec!r}: the live batched decoder runs per-sequence rules; a state shared by the batch "
                             "is replayed only (disco.replay.batched)")
        n_ctx = max(map(len, prompts)) + max_new_tokens + 80
        self.target = LlamaBatch(pair.target_model, len(prompts), layout, n_ctx)
        self.assistant = LlamaBatch(pair.assistant_model, len(prompts), layout, n_ctx)
        self.eos = set(pair.eos_ids)
        self.rows = []
        for ids in prompts:
            policy = parse_strategy(spec)
            policy.bind(RunContext())
            self.rows.append(_Row(policy, list(ids), len(ids), int(max_new_tokens)))
        self.log: list[BatchIteration] = []

    def close(self) -> None:
        self.target.close()
        self.assistant.close()

    def run(self) -> list[list[int]]:
        while any(not r.done for r in self.rows):
            self.step()
        return [r.out for r in self.rows]

    def _draft(self, live: list[int]) -> tuple[dict[int, list[DraftStep]], dict[int, int], int, float]:
        """The batch's drafting: (steps per row, tokens fed per row, passes, ms)."""
        budget, steps, fed, stopped = {}, {}, {}, set()
        for s in live:
            row = self.rows[s]
            room = row.max_new - len(row.out)
            budget[s] = max(0, min(row.policy.budget(), room - 1)) if row.policy.drafts else 0
            steps[s], fed[s] = [], 0
        drafting = [s for s in live if budget[s] > 0]
        last: dict[int, int] = {}
        passes, ms = 0, 0.0
        while drafting and len(stopped) < len(drafting):
            feed = {}
            for s in drafting:
                row = self.rows[s]
                feed[s] = row.ids[row.a_len:] if passes == 0 else [last[s]]
            logits, pass_ms = self.assistant.forward(feed)
            ms += pass_ms
            for s in drafting:
                if s in stopped:
                    continue
                row = self.rows[s]
                fed[s] += len(feed[s])
                row.a_len += len(feed[s])
                token, prob, entropy, margin, top10 = _features(logits[s][-1])
                out_len = len(row.out)
                step = (DraftStep.first(out_len, token, prob, entropy, margin, top10) if not steps[s]
                        else steps[s][-1].then(token, prob, entropy, margin, top10))
                last[s] = token
                if row.policy.drop(step):
                    stopped.add(s)
                    continue
                steps[s].append(step)
                if token in self.eos or row.policy.stop_after(step) or len(steps[s]) >= budget[s]:
                    stopped.add(s)
            passes += 1
        for s in drafting:  # what stopped rows fed in the passes after they stopped is cropped with the rest below
            row = self.rows[s]
            kept = row.policy.keep(steps[s]) if steps[s] else 0
            steps[s] = steps[s][:kept]
        return steps, fed, passes, ms

    def step(self) -> BatchIteration:
        start = time.perf_counter()
        live = [s for s, r in enumerate(self.rows) if not r.done]
        steps, _, passes, draft_ms = self._draft(live)
        feed = {s: self.rows[s].ids[self.rows[s].t_len:] + [st.token for st in steps[s]] for s in live}
        logits, verify_ms = self.target.forward(feed, {s: len(steps[s]) + 1 for s in live})
        for s in live:
            self._accept(s, steps[s], logits[s], len(feed[s]))
        it = BatchIteration(draft_ms, verify_ms, (time.perf_counter() - start) * 1000.0, len(live), passes,
                            [len(feed[s]) for s in live])
        self.log.append(it)
        return it

    def _accept(self, s: int, steps: list[DraftStep], logits: np.ndarray, fed: int) -> None:
        row = self.rows[s]
        drafts = [st.token for st in steps]
        row.t_len += fed
        targets = [int(np.argmax(x)) for x in logits]
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == targets[accepted]:
            accepted += 1
        new = drafts[:accepted] + [targets[accepted]]
        remaining = row.max_new - len(row.out)
        for i, token in enumerate(new):
            if token in self.eos:
                new, row.done = new[: i + 1], True
                break
        if len(new) >= remaining:
            new, row.done = new[:remaining], True
        old_len = len(row.ids)
        row.ids.extend(new)
        row.t_len = min(row.t_len, len(row.ids) - 1)
        row.a_len = min(row.a_len, old_len + accepted, len(row.ids) - 2)
        self.target.crop(s, row.t_len)
        self.assistant.crop(s, row.a_len)
        row.policy.update(steps, accepted)
        row.iterations.append({"lookahead": len(drafts), "accepted": accepted, "emitted": len(new)})
