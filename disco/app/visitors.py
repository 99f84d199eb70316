"""A shared queue no visitor can take over: a bounded queue, and at most ``DISCO_RUNS_PER_VISITOR`` runs per visitor
waiting or running at once (a visitor is a session: a page or a client; on a hosted app also a client address).

The check runs when a run asks to join the queue (Gradio's ``validator`` of the event, called before the event is
queued), so a client that fires 50 calls holds one place and the other 49 are refused at once with one line that says
why and where their run stands; Gradio's ``max_size`` bounds the queue itself ("Queue is full"). The queue's own
records (its waiting and running events, pinned Gradio version) are the truth: a run that ended, was cancelled or
whose client went away frees the visitor's place with no bookkeeping of ours that could leak.

Behind a proxy (Hugging Face Spaces) every request comes from the proxy's address; the client's is the one the
trusted proxy appended to ``X-Forwarded-For``: ``DISCO_PROXY_HOPS`` proxies are trusted (1 on a Space, 0 elsewhere),
and the address that many entries from the right is the client's (entries further left are the client's own claims).
"""

from __future__ import annotations

import inspect
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

import gradio as gr

from disco.limits import env_int


@dataclass(frozen=True)
class QueueRules:
    per_visitor: int = 1      # runs one visitor may have waiting or running (0: no limit)
    by_address: bool = False  # a visitor is also its client address (on a Space: many sessions, one person)
    proxy_hops: int = 0       # trusted proxies in front of the app (their X-Forwarded-For entries name the client)
    max_size: int = 32        # runs the queue holds at most (Gradio's max_size)

    @classmethod
    def from_env(cls) -> "QueueRules":
        on_space = bool(os.environ.get("SPACE_ID"))
        return cls(per_visitor=env_int("DISCO_RUNS_PER_VISITOR", 1, 0, 1000),
                   by_address=bool(env_int("DISCO_LIMIT_BY_ADDRESS", 1 if on_space else 0, 0, 1)),
                   proxy_hops=env_int("DISCO_PROXY_HOPS", 1 if on_space else 0, 0, 10),
                   max_size=env_int("DISCO_QUEUE_MAX", 32, 1, 100_000))

    def words(self) -> str:
        who = "visitor (session or address)" if self.by_address else "visitor (session)"
        each = (f"{self.per_visitor} run{'s' if self.per_visitor > 1 else ''} per {who}" if self.per_visitor
                else "no limit per visitor")
        return f"queue: at most {self.max_size} runs, {each}"


def client_address(request, hops: int) -> str:
    """The client's address: the entry ``hops`` from the right of X-Forwarded-For (added by the trusted proxies),
    else the address the request came from."""
    if request is None:
        return ""
    if hops > 0:
        headers = request.headers
        lines = headers.getlist("x-forwarded-for") if hasattr(headers, "getlist") else [headers.get("x-forwarded-for", "")]
        forwarded = [part.strip() for line in lines for part in line.split(",") if part.strip()]  # every header line
        if len(forwarded) >= hops:
            return forwarded[-hops]
    client = getattr(request, "client", None)
    return getattr(client, "host", "") or ""


class VisitorGate:
    """Refuses a run when its visitor already has ``rules.per_visitor`` events waiting or running (module doc).

    Gradio runs the check, then appends the event to its queue: two calls that arrive together could both find the
    queue empty. So each admitted event is also held here, under a lock, until the queue's records show it (Gradio
    records every event it queued, with its session and time, ``event_analytics``; finished ones too) or
    ``RESERVE_S`` seconds have passed, and a visitor's holdings are their queued events plus their admitted ones the
    queue does not show yet."""

    RESERVE_S = 5.0

    def __init__(self, rules: QueueRules, queue: Callable[[], object]):
        self.rules = rules
        self._queue = queue  # the app's Gradio queue, read when a run asks to join (it exists only once launched)
        self._lock = threading.Lock()
        self._admitted: list[tuple[str | None, str | None, float]] = []  # (session, address, wall time)

    def holdings(self, session: str | None, address: str | None) -> list[int | None]:
        """The visitor's queued events, whatever they run: None for one that is running, its 1-based place among its
        group's waiting events for one that waits."""
        queue = self._queue()
        if queue is None:
            return []

        def theirs(event) -> bool:
            same_session = session is not None and event.session_hash == session
            same_address = address is not None and client_address(event.request, self.rules.proxy_hops) == address
            return same_session or same_address

        running = [None for job in queue.active_jobs if job for event in job if theirs(event)]
        places = [i + 1 for group in queue.event_queue_per_concurrency_id.values()
                  for i, event in enumerate(group.queue) if theirs(event)]
        return running + places

    def _unseen(self, session: str | None, address: str | None, now: float) -> int:
        """Forget admitted events the queue's records show (queued at or after their admission) or older than
        ``RESERVE_S``; how many of this visitor's are left."""
        queue = self._queue()
        latest: dict[str, float] = {}
        for record in (getattr(queue, "event_analytics", None) or {}).values():
            s, t = record.get("session_hash"), record.get("time") or 0.0
            if s is not None and t > latest.get(s, 0.0):
                latest[s] = t
        self._admitted = [(s, a, t) for s, a, t in self._admitted
                          if now - t < self.RESERVE_S and not (s is not None and latest.get(s, 0.0) >= t)]
        return sum(1 for s, a, _ in self._admitted
                   if (session is not None and s == session) or (address is not None and a == address))

    def refusal(self, request: gr.Request | None) -> str | None:
        """None when this request's visitor may queue another event (which is then reserved), else the one line that
        says why."""
        if not self.rules.per_visitor or request is None:
            return None
        session = getattr(request, "session_hash", None)
        address = client_address(request, self.rules.proxy_hops) if self.rules.by_address else None
        with self._lock:
            held = self.holdings(session, address)
            now = time.time()  # the clock Gradio's records use
            if len(held) + self._unseen(session, address, now) < self.rules.per_visitor:
                self._admitted.append((session, address, now))
                return None
        waiting = [p for p in held if p is not None]
        where = (f"it waits at place {waiting[0]} in the queue" if waiting else
                 "it is running now" if held else "it is joining the queue")
        return (f"you already have a run on this shared app ({where}): one run per visitor at a time "
                f"(DISCO_RUNS_PER_VISITOR={self.rules.per_visitor}); press Stop or wait for it to finish")

    def validator_for(self, handler: Callable, inputs: int) -> Callable:
        """A Gradio validator with ``handler``'s signature (Gradio passes it the same ``inputs`` values and the
        request, and wants one verdict per input): the refusal is the first input's verdict."""
        def validate(*args, **kwargs):
            request = next((a for a in [*args, *kwargs.values()] if isinstance(a, gr.Request)), None)
            message = self.refusal(request)
            first = gr.validate(False, message) if message else gr.validate(True, "")
            return (first, *[gr.validate(True, "") for _ in range(inputs - 1)])

        # the handler's parameters, so Gradio passes the same values; its request parameter typed with the class
        # itself (the handler's annotations may be strings that only its own module can resolve)
        params = [p.replace(annotation=gr.Request if "Request" in str(p.annotation) else inspect.Parameter.empty)
                  for p in inspect.signature(handler).parameters.values()]
        validate.__signature__ = inspect.Signature(params)
        validate.__annotations__ = {p.name: gr.Request for p in params if p.annotation is gr.Request}
        return validate
