"""The Admin gRPC service against an in-process controller with a simulated scheduler.

Every manual change carries a named person; a node someone else drained is not returned
without force; the breaker is closed only by a person; an approval in manual mode runs
the waiting remediation.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from controller.detect.model import Incident
from controller.heal.healer import Healer
from controller.heal.scheduler.sim import SimScheduler
from controller.heal.states import AUTOMATIC, NodeHealState
from controller.service import Controller
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc
from tests.support.admin import refused
from tests.support.admin import start_rig as _start

S = NodeHealState


@dataclass
class Rig:
    controller: Controller
    sim: SimScheduler
    stub: sgrpc.AdminStub

    @property
    def healer(self) -> Healer:
        assert self.controller.healer is not None
        return self.controller.healer


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    controller, sim, channel = await _start(tmp_path, heal=True)
    try:
        yield Rig(controller, sim, sgrpc.AdminStub(channel))
    finally:
        await channel.close()
        await controller.stop()


@pytest.fixture
async def manual_rig(tmp_path: Path) -> AsyncIterator[Rig]:
    controller, sim, channel = await _start(tmp_path, heal=True, mode="manual")
    try:
        yield Rig(controller, sim, sgrpc.AdminStub(channel))
    finally:
        await channel.close()
        await controller.stop()


def req(node: str, actor: str = "alice", reason: str = "bad fan", force: bool = False) -> spb.NodeActionRequest:
    return spb.NodeActionRequest(node=node, reason=reason, actor=actor, force=force)


class TestNodeActions:
    async def test_cordon_drain_uncordon_record_the_person(self, rig: Rig) -> None:
        """Each step is a transition under alice's name, with her reason; the scheduler follows."""
        resp = await rig.stub.Cordon(req("node-000"))
        assert resp.ok and resp.state == "cordoned" and resp.drained_by == "alice"
        assert rig.sim.nodes["node-000"].drained
        resp = await rig.stub.Drain(req("node-000", reason="move the job off"))
        assert resp.state == "draining" and resp.drained_by == "alice"
        resp = await rig.stub.Uncordon(req("node-000", reason="fan replaced"))
        assert resp.state == "in_service" and resp.drained_by == ""
        assert not rig.sim.nodes["node-000"].drained
        history = rig.healer.store.history("node-000")
        assert [(t.to_state, t.actor, t.reason) for t in history] == [
            (S.CORDONED, "alice", "bad fan"),
            (S.DRAINING, "alice", "move the job off"),
            (S.IN_SERVICE, "alice", "fan replaced"),
        ]

    async def test_uncordon_of_someone_elses_drain_needs_force(self, rig: Rig) -> None:
        """bob may not return alice's node; with --force he may, and the history says it was him."""
        await rig.stub.Drain(req("node-001"))
        err = await refused(rig.stub.Uncordon(req("node-001", actor="bob", reason="looks fine")))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "drained by alice" in (err.details() or "") and "--force" in (err.details() or "")
        assert rig.healer.store.state("node-001") == S.DRAINING
        resp = await rig.stub.Uncordon(req("node-001", actor="bob", reason="alice is away", force=True))
        assert resp.state == "in_service" and "forced" in resp.message
        assert rig.healer.store.history("node-001")[-1].actor == "bob"

    async def test_external_drain_is_refused_without_force(self, rig: Rig) -> None:
        """A drain nobody here made (recorded as 'external') is not undone by default."""
        rig.healer.store.record_external_drain("node-002")
        err = await refused(rig.stub.Uncordon(req("node-002")))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "external" in (err.details() or "")
        resp = await rig.stub.Uncordon(req("node-002", force=True))
        assert resp.state == "in_service"

    async def test_forced_uncordon_still_leaves_a_scheduler_side_foreign_drain(self, rig: Rig) -> None:
        """Force lifts our guard, not the scheduler's: an operator's drain there stays, and we say so."""
        rig.sim.drain_external("node-003", "bios update")
        rig.healer.store.record_external_drain("node-003", "ops-team")
        err = await refused(rig.stub.Uncordon(req("node-003", force=True)))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "scheduler could not resume" in (err.details() or "")
        assert rig.healer.store.state("node-003") == S.CORDONED
        assert rig.sim.nodes["node-003"].drained

    async def test_a_person_takes_over_a_node_the_automation_holds(self, rig: Rig) -> None:
        """Cordoning a node starpulse cordoned makes it the person's: the healer leaves it alone."""
        rig.healer.store.transition("node-000", S.CORDONED, "policy", "inc-000001", AUTOMATIC)
        resp = await rig.stub.Cordon(req("node-000", actor="carol", reason="investigating"))
        assert resp.drained_by == "carol"
        assert rig.healer.store.history("node-000")[-1].actor == "carol"

    async def test_bad_requests(self, rig: Rig) -> None:
        """Bad node names, empty reasons and non-human actors are INVALID_ARGUMENT; nothing moves."""
        bads = (
            req("../etc"),
            req("node-000", reason="  "),
            req("node-000", actor="starpulse"),
            req("node-000", actor=""),
        )
        for bad in bads:
            err = await refused(rig.stub.Cordon(bad))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
        assert rig.healer.store.history("node-000") == []
        assert not rig.sim.nodes["node-000"].drained

    async def test_an_evicted_node_cannot_be_cordoned_again(self, rig: Rig) -> None:
        store = rig.healer.store
        for state in (S.CORDONED, S.DRAINING, S.EVICTED):
            store.transition("node-001", state, "policy", "inc-000002", AUTOMATIC)
        err = await refused(rig.stub.Drain(req("node-001")))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "evicted" in (err.details() or "")


