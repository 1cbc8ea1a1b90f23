"""The remediation orchestrator with the in-memory scheduler: decide, guard, act, verify."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from controller.detect.model import Incident
from controller.heal.guards import GuardConfig
from controller.heal.healer import HealConfig, Healer
from controller.heal.scheduler.base import ActionResult
from controller.heal.states import NodeHealState
from starpulse.core.clock import FakeClock
from tests.support.heal import NODES
from tests.support.heal import make_healer as _healer


def _incident(iid: str, kind: str, root: str, node: str, action: str = "reset_gpu", severity: str = "critical"):
    return Incident(
        iid,
        kind,
        root,
        "gpu" if kind == "gpu_fault" else "node",
        [node],
        [],
        severity,
        action,
        [],
        int(time.time() * 1000),
    )


class TestHealer:
    async def test_gpu_fault_drains_takes_a_spare_in_the_same_block_and_requeues(self, tmp_path: Path) -> None:
        """A GPU fault evicts its node: drained with a reason, spare allocated, job requeued away from it."""
        healer, sched, _ = _healer(tmp_path)
        await healer.handle(_incident("inc-1", "gpu_fault", "node-002/gpu-1", "node-002"))
        kinds = [(a[0], a[1]) for a in sched.actions]
        assert ("drain", "node-002") in kinds and ("requeue", "llm") in kinds
        assert "node-002" not in sched.jobs["llm"].nodes and "node-008" in sched.jobs["llm"].nodes
        assert [(e.node, e.replacement) for e in healer.evictions] == [("node-002", "node-008")]
        # reset_gpu: evicted, then in repair while the agent is asked to reset the GPU
        assert healer.store.state("node-002") == NodeHealState.REPAIRING
        history = [(str(t.to_state), t.actor) for t in healer.store.history("node-002")]
        assert ("evicted", "starpulse") in history and history[-1] == ("repairing", "starpulse")
        job = healer.jobs.job("llm")
        assert job is not None and job.restarts == 1

    async def test_the_same_incident_twice_evicts_once(self, tmp_path: Path) -> None:
        """An incident update after the eviction does not drain or requeue again."""
        healer, sched, _ = _healer(tmp_path)
        inc = _incident("inc-1", "gpu_fault", "node-002/gpu-1", "node-002")
        await healer.handle(inc)
        before = list(sched.actions)
        await healer.handle(inc)
        assert sched.actions == before and len(healer.evictions) == 1

    async def test_switch_fault_touches_no_node(self, tmp_path: Path) -> None:
        """A leaf-switch incident affecting four nodes is alert-only: no scheduler action at all."""
        healer, sched, _ = _healer(tmp_path)
        leaf = Incident(
            "inc-2",
            "switch_fault",
            "leaf-b0-r1",
            "switch",
            NODES[:4],
            ["llm"],
            "critical",
            "investigate_switch",
            [],
            int(time.time() * 1000),
        )
        await healer.handle(leaf)
        assert sched.actions == [] and healer.evictions == []
        assert healer.decisions[-1]["outcome"] == "alert_only"

    async def test_dry_run_records_what_it_would_do_and_does_nothing(self, tmp_path: Path) -> None:
        """Shadow mode: the eviction is recorded as a dry run and the scheduler is untouched."""
        healer, sched, _ = _healer(tmp_path, mode="dry_run")
        await healer.handle(_incident("inc-3", "gpu_fault", "node-001/gpu-0", "node-001"))
        assert sched.actions == []
        assert [(e.node, e.dry_run) for e in healer.evictions] == [("node-001", True)]

    async def test_working_node_checkpoints_before_eviction(self, tmp_path: Path) -> None:
        """A NIC fault still lets the node work: the job is asked to checkpoint (USR1) before the drain."""
        healer, sched, _ = _healer(tmp_path)
        nic = Incident(
            "inc-4",
            "nic_fault",
            "node-003/nic-1",
            "nic",
            ["node-003"],
            [],
            "warning",
            "check_link",
            [],
            int(time.time() * 1000),
        )
        await healer.handle(nic)
        assert sched.jobs["llm"].signals[:1] == ["USR1"]
        assert ("drain", "node-003") in [(a[0], a[1]) for a in sched.actions]

    async def test_a_planned_step_is_finished_after_a_restart(self, tmp_path: Path) -> None:
        """A drain planned but not done when the controller died is performed by the next one."""
        healer, _sched, store = _healer(tmp_path)
        healer.store.plan_action("node-005", "drain", "inc-9")
        store.close()
        again, sched2, _ = _healer(tmp_path)
        await again._replay_planned()
        assert ("drain", "node-005") in [(a[0], a[1]) for a in sched2.actions]
        assert again.store.planned() == []

    async def test_an_eviction_interrupted_after_the_drain_is_finished_once(self, tmp_path: Path) -> None:
        """Drain done, requeue never started when the controller died: the next one requeues once, drains no more."""
        healer, sched, store = _healer(tmp_path)
        incident = _incident("inc-7", "gpu_fault", "node-002/gpu-1", "node-002")
        for state in (NodeHealState.SUSPECT, NodeHealState.CORDONED, NodeHealState.DRAINING):
            healer.store.transition("node-002", state, "gpu_fault -> evict", "inc-7")
        done = healer.store.plan_action("node-002", "drain", "inc-7")
        assert (await sched.drain("node-002", "gpu_fault")).ok
        healer.store.mark_action(done.action_id, "done")
        store.close()
        again, _, _ = _healer(tmp_path)
        again.scheduler = sched  # the cluster outlives the controller
        again.open_incidents = lambda: [incident]
        await again._replay_planned()
        await again._resume_interrupted()
        assert [a[0] for a in sched.actions].count("drain") == 1
        assert [a[:2] for a in sched.actions if a[0] == "requeue"] == [("requeue", "llm")]
        assert "node-002" not in sched.jobs["llm"].nodes
        assert again.store.state("node-002") in (NodeHealState.EVICTED, NodeHealState.REPAIRING)
        await again._resume_interrupted()  # nothing left to do: no second requeue
        assert [a[0] for a in sched.actions].count("requeue") == 1


class TestHealerAndThePool:
    """The demo's "requeued onto spare None": the pool must serve working nodes and say when it cannot."""

    @staticmethod
    def _roomy(healer: Healer) -> None:
        healer.guards.config = GuardConfig(max_fleet_share=1.0, max_evictions_per_window=100, cooldown_s=0)

    async def test_an_idle_node_is_evicted_without_taking_the_spare(self, tmp_path: Path) -> None:
        healer, sched, _ = _healer(tmp_path, job_nodes=NODES[:7])
        self._roomy(healer)
        await healer.handle(_incident("inc-1", "gpu_fault", "node-007/gpu-0", "node-007"))
        assert healer.evictions[-1].replacement is None
        assert healer.evictions[-1].describe() == "evicted node-007: no job ran on it, no spare needed"
        assert healer.spares is not None and healer.spares.counts()["available"] == 1
        await healer.handle(_incident("inc-2", "gpu_fault", "node-002/gpu-0", "node-002"))
        assert healer.evictions[-1].replacement == "node-008"  # still there for the working node
        assert "node-008" in sched.jobs["llm"].nodes

    async def test_an_eviction_with_the_pool_empty_says_what_became_of_the_job(self, tmp_path: Path) -> None:
        healer, sched, _ = _healer(tmp_path)
        self._roomy(healer)
        await healer.handle(_incident("inc-1", "gpu_fault", "node-002/gpu-0", "node-002"))
        await healer.handle(_incident("inc-2", "gpu_fault", "node-004/gpu-0", "node-004"))
        last = healer.evictions[-1]
        assert last.replacement is None and sched.jobs["llm"].state == "pending"
        assert "None" not in last.describe()
        assert last.describe().startswith("evicted node-004, jobs [llm]: no spare free; ")
        assert "pending" in last.describe()  # the scheduler's own answer: the job waits for capacity

    async def test_a_node_standing_in_that_is_evicted_stops_standing_in(self, tmp_path: Path) -> None:
        healer, _, _ = _healer(tmp_path)
        self._roomy(healer)
        assert healer.spares is not None
        await healer.handle(_incident("inc-1", "gpu_fault", "node-002/gpu-0", "node-002"))
        assert healer.spares.allocated_to("node-008") == ("node-002", "llm")
        await healer.handle(_incident("inc-2", "gpu_fault", "node-008/gpu-0", "node-008"))
        assert healer.spares.allocated_to("node-008") is None  # repaired, it refills the pool like any node


