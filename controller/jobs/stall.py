"""Hang detection without the job's help: a job's GPUs busy at idle power, its NICs flat.

Most jobs never link the job library. A job stuck in a collective still leaves a signature
in what every agent reads anyway (soperator #796, ClusterMAX's "stalled NCCL job"; ByteRobust
acts on zero RDMA traffic): its kernels spin waiting on a peer, so NVML counts the GPU as
busy (utilisation is the share of time a kernel runs) while it draws idle-level power, and
no data moves on its nodes' RDMA NICs. When that holds on every node of the job, for every
sample of a window, the job is judged hung: a ``job_hang`` condition (rule ``job_hang_gpu``,
category ``hang``) that the correlator groups into the same ``job_hang`` incident as the
job library's verdict.

Which GPUs are the job's comes from the agents' GPU process lists (``Report.gpu_processes``:
NVML's compute processes, each with the Slurm job its cgroup or environment names); the job
is named by the scheduler's id. The per-report numbers are read where the report is decoded
(``controller.detect.gpu_jobs``); the NIC rate is fail-slow's sampled ``nic_gbps``.

Never a hang: one node alone (a job is judged across all its nodes), a job whose NICs move,
a node whose samples stop (its window empties: no verdict), an idle GPU (not busy).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import structlog

from controller.detect.model import Condition, ConditionChange
from controller.jobs.stacks import StackVerdict
from starpulse.core import vocab
from starpulse.core.clock import Clock
from starpulse.core.schema import setting

log = structlog.get_logger(__name__)

RULE = "job_hang_gpu"
CATEGORY = "hang"


@dataclass
class StallConfig:
    """The GPU-signature rule: thresholds as data, each with its reason."""

    window_s: float = setting(
        40.0,
        "Seconds the signature must hold on every node of the job before it is a hang: long enough to "
        "span several reports and a NIC sample or two, short enough to be seen within a minute (Kuaishou)",
        gt=0,
    )
    busy_util_pct: float = setting(
        95.0,
        "GPU utilisation % a job's least busy GPU must reach: a kernel spinning in a stuck collective "
        "keeps NVML's utilisation (share of time a kernel runs) at ~100 %",
        gt=0,
        le=100,
    )
    idle_power_fraction: float = setting(
        0.25,
        "Highest power of a job's GPUs as a fraction of their limit: an H100 spinning on a flag draws "
        "~90-120 W of 700 W; real work at 95 % utilisation draws well over half its limit",
        gt=0,
        le=1,
    )
    flat_nic_gbps: float = setting(
        0.1,
        "Gb/s (tx + rx over the node's RDMA ports) at or below which a node's NICs are flat: training "
        "moves tens to hundreds of Gb/s; 0.1 leaves room for keep-alives and management traffic",
        ge=0,
    )
    min_samples: int = setting(
        3, "GPU samples each node of the job needs in the window (one per report) before it is judged", ge=1
    )


@dataclass
class _NodeJob:
    """One job's samples on one node: (controller ms, signature holds) per report."""

    samples: deque[tuple[int, bool]] = field(default_factory=deque)
    util: float = 0.0
    power: float = 0.0


