"""The seam between ingest and whoever decides a report.

Ingest reads an agent's messages, checks and rate-limits them, and records what was
decided; it never decides, and it does not know where the deciding happens. Detection
does, in this process (``controller.detect.pipeline.Detection``) or in its shard
processes (``controller.detect.shards.DetectShards``); the service picks one and hands it
to the ``TelemetryServicer``, which binds itself as the sink of every verdict. Either way
a report comes back as one ``ReportResult`` and is recorded, acked or refused by one path.

What every implementation keeps (tests/controller/ingest/test_decider_contract.py):

- Each report it takes gets exactly one verdict through the sink, during the call or
  later; a verdict names the node and its stream (``node.stream_token`` when handed over).
- A report it finds invalid comes back with ``error`` set, and the stream ends with it.
- A delta report before any full one on the node's current stream comes back with
  ``full_report_needed`` (the ack then asks the agent for a full report).
- ``full`` is True while too many reports wait for verdicts; ``room()`` returns once it
  is False again. Ingest only awaits ``room()`` when ``full`` says so, so a decider that
  is never full costs no await per report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from controller.ingest.registry import NodeRecord
from controller.ingest.verdict import ReportResult
from starpulse.v1 import service_pb2 as spb


class ReportDecider(Protocol):
    """Takes valid or undecoded reports from ingest and answers each with a ``ReportResult``."""

    def bind(self, on_verdict: Callable[[ReportResult], None]) -> None:
        """Where verdicts go (the TelemetryServicer); set once, before the first report."""

    def decide(self, node: NodeRecord, message: spb.AgentMessage, started: float) -> None:
        """An AgentMessage whose report passed validation (a direct stream decoded it).

        ``started`` is the ``time.perf_counter()`` when ingest began on the message: the
        verdict carries it back for the decision-time histogram.
        """

    def decide_raw(self, node: NodeRecord, agent_message: bytes, started: float) -> bool:
        """The bytes of an AgentMessage that should hold a report, as a relay forwarded them.

        False: not taken, because it does not decode or validate here; no verdict follows,
        and the stream reads the bytes again itself, which ends it with the right status.
        A decider that takes every report (a shard decodes them) answers a bad one with an
        ``error`` verdict instead.
        """

    @property
    def full(self) -> bool:
        """True while too many reports wait for verdicts: wait in ``room()`` before the next."""

    async def room(self) -> None:
        """Return once ``full`` is False again (backpressure to the streams and relays)."""
