"""A healer on the in-memory scheduler, over a generated 8-node fabric."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from controller.fabric import generate_fabric
from controller.heal.guards import GuardConfig, Guards
from controller.heal.healer import HealConfig, Healer
from controller.heal.policy import SqliteHealHistory, load_policy
from controller.heal.scheduler.sim import SimScheduler
from controller.heal.spares import SparePool
from controller.heal.states import RemediationStore
from controller.ingest.registry import NodeRegistry
from controller.jobs.registry import JobRegistry
from controller.metrics import ControllerMetrics
from controller.store import Store
from starpulse.core.clock import SYSTEM_CLOCK, Clock

NODES = [f"node-{i:03d}" for i in range(8)]


def make_healer(
    tmp_path: Path,
    mode: str = "enforce",
    db: str = "c.db",
    clock: Clock = SYSTEM_CLOCK,
    config: HealConfig | None = None,
    job_nodes: list[str] | None = None,
) -> tuple[Healer, SimScheduler, Store]:
    """A healer on the in-memory scheduler; its clock is the remediation store's (``clock``)."""
    fabric = generate_fabric(nodes=8, gpus_per_node=8, rails=4, nodes_per_block=4, spines=2, spares=1)
    store = Store(tmp_path / db)
    conn: sqlite3.Connection = store.connection
    states = RemediationStore(conn, clock)
    scheduler = SimScheduler([*fabric.nodes()])
    scheduler.add_job("llm", job_nodes or NODES)
    jobs = JobRegistry(conn, clock)
    jobs.register_job("llm", job_nodes or NODES)
    metrics = ControllerMetrics()
    healer = Healer(
        load_policy(None),
        Guards(GuardConfig(mode=mode), states, conn, clock),
        states,
        SqliteHealHistory(states, clock),
        SparePool(fabric, lambda n: True, states),
        scheduler,
        jobs,
        NodeRegistry(store, metrics, heartbeat_timeout_s=15.0, clock=clock),
        metrics,
        fleet_size=lambda: 8,
        open_incidents=lambda: [],
        config=config or HealConfig(checkpoint_timeout_s=0.2, retry_delay_s=0.01),
        clock=clock,
    )
    return healer, scheduler, store