class GpuStallDetector:
    """Fed each report's per-job GPU signature and NIC rate; judges jobs across their nodes."""

    def __init__(self, config: StallConfig, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        self._jobs: dict[str, dict[str, _NodeJob]] = {}  # job -> node -> samples
        self._nic: dict[str, deque[tuple[int, float]]] = {}  # node -> (ms, Gb/s)
        self._open: dict[str, Condition] = {}

    def observe(self, node: str, job_gpus: dict[str, tuple[float, float]], nic_gbps: float | None) -> None:
        """One report of ``node``: each job's (lowest util %, highest power fraction), its NIC rate if sampled."""
        now = self.clock.time_ms()
        cfg = self.config
        if nic_gbps is not None:
            self._nic.setdefault(node, deque()).append((now, nic_gbps))
        for job, (util, power) in job_gpus.items():
            nj = self._jobs.setdefault(job, {}).setdefault(node, _NodeJob())
            nj.samples.append((now, util >= cfg.busy_util_pct and power <= cfg.idle_power_fraction))
            nj.util, nj.power = util, power

    def evaluate(self) -> list[ConditionChange]:
        """Open, keep or resolve each job's ``job_hang_gpu`` condition."""
        now = self.clock.time_ms()
        cutoff = now - int(self.config.window_s * 1000)
        for rates in self._nic.values():
            while rates and rates[0][0] < cutoff:
                rates.popleft()
        changes: list[ConditionChange] = []
        for job in sorted(self._jobs):
            nodes = self._jobs[job]
            for node in list(nodes):
                samples = nodes[node].samples
                while samples and samples[0][0] < cutoff:
                    samples.popleft()
                if not samples:
                    del nodes[node]  # the job left this node, or its reports stopped
            if not nodes:
                del self._jobs[job]
                changes += self._resolve(job, now, "no samples")
                continue
            verdict = self._judge(job, nodes, now)
            if verdict is None:
                changes += self._resolve(job, now, "signature gone")
            elif job not in self._open:
                changes.append(self._raise(job, verdict, now))
        return changes

    def active(self) -> list[Condition]:
        return [self._open[j] for j in sorted(self._open)]

    def annotate(self, job: str, stacks: StackVerdict) -> list[ConditionChange]:
        """The stacks of the job's GPU processes (by Slurm id): grouped, and the outliers named."""
        cond = self._open.get(job)
        if cond is None:
            return []
        stacks.at_ms = self.clock.time_ms()
        evidence = {**cond.evidence, "stacks": {**stacks.to_evidence(), "at_ms": stacks.at_ms}}
        if stacks.outliers:
            evidence["suspects"] = [{"rank": o.rank, "node": o.node, "pid": o.pid} for o in stacks.outliers]
            evidence["suspect_nodes"] = sorted({o.node for o in stacks.outliers})
            evidence["suspects_from"] = "stacks"
        cond.evidence = evidence  # a new dict: the incident's summary holds the old one
        nodes = evidence["suspect_nodes"]
        cond.node = nodes[0] if len(nodes) == 1 else None
        cond.message = f"{cond.message.split('; stacks:')[0]}; stacks: {stacks.reason}"
        log.warning("job_hang_stacks", job=job, source="gpu_signature", reason=stacks.reason, outliers=nodes)
        return [ConditionChange("updated", cond)]

    def _judge(self, job: str, nodes: dict[str, _NodeJob], now: int) -> dict[str, Any] | None:
        """The evidence when every node held the signature for the whole window, else None."""
        cfg = self.config
        window_ms = int(cfg.window_s * 1000)
        per_node = []
        for name in sorted(nodes):
            nj = nodes[name]
            samples = nj.samples
            if len(samples) < cfg.min_samples or now - samples[0][0] < window_ms * 0.8:
                return None  # not seen long enough to say
            if not all(ok for _, ok in samples):
                return None
            nic = self._nic.get(name)
            if not nic or any(gbps > cfg.flat_nic_gbps for _, gbps in nic):
                return None  # traffic moves (or was never sampled): not this signature
            per_node.append(
                {
                    "node": name,
                    "min_util_pct": round(nj.util, 1),
                    "max_power_fraction": round(nj.power, 3),
                    "nic_gbps": round(max(g for _, g in nic), 3),
                }
            )
        return {
            "job": job,
            "source": "gpu_signature",
            "shape": "stalled",
            "window_s": cfg.window_s,
            "nodes": [n["node"] for n in per_node],
            "per_node": per_node,
            "suspects": [],
            "suspect_nodes": [],
        }

    def _raise(self, job: str, evidence: dict[str, Any], now: int) -> ConditionChange:
        cfg = self.config
        nodes = evidence["nodes"]
        cond = self._open[job] = Condition(
            rule=RULE,
            component=f"job:{job}",
            component_type="job",
            category=CATEGORY,
            node=None,
            severity="critical",
            action=vocab.ACTION_RESTART_APP,
            message=(
                f"job {job}: GPUs on all {len(nodes)} node(s) busy (>= {cfg.busy_util_pct:g} %) at idle power "
                f"(<= {cfg.idle_power_fraction:.0%} of limit) with RDMA traffic flat for {cfg.window_s:g}s: "
                "a collective that does not complete (no job library: no rank named)"
            ),
            first_seen_ms=now,
            last_seen_ms=now,
            evidence=evidence,
        )
        log.warning("job_hang_detected", job=job, source="gpu_signature", nodes=nodes)
        return ConditionChange("opened", cond)

    def _resolve(self, job: str, now: int, why: str) -> list[ConditionChange]:
        cond = self._open.pop(job, None)
        if cond is None:
            return []
        cond.resolved_ms = now
        cond.evidence = {**cond.evidence, "resolved_because": why}
        log.info("job_hang_cleared", job=job, source="gpu_signature", why=why)
        return [ConditionChange("resolved", cond)]
