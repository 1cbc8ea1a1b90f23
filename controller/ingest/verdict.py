"""What a decider hands back to ingest for one report, whoever decided it.

Ingest decides nothing; detection, in this process or in its shard processes, decides and
answers with this (controller.ingest.decider), so ingest never imports detection. A verdict
from a shard crosses a pipe as a pickle: everything in it is a plain value or a message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any

from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb


@dataclass(slots=True)
class ReportResult:
    """What the controller needs back from one report: what ingest records, acks and tells its listeners."""

    node_id: str
    stream_token: int
    submitted: float  # the controller's perf_counter when ingest began on the report
    seq: int = 0
    timestamp_ms: int = 0
    error: str = ""  # non-empty: the report was invalid, the stream must end with this
    full_report_needed: bool = False  # a delta report before any full one on this stream
    signals: dict[str, float] = field(default_factory=dict)  # fail-slow signals ({}: not sampled)
    job: str | None = None  # the job the node's ranks named (fail-slow peer group)
    job_steps: Sequence[tpb.JobStepSample] = ()  # what the JobRegistry reads
    # job -> (lowest GPU utilisation %, highest power / limit) of its GPUs here (controller.detect.gpu_jobs)
    job_gpus: dict[str, tuple[float, float]] = field(default_factory=dict)
    lldp: list[ipb.LldpNeighbor] | None = None  # the node's new LLDP neighbours, when the report carried them
    gpus: int = 0
    nics: int = 0
    switch_ports: int = 0
    # Issue 30: the report's accelerator check (None: the report carried none), so a node's
    # judged-or-not follows its reports whether a shard or this process decided them.
    accelerator_check: tpb.AcceleratorCheck | None = None
    # The report itself where it was decided in this process (the node's latest_report);
    # None from a shard, where the report stays.
    report: tpb.Report | None = None
    # A shard keeps its nodes' probe window itself (controller.detect.probe_sums): how many
    # results the report carried, for the controller's counter.
    probe_count: int = 0

    def to_wire(self) -> tuple[Any, ...]:
        """The verdict as a plain tuple of its fields, in order, for the shard wire.

        Why: pickling a slots dataclass runs its ``__getstate__``/``__setstate__`` in Python
        for every field (~11 us to pickle and ~5.5 us to unpickle one verdict, measured), once
        per report on each side of the pipe; a tuple of the same values is pickled in C
        (~0.7 + 0.4 us). ``from_wire`` builds the verdict again.
        """
        return _WIRE(self)

    @classmethod
    def from_wire(cls, values: tuple[Any, ...]) -> ReportResult:
        return cls(*values)


_WIRE = attrgetter(*(f.name for f in fields(ReportResult)))