class TestBreaker:
    async def test_only_a_person_closes_the_breaker(self, rig: Rig) -> None:
        status = await rig.stub.GetBreaker(spb.BreakerRequest())
        assert not status.open and status.mode == "enforce"
        rig.healer.guards.breaker.trip("3 of 5 nodes faulty")
        status = await rig.stub.GetBreaker(spb.BreakerRequest())
        assert status.open and status.reason == "3 of 5 nodes faulty" and status.opened_ms > 0
        for actor in ("starpulse", "", "external"):
            err = await refused(rig.stub.ResetBreaker(spb.BreakerResetRequest(actor=actor, reason="x")))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert rig.healer.guards.breaker.is_open
        status = await rig.stub.ResetBreaker(spb.BreakerResetRequest(actor="bob", reason="driver rolled back"))
        assert status.changed and not status.open and status.closed_by == "bob"
        assert rig.healer.guards.breaker.log()[-1][1:] == ("close", "bob", "driver rolled back")
        again = await rig.stub.ResetBreaker(spb.BreakerResetRequest(actor="bob"))
        assert not again.changed


class TestApprove:
    async def test_approval_runs_the_waiting_remediation(self, manual_rig: Rig) -> None:
        """Manual mode: the healer files a request; alice approves; the node is drained and evicted."""
        rig = manual_rig
        incident = Incident(
            id="inc-000042",
            kind="gpu_fault",
            root_cause="node-002/gpu-0",
            component_type="gpu",
            affected_nodes=["node-002"],
            affected_jobs=[],
            severity="critical",
            action="reset_gpu",
            evidence=[],
            opened_ms=int(time.time() * 1000),
        )
        rig.controller.detection.incidents.save(incident)
        await rig.healer.handle(incident)
        assert [a.node for a in rig.healer.guards.pending_approvals()] == ["node-002"]
        assert not rig.sim.nodes["node-002"].drained
        status = await rig.stub.GetBreaker(spb.BreakerRequest())
        assert status.pending_approvals == 1 and status.mode == "manual"

        err = await refused(rig.stub.Approve(spb.ApproveRequest(incident_id="inc-000042", actor="starpulse")))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        err = await refused(rig.stub.Approve(spb.ApproveRequest(incident_id="inc-999999", actor="alice")))
        assert err.code() == grpc.StatusCode.NOT_FOUND

        resp = await rig.stub.Approve(spb.ApproveRequest(incident_id="inc-000042", actor="alice"))
        assert resp.ok and list(resp.nodes) == ["node-002"] and resp.outcome == "ok", resp.message
        assert "approved by alice" in resp.outcome_reason
        assert rig.sim.nodes["node-002"].drained
        assert rig.healer.store.state("node-002") == S.REPAIRING
        assert rig.healer.guards.pending_approvals() == []
        assert rig.healer.guards.approval("inc-000042", "node-002").decided_by == "alice"


class TestListings:
    async def test_spares_and_jobs(self, rig: Rig) -> None:
        spares = (await rig.stub.ListSpares(spb.SparesRequest())).spares
        assert [s.spare for s in spares] == ["node-005"]
        assert spares[0].source == "fabric" and spares[0].HasField("block") and not spares[0].allocated_to
        assert not spares[0].healthy  # no agent heard from it
        jobs = (await rig.stub.ListJobs(spb.JobsRequest())).jobs
        assert [j.job for j in jobs] == ["train-1"]
        assert list(jobs[0].nodes) == ["node-000", "node-001"] and jobs[0].restarts == 0
        assert not jobs[0].HasField("resumed_from_step")


class TestWithoutHealing:
    async def test_node_actions_need_healing_but_jobs_work(self, tmp_path: Path) -> None:
        controller, _, channel = await _start(tmp_path, heal=False)
        stub = sgrpc.AdminStub(channel)
        try:
            for call in (
                stub.Cordon(req("node-000")),
                stub.Uncordon(req("node-000")),
                stub.Drain(req("node-000")),
                stub.Approve(spb.ApproveRequest(incident_id="inc-000001", actor="alice")),
                stub.GetBreaker(spb.BreakerRequest()),
                stub.ResetBreaker(spb.BreakerResetRequest(actor="alice")),
                stub.ListSpares(spb.SparesRequest()),
            ):
                err = await refused(call)
                assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert err.details() == "self-healing is not configured on this controller"
            jobs = (await stub.ListJobs(spb.JobsRequest())).jobs
            assert [j.job for j in jobs] == ["train-1"]
        finally:
            await channel.close()
            await controller.stop()
