"""Admin API: what a person does to the fleet (cordon, drain, uncordon, approve, breaker, spares, jobs).

Every change names the human who made it: the actor is recorded in the node's transition
history, and the controller's own name (``starpulse``) or ``external`` is refused. A node
someone else took out of service is not returned by another person unless they ``force``
it (and even then the scheduler keeps refusing to undo a drain it did not make), and the
circuit breaker is only closed by a named person.
"""

from __future__ import annotations

import re
from collections import deque
from typing import NoReturn, Protocol

import grpc
import structlog

from controller.detect.model import Incident
from controller.heal.acks import acknowledge
from controller.heal.healer import Healer
from controller.heal.scheduler.base import ActionResult
from controller.heal.states import (
    ALLOWED,
    AUTOMATIC,
    InvalidTransition,
    NodeHealState,
    RemediationStore,
    is_human,
)
from controller.jobs.registry import JobRecord
from controller.metrics import ControllerMetrics
from controller.outputs.query import incident_detail
from controller.query.surface import IncidentCommands, Queries
from controller.store import Store
from starpulse.core.clock import Clock
from starpulse.core.names import InvalidName, validate_node_id
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc

log = structlog.get_logger(__name__)

S = NodeHealState


class AdminTarget(Protocol):
    """The parts of a running controller the Admin service acts on (the service's Controller)."""

    @property
    def healer(self) -> Healer | None: ...
    @property
    def queries(self) -> Queries: ...
    @property
    def incident_commands(self) -> IncidentCommands: ...
    @property
    def metrics(self) -> ControllerMetrics: ...
    @property
    def store(self) -> Store: ...
    @property
    def clock(self) -> Clock: ...


NOT_CONFIGURED = "self-healing is not configured on this controller"
REASON_MAX_LEN = 500
_ACTOR = re.compile(r"^[^\x00-\x1f\x7f]{1,64}$")
_INCIDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


