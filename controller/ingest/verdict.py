"""What detection hands back to ingest for one report, whoever decided it.

Ingest decides nothing; detection, in this process or in its shard processes, decides and
answers with this, so ingest never imports detection.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ReportResult:
    """What the controller needs back from one report (it never decodes the report itself)."""

    node_id: str
    stream_token: int
    submitted: float  # the controller's perf_counter when it handed the report over
    seq: int = 0
    timestamp_ms: int = 0
    error: str = ""  # non-empty: the report was invalid, the stream must end with this
    full_report_needed: bool = False  # a delta report before any full one on this stream
    signals: dict[str, float] = field(default_factory=dict)  # fail-slow signals
    job: str | None = None
    job_steps: bytes = b""  # a Report holding only job_steps (JobRegistry reads those)
    lldp: list[bytes] | None = None  # the node's new LLDP neighbours, when the report carried them
    gpus: int = 0
    nics: int = 0
