"""Checks on what agents send, before it reaches the store or detection.

The network is not trusted: sizes are bounded, enums must be known, numbers finite.
A failed check names the field so the agent's operator can find the bug.
"""

from __future__ import annotations

import math
from operator import attrgetter

from starpulse.core.eventlimits import SQLITE_INT_MAX, event_problem
from starpulse.core.joblimits import MAX_CHECKPOINT_PATH, MAX_JOB_NAME, job_name_problem, step_time_problem
from starpulse.core.names import InvalidName, validate_node_id
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb

MAX_GPUS = 64
MAX_NICS = 128
MAX_SWITCH_PORTS = 1024
MAX_COUNTERS = 1024
MAX_TEXT = 4096
MAX_NAME = 256
_NIC_CHECKED = attrgetter("counters", "hw_counters", "netdev_stats", "rate_gbps")  # one C-level read a NIC
_GPU_FINITE = ("temperature_c", "power_w", "utilization_gpu_pct", "power_limit_w")  # checked in this order


class InvalidMessage(ValueError):
    """A message that is well-formed protobuf but not acceptable."""


def _finite(name: str, value: float) -> None:
    if not math.isfinite(value):
        raise InvalidMessage(f"{name} is not a finite number ({value})")


def validate_hello(hello: spb.Hello) -> None:
    try:
        validate_node_id(hello.node_id)
    except InvalidName as exc:
        raise InvalidMessage(str(exc)) from None
    if hello.role not in (ipb.NODE_ROLE_COMPUTE, ipb.NODE_ROLE_SWITCH):
        raise InvalidMessage(f"hello.role {hello.role} is not compute or switch")
    inv = hello.inventory
    if len(inv.gpus) > MAX_GPUS or len(inv.nics) > MAX_NICS or len(inv.switch_ports) > MAX_SWITCH_PORTS:
        raise InvalidMessage("inventory too large")
    if len(hello.buffer_epoch) > MAX_NAME:
        raise InvalidMessage("hello.buffer_epoch too long")
    for name in ("next_event_seq", "oldest_buffered_event_seq"):
        if getattr(hello, name) > SQLITE_INT_MAX:
            raise InvalidMessage(f"hello.{name} {getattr(hello, name)} is past the largest storable ({SQLITE_INT_MAX})")


def validate_report(report: tpb.Report) -> None:
    """Runs for every report, so each repeated field is walked once and each number read once.

    An unset optional number reads as 0.0, which is finite, so presence need not be asked:
    only a field that is set can fail. The field-by-field message is built only on failure.
    """
    if report.seq == 0:
        raise InvalidMessage("report.seq must start at 1")
    if report.seq > SQLITE_INT_MAX:
        raise InvalidMessage(f"report.seq {report.seq} is past the largest storable ({SQLITE_INT_MAX})")
    gpus = report.gpus
    nics = report.nics
    if len(gpus) > MAX_GPUS:
        raise InvalidMessage(f"report has {len(gpus)} GPUs (max {MAX_GPUS})")
    if len(nics) > MAX_NICS:
        raise InvalidMessage(f"report has {len(nics)} NIC ports (max {MAX_NICS})")
    if len(report.switch_ports) > MAX_SWITCH_PORTS:
        raise InvalidMessage(f"report has {len(report.switch_ports)} switch ports (max {MAX_SWITCH_PORTS})")
    isfinite = math.isfinite
    for gpu in gpus:
        if not (
            isfinite(gpu.temperature_c)
            and isfinite(gpu.power_w)
            and isfinite(gpu.utilization_gpu_pct)
            and isfinite(gpu.power_limit_w)
        ):
            for field in _GPU_FINITE:
                if gpu.HasField(field):
                    _finite(f"gpus[{gpu.index}].{field}", getattr(gpu, field))
    for nic in nics:
        counters, hw_counters, netdev_stats, rate = _NIC_CHECKED(nic)
        if len(counters) + len(hw_counters) + len(netdev_stats) > MAX_COUNTERS:
            raise InvalidMessage(f"nic {nic.rdma_device} carries too many counters")
        if not isfinite(rate):
            raise InvalidMessage(f"nic {nic.rdma_device}.rate_gbps is not a finite number ({rate})")
    for step in report.job_steps:
        _job_step(step)


def _job_step(step: tpb.JobStepSample) -> None:
    """The limits the agent's job socket applies too (starpulse.core.joblimits): one definition."""
    problem = job_name_problem(step.job)
    if problem is not None:
        raise InvalidMessage(f"job_steps[{step.job[:MAX_JOB_NAME]!r}].job {problem}")
    problem = step_time_problem(step.step_time_s)
    if problem is None and len(step.checkpoint_path) > MAX_CHECKPOINT_PATH:
        problem = f"checkpoint_path is longer than {MAX_CHECKPOINT_PATH} characters"
    elif problem is not None:
        problem = f"step_time_s {problem}"
    if problem is not None:
        raise InvalidMessage(f"job_steps[{step.job}/{step.rank}].{problem}")


def validate_event(event: tpb.Event) -> None:
    if event.seq == 0:
        raise InvalidMessage("event.seq must start at 1")
    if event.kind not in tpb.EventKind.values() or event.kind == tpb.EVENT_KIND_UNSPECIFIED:
        raise InvalidMessage(f"event {event.seq} has unknown kind {event.kind}")
    if event.severity not in tpb.Severity.values() or event.severity == tpb.SEVERITY_UNSPECIFIED:
        raise InvalidMessage(f"event {event.seq} has unknown severity {event.severity}")
    problem = event_problem(event)  # the limits the agent's buffer fits events to (one definition)
    if problem is not None:
        raise InvalidMessage(problem)