class Refused(Exception):
    """A request the admin API turns down, with the gRPC status to answer."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def check_actor(actor: str) -> str:
    """The actor, stripped, when it names a person; Refused otherwise."""
    name = (actor or "").strip()
    if not name:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "an actor is required: the name of the person acting")
    if not _ACTOR.fullmatch(name):
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"invalid actor {name[:64]!r}: 1-64 printable characters")
    if not is_human(name):
        raise Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"actor {name!r} is not a person: manual actions are recorded under a human's name",
        )
    return name


def check_reason(reason: str) -> str:
    text = " ".join((reason or "").split())
    if not text:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "a reason is required (--reason TEXT)")
    return text[:REASON_MAX_LEN]


def check_node(node: str) -> str:
    try:
        return validate_node_id(node)
    except InvalidName as exc:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc


def path_to(current: NodeHealState, target: NodeHealState) -> list[NodeHealState] | None:
    """Shortest list of states ``ALLOWED`` permits from ``current`` to ``target`` (excluding current)."""
    if current == target:
        return [target]
    prev: dict[NodeHealState, NodeHealState] = {}
    queue = deque([current])
    while queue:
        state = queue.popleft()
        for nxt in sorted(ALLOWED[state]):
            if nxt in prev or nxt == current:
                continue
            prev[nxt] = state
            if nxt == target:
                path = [nxt]
                while prev[path[-1]] != current:
                    path.append(prev[path[-1]])
                return path[::-1]
            queue.append(nxt)
    return None


def take_out_path(current: NodeHealState, target: NodeHealState) -> list[NodeHealState] | None:
    """cordon/drain: directly, or through ``cordoned``; never through repair (an evicted node stays so)."""
    if current == target or target in ALLOWED[current]:
        return [target]
    if S.CORDONED in ALLOWED[current] and target in ALLOWED[S.CORDONED]:
        return [S.CORDONED, target]
    return None


def _scheduler_refused(verb: str, node: str, result: ActionResult) -> Refused:
    code = grpc.StatusCode.FAILED_PRECONDITION if result.permanent else grpc.StatusCode.UNAVAILABLE
    return Refused(code, f"scheduler could not {verb} {node}: {result.detail or 'no detail'}")


def job_info(job: JobRecord) -> spb.JobInfo:
    info = spb.JobInfo(
        job=job.job,
        state=job.state,
        nodes=job.nodes,
        world_size=job.world_size,
        step=job.step,
        checkpoint_dir=job.checkpoint_dir,
        last_complete_step=job.last_complete_step,
        last_complete_path=job.last_complete_path,
        last_complete_ms=job.last_complete_ms,
        restarts=job.restarts,
        steps_lost=job.steps_lost,
        downtime_s=job.downtime_s,
    )
    if job.resumed_from_step is not None:
        info.resumed_from_step = job.resumed_from_step
    last = job.last_restart
    if last is not None and last.resumed_from_checkpoint is not None:
        info.resumed_from_checkpoint = last.resumed_from_checkpoint
    return info


class AdminServicer(sgrpc.AdminServicer):
    """The Admin service over a running Controller (its healer may be None: heal not configured)."""

    def __init__(self, controller: AdminTarget) -> None:
        self.controller = controller

    # -- helpers -------------------------------------------------------------------------------
    def _healer(self) -> Healer:
        healer = self.controller.healer
        if healer is None:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, NOT_CONFIGURED)
        return healer

    @staticmethod
    async def _abort(context: grpc.aio.ServicerContext, refused: Refused) -> NoReturn:
        await context.abort(refused.code, refused.message)
        raise AssertionError("unreachable")  # abort raises

    @staticmethod
    def _response(store: RemediationStore, node: str, message: str) -> spb.NodeActionResponse:
        record = store.record(node)
        return spb.NodeActionResponse(
            ok=True, message=message, state=str(record.state), drained_by=record.drained_by or "", node=node
        )

    @staticmethod
    def _walk(store: RemediationStore, node: str, path: list[NodeHealState], reason: str, actor: str) -> None:
        for state in path:
            try:
                store.transition(node, state, reason, None, actor)
            except InvalidTransition as exc:  # raced with the healer: say so, do not half-explain
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from exc

    # -- node actions --------------------------------------------------------------------------
    async def _take_out(self, request: spb.NodeActionRequest, target: NodeHealState) -> spb.NodeActionResponse:
        healer = self._healer()
        node, reason, actor = check_node(request.node), check_reason(request.reason), check_actor(request.actor)
        store = healer.store
        record = store.record(node)
        path = take_out_path(record.state, target)
        if path is None:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{node} is {record.state}: it cannot be {target} (from {record.state} allowed: "
                f"{', '.join(sorted(ALLOWED[record.state])) or 'nothing'})",
            )
        verb = "cordon" if target == S.CORDONED else "drain"
        call = healer.scheduler.cordon if target == S.CORDONED else healer.scheduler.drain
        result = await call(node, f"{reason} (by {actor})")
        if not result.ok:
            raise _scheduler_refused(verb, node, result)
        self._walk(store, node, path, reason, actor)
        if store.drained_by(node) in (None, AUTOMATIC):
            # The automation had it; a person now holds it, so the healer will not put it back.
            store.record_external_drain(node, actor, f"{actor} takes over from {AUTOMATIC}: {reason}")
        log.warning("admin_node_action", action=verb, node=node, actor=actor, reason=reason)
        return self._response(store, node, f"{node} {target} by {actor}: {reason}")

    async def _uncordon(self, request: spb.NodeActionRequest) -> spb.NodeActionResponse:
        healer = self._healer()
        node, reason, actor = check_node(request.node), check_reason(request.reason), check_actor(request.actor)
        store = healer.store
        owner = store.drained_by(node)
        verdict = healer.guards.check_resume(node, actor, request.force)
        if not verdict.allowed:
            raise Refused(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{node} was drained by {owner}, not by {actor}: refusing to return it to service "
                f"(ask {owner}, or use --force to override)",
            )
        record = store.record(node)
        path = path_to(record.state, S.IN_SERVICE)
        if path is None:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"{node} is {record.state}: no way back to service")
        result = await healer.scheduler.resume(node, f"{reason} (by {actor})")
        if not result.ok:
            raise _scheduler_refused("resume", node, result)
        if record.state != S.IN_SERVICE:
            self._walk(store, node, path, reason, actor)
        forced = verdict.code == "forced"
        log.warning("admin_node_action", action="uncordon", node=node, actor=actor, reason=reason, forced=forced)
        extra = f" (forced over a drain by {owner})" if forced else ""
        return self._response(store, node, f"{node} returned to service by {actor}{extra}: {reason}")

    async def Cordon(self, request: spb.NodeActionRequest, context: grpc.aio.ServicerContext) -> spb.NodeActionResponse:
        try:
            return await self._take_out(request, S.CORDONED)
        except Refused as refused:
            await self._abort(context, refused)

    async def Drain(self, request: spb.NodeActionRequest, context: grpc.aio.ServicerContext) -> spb.NodeActionResponse:
        try:
            return await self._take_out(request, S.DRAINING)
        except Refused as refused:
            await self._abort(context, refused)

    async def Uncordon(
        self, request: spb.NodeActionRequest, context: grpc.aio.ServicerContext
    ) -> spb.NodeActionResponse:
        try:
            return await self._uncordon(request)
        except Refused as refused:
            await self._abort(context, refused)

    # -- approvals -----------------------------------------------------------------------------
    async def _approve(self, request: spb.ApproveRequest) -> spb.ApproveResponse:
        healer = self._healer()
        actor = check_actor(request.actor)
        incident_id = request.incident_id.strip()
        if not _INCIDENT_ID.fullmatch(incident_id):
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"invalid incident id {incident_id[:128]!r}")
        node = check_node(request.node) if request.node else None
        try:
            approvals = healer.guards.approve(incident_id, actor, node)
        except KeyError as exc:
            raise Refused(grpc.StatusCode.NOT_FOUND, str(exc.args[0]) if exc.args else str(exc)) from exc
        except PermissionError as exc:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        nodes = [a.node for a in approvals]
        log.warning("admin_approved", incident=incident_id, nodes=nodes, actor=actor)
        incident = self.controller.queries.incident(incident_id)
        if incident is None or not incident.active:
            state = "unknown" if incident is None else "resolved"
            return spb.ApproveResponse(
                ok=True, message=f"approved by {actor}; incident {incident_id} is {state}: nothing to run", nodes=nodes
            )
        try:
            await healer.handle(incident)
        except Exception as exc:  # the approval stands; the run failed and says why
            log.exception("admin_approved_remediation_failed", incident=incident_id)
            return spb.ApproveResponse(
                ok=False, message=f"approved by {actor}, but the remediation failed: {exc}", nodes=nodes
            )
        decision = next((d for d in reversed(healer.decisions) if d["incident"] == incident_id), None)
        outcome = str(decision["outcome"]) if decision else ""
        why = str(decision.get("reason", "")) if decision else ""
        return spb.ApproveResponse(
            ok=outcome in ("ok", "alert_only"),
            message=f"approved by {actor}; remediation of {incident_id}: {outcome or 'not run'} {why}".strip(),
            nodes=nodes,
            outcome=outcome,
            outcome_reason=why,
        )

    # -- incidents -----------------------------------------------------------------------------
    def _incident(self, incident_id: str) -> Incident:
        iid = (incident_id or "").strip()
        if not iid:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "an incident id is required")
        incident = self.controller.queries.incident(iid)
        if incident is None:
            raise Refused(grpc.StatusCode.NOT_FOUND, f"no incident {iid!r}")
        return incident

    def _incident_request(
        self, request: spb.IncidentActionRequest, open_only: bool = False
    ) -> tuple[str, str, Incident]:
        """(actor, reason, incident) of a person's incident action; Refused when any is wrong."""
        actor, reason = check_actor(request.actor), check_reason(request.reason)
        incident = self._incident(request.id)
        if open_only and not incident.active:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"{incident.id} is already resolved")
        return actor, reason, incident

    async def AckIncident(
        self, request: spb.IncidentActionRequest, context: grpc.aio.ServicerContext
    ) -> spb.IncidentDetail:
        try:
            actor, reason, incident = self._incident_request(request)
        except Refused as refused:
            await self._abort(context, refused)
        conn = self.controller.store.connection
        acknowledge(conn, incident.id, actor, reason, self.controller.clock.time_ms())
        log.warning("admin_incident_acked", incident=incident.id, actor=actor, reason=reason)
        return incident_detail(self.controller.queries, incident, f"{incident.id} acknowledged by {actor}")

    async def ResolveIncident(
        self, request: spb.IncidentActionRequest, context: grpc.aio.ServicerContext
    ) -> spb.IncidentDetail:
        try:
            actor, reason, incident = self._incident_request(request, open_only=True)
        except Refused as refused:
            await self._abort(context, refused)
        closed = self.controller.incident_commands.resolve_incident(incident.id, reason, actor)
        log.warning("admin_incident_resolved", incident=incident.id, actor=actor, reason=reason)
        after = closed or self._incident(incident.id)
        return incident_detail(self.controller.queries, after, f"{incident.id} resolved by {actor}")

    async def ListApprovals(
        self, request: spb.ApprovalsRequest, context: grpc.aio.ServicerContext
    ) -> spb.ApprovalsResponse:
        try:
            healer = self._healer()
        except Refused as refused:
            await self._abort(context, refused)
        return spb.ApprovalsResponse(
            approvals=[
                spb.ApprovalInfo(
                    incident_id=a.incident_id,
                    node=a.node,
                    action=a.action,
                    requested_ms=a.requested_ms,
                    reason=a.reason,
                )
                for a in healer.guards.pending_approvals()
            ]
        )

    async def Approve(self, request: spb.ApproveRequest, context: grpc.aio.ServicerContext) -> spb.ApproveResponse:
        try:
            return await self._approve(request)
        except Refused as refused:
            await self._abort(context, refused)

    # -- breaker -------------------------------------------------------------------------------
    def _breaker_status(self, healer: Healer, changed: bool = False) -> spb.BreakerStatus:
        st = healer.guards.breaker.state()
        return spb.BreakerStatus(
            open=st.open,
            opened_ms=st.opened_ms or 0,
            reason=st.reason,
            closed_by=st.closed_by or "",
            closed_ms=st.closed_ms or 0,
            changed=changed,
            pending_approvals=len(healer.guards.pending_approvals()),
            mode=healer.guards.config.mode,
        )

    async def GetBreaker(self, request: spb.BreakerRequest, context: grpc.aio.ServicerContext) -> spb.BreakerStatus:
        try:
            return self._breaker_status(self._healer())
        except Refused as refused:
            await self._abort(context, refused)

    async def ResetBreaker(
        self, request: spb.BreakerResetRequest, context: grpc.aio.ServicerContext
    ) -> spb.BreakerStatus:
        try:
            healer = self._healer()
            actor = check_actor(request.actor)
            reason = " ".join(request.reason.split())[:REASON_MAX_LEN] or f"closed by {actor}"
            try:
                changed = healer.guards.breaker.reset(actor, reason)
            except PermissionError as exc:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
            self.controller.metrics.breaker_open.labels("eviction").set(1 if healer.guards.breaker.is_open else 0)
            log.warning("admin_breaker_reset", actor=actor, reason=reason, changed=changed)
            return self._breaker_status(healer, changed)
        except Refused as refused:
            await self._abort(context, refused)

    # -- listings ------------------------------------------------------------------------------
    async def ListSpares(self, request: spb.SparesRequest, context: grpc.aio.ServicerContext) -> spb.SparesResponse:
        try:
            healer = self._healer()
        except Refused as refused:
            await self._abort(context, refused)
        if healer.spares is None:
            return spb.SparesResponse()
        out = []
        for s in healer.spares.list():
            info = spb.SpareInfo(
                spare=s.spare, healthy=s.healthy, allocated_to=s.allocated_to or "", job=s.job or "", source=s.source
            )
            if s.block is not None:
                info.block = s.block
            out.append(info)
        return spb.SparesResponse(spares=out)

    async def ListJobs(self, request: spb.JobsRequest, context: grpc.aio.ServicerContext) -> spb.JobsResponse:
        return spb.JobsResponse(jobs=[job_info(j) for j in self.controller.queries.jobs() or []])
