"""Where a fault's time goes: one trace per event, from the agent's read to the delivered webhook.

An event carries three stamps from its agent (``read_us``, ``buffered_us``, ``sent_us``); the
controller adds ``received`` (the stream read it), ``condition`` (a rule opened a condition on
it), ``incident`` (the correlator opened an incident over that condition), ``outbox`` (the
notice was queued) and ``delivered`` (the first receiver answered 2xx). Each stage's share
(from the stage before it) goes to ``starpulse_event_stage_seconds{stage}`` as soon as it is
known, so the shares of one trace add up to its end-to-end time, and a finished trace is
logged once (``event_latency``) with every share in milliseconds.

Stamps are wall-clock seconds (``time.time()``): the agent's are from another process, and a
metric duration is real time even when detection runs on a ``FakeClock``. A share that comes
out negative (an agent clock behind the controller's) is recorded as 0. Traces are bounded:
at most ``max_open`` waiting for their next stage (the oldest is dropped), and only events
that open a condition get past ``received``.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog

log = structlog.get_logger(__name__)

# In the order they happen; each one's share is measured from the one before it.
STAGES = ("read", "buffered", "sent", "received", "condition", "incident", "outbox", "delivered")
AGENT_STAGES = STAGES[:3]

Key = tuple[str, str]


@dataclass
class Trace:
    """One event's way through the stages: stage -> wall-clock seconds."""

    node: str
    kind: str
    component: str
    marks: dict[str, float] = field(default_factory=dict)
    incident: str = ""

    def shares(self) -> dict[str, float]:
        """Each marked stage's seconds since the marked stage before it (the first: 0)."""
        out: dict[str, float] = {}
        prev: float | None = None
        for stage in STAGES:
            at = self.marks.get(stage)
            if at is None:
                continue
            out[stage] = 0.0 if prev is None else max(0.0, at - prev)
            prev = at if prev is None else max(prev, at)
        return out

    def total_s(self) -> float:
        return sum(self.shares().values())


class StageTracker:
    """Follows events to the webhook; ``observe(stage, seconds)`` feeds the histogram."""

    def __init__(
        self,
        observe: Callable[[str, float], None],
        now: Callable[[], float] = time.time,
        max_open: int = 10_000,
        keep_done: int = 256,
    ) -> None:
        self._observe = observe
        self._now = now
        self._max_open = max_open
        self._events: OrderedDict[tuple[str, int], Trace] = OrderedDict()  # received, no condition yet
        self._conditions: OrderedDict[Key, Trace] = OrderedDict()  # condition opened, no incident yet
        self._incidents: OrderedDict[str, Trace] = OrderedDict()  # incident opened, not delivered
        self.done: deque[Trace] = deque(maxlen=keep_done)  # finished traces, newest last (bench, tests)

    # -- marks, in stage order ------------------------------------------------------------

    def received(self, node: str, seq: int, kind: str, component: str, stamps_us: Iterable[int]) -> None:
        """An event read off a stream; its agent stamps (read, buffered, sent) count from here."""
        trace = Trace(node, kind, component)
        for stage, us in zip(AGENT_STAGES, stamps_us, strict=True):
            if us > 0:
                trace.marks[stage] = us / 1e6
        self._mark(trace, "received")
        self._put(self._events, (node, seq), trace)

    def conditions_opened(self, node: str, seqs: Iterable[int], keys: Iterable[Key], at: float | None = None) -> None:
        """Conditions a batch of the node's events opened: each follows the batch's first traced event.

        ``at``: when they opened (wall-clock seconds), where that was elsewhere (a detection
        shard's process); None: now.
        """
        trace = None
        for seq in seqs:
            found = self._events.pop((node, seq), None)
            if found is not None and trace is None:
                trace = found
        if trace is None:
            return
        keys = list(keys)
        if not keys:
            return
        self._mark(trace, "condition", at)
        for key in keys:
            self._put(self._conditions, key, trace)

    def incident_opened(self, incident_id: str, keys: Iterable[Key]) -> None:
        """An incident over traced conditions: the earliest of their traces goes on with it."""
        traces = [t for t in (self._conditions.pop(k, None) for k in keys) if t is not None]
        if not traces:
            return
        trace = min(traces, key=lambda t: t.marks.get("received", 0.0))
        trace.incident = incident_id
        self._mark(trace, "incident")
        self._put(self._incidents, incident_id, trace)

    def queued(self, incident_id: str) -> None:
        """The incident's first notice is in the outbox."""
        trace = self._incidents.get(incident_id)
        if trace is not None and "outbox" not in trace.marks:
            self._mark(trace, "outbox")

    def delivered(self, incident_id: str) -> None:
        """A receiver took the incident's notice: the trace is complete."""
        trace = self._incidents.get(incident_id)
        if trace is None or "outbox" not in trace.marks:
            return
        del self._incidents[incident_id]
        self._mark(trace, "delivered")
        self.done.append(trace)
        log.info(
            "event_latency",
            incident=incident_id,
            node=trace.node,
            kind=trace.kind,
            component=trace.component,
            total_ms=round(trace.total_s() * 1000, 2),
            **{f"{stage}_ms": round(s * 1000, 2) for stage, s in trace.shares().items() if stage != STAGES[0]},
        )

    def open_traces(self) -> int:
        return len(self._events) + len(self._conditions) + len(self._incidents)

    # -- internals --------------------------------------------------------------------------

    def _mark(self, trace: Trace, stage: str, at: float | None = None) -> None:
        trace.marks[stage] = self._now() if at is None else at
        if stage == "received":
            shares = trace.shares()
            for agent_stage in AGENT_STAGES[1:]:  # the agent's own shares arrive with the event
                if agent_stage in shares:
                    self._observe(agent_stage, shares[agent_stage])
        share = trace.shares().get(stage)
        if share is not None and stage != STAGES[0] and len(trace.marks) > 1:
            self._observe(stage, share)

    def _put(self, table: OrderedDict[Any, Trace], key: object, trace: Trace) -> None:
        table[key] = trace
        table.move_to_end(key)
        while len(table) > self._max_open:
            table.popitem(last=False)