class TestHealerOnTheControllersClock:
    """The healer's waits are on the clock it was given: a fake one drives them with no real time passing."""

    async def test_a_temporary_failure_is_retried_once_retry_delay_s_passed_on_the_clock(self, tmp_path: Path) -> None:
        """A busy scheduler: the drain is tried again only when the fake clock passes the 2 min retry delay."""
        clock = FakeClock(1_700_000_000_000)
        config = HealConfig(retry_delay_s=120.0, checkpoint_timeout_s=0.0)
        healer, sched, _ = _healer(tmp_path, clock=clock, config=config)
        assert healer.clock is clock  # taken from its remediation store
        sched.inject_failure("drain", "node-002", ActionResult.temporary("slurmctld busy"))
        task = asyncio.create_task(healer.handle(_incident("inc-1", "gpu_fault", "node-002/gpu-1", "node-002")))
        await clock.run_for(119.9)
        drains = [a for a in sched.actions if a[0] == "drain"]
        assert not task.done() and drains == []  # the first try failed; the retry waits on the clock
        assert clock.next_deadline() == pytest.approx(clock.monotonic() + 0.1)
        await clock.run_for(0.1)
        await asyncio.wait_for(task, 5)
        assert ("drain", "node-002") in [(a[0], a[1]) for a in sched.actions]
        assert [(e.node, e.at_ms) for e in healer.evictions] == [("node-002", 1_700_000_000_000 + 120_000)]

    async def test_the_checkpoint_wait_times_out_on_the_clock(self, tmp_path: Path) -> None:
        """A job that never checkpoints: the node is drained once checkpoint_timeout_s passed on the fake clock."""
        clock = FakeClock()
        healer, sched, _ = _healer(tmp_path, clock=clock, config=HealConfig(checkpoint_timeout_s=600.0))
        nic = _incident("inc-4", "nic_fault", "node-003/nic-1", "node-003", action="check_link", severity="warning")
        task = asyncio.create_task(healer.handle(nic))
        await clock.run_for(599)
        assert sched.jobs["llm"].signals[:1] == ["USR1"] and not task.done()
        assert ("drain", "node-003") not in [(a[0], a[1]) for a in sched.actions]  # still waiting for the checkpoint
        await clock.run_for(1.2)  # the wait polls every 0.2 s
        await asyncio.wait_for(task, 5)
        assert ("drain", "node-003") in [(a[0], a[1]) for a in sched.actions]
