"""Scheduler backends behind one interface: Slurm, Kubernetes, exec hooks and an in-memory sim.

The remediation orchestrator talks only to `Scheduler`; which backend runs is a deployment
choice. Kubernetes is imported lazily because the official client is heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from controller.heal.scheduler.base import (
    ActionResult,
    NodeStatus,
    Scheduler,
    SchedulerError,
    sanitize_reason,
    validate_job_id,
)
from controller.heal.scheduler.exec import ExecScheduler
from controller.heal.scheduler.sim import SimScheduler
from controller.heal.scheduler.slurm import SlurmScheduler

if TYPE_CHECKING:
    from controller.heal.scheduler.kubernetes import KubernetesScheduler

__all__ = [
    "ActionResult",
    "ExecScheduler",
    "KubernetesScheduler",
    "NodeStatus",
    "Scheduler",
    "SchedulerError",
    "SimScheduler",
    "SlurmScheduler",
    "sanitize_reason",
    "validate_job_id",
]


def __getattr__(name: str) -> Any:
    if name == "KubernetesScheduler":
        from controller.heal.scheduler.kubernetes import KubernetesScheduler

        return KubernetesScheduler
    raise AttributeError(name)
