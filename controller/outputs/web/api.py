"""The dashboard's JSON: the fabric as a layout-ready picture, incidents, a summary, and a change stream.

Everything is read on the event loop from the node registry (presence, readings) and the
query surface (``controller.query``: incidents, fabric, jobs, node rows); nothing here writes. Endpoints:

- ``GET /api/fabric``: spines, blocks -> leaves per rail, nodes per block; each element
  carries its status (worst severity of the open incidents naming it) and which
  incidents blame it (``root_cause_of``) or merely touch it (``affected_by``).
- ``GET /api/incidents?all=1&limit=N``: open incidents (``all=1``: every stored one), newest first.
- ``GET /api/summary``: node counts by presence and by lifecycle state, open incidents by
  kind and severity, breaker state.
- ``GET /api/node/{name}``: one node's page (``web/node.py``): readings, lifecycle, vendor.
- ``GET /api/node/{name}/history``: that node's short time series (``web/history.py``).
- ``GET /api/jobs``: every known job: step, last complete checkpoint, restarts, downtime.
- ``GET /api/stream``: Server-Sent Events, one ``changed`` event (with a version) whenever
  the incidents or the node states change.

Bad query parameters get a 400 with ``{"error": "..."}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from aiohttp import web
from google.protobuf.json_format import MessageToDict

from controller.detect.model import Incident
from controller.fabric import Fabric
from controller.fabric.model import LINK_SEPARATOR
from controller.heal.guards import BreakerState
from controller.heal.states import NodeHealState
from controller.heal.states import NodeRecord as LifecycleRecord
from controller.ingest.registry import NodeRecord, NodeRegistry
from controller.jobs.registry import JobRecord
from controller.outputs.web.history import History, Sampler
from controller.outputs.web.node import node_json
from controller.outputs.web.page import add_page_routes
from controller.query.surface import Queries
from starpulse.core.units import format_duration
from starpulse.core.vocab import SEVERITY_ORDER
from starpulse.v1 import inventory_pb2 as ipb

log = structlog.get_logger(__name__)

BreakerProvider = Callable[[], Mapping[str, Any]]
LifecycleProvider = Callable[[], Mapping[str, LifecycleRecord]]
SparesProvider = Callable[[], Mapping[str, int]]
DEFAULT_BREAKER: dict[str, Any] = {"state": "closed", "available": False}
DEFAULT_INCIDENT_LIMIT = 200
MAX_INCIDENT_LIMIT = 10_000
UNKNOWN = "unknown"  # a fabric node the controller has never heard from


class ApiError(web.HTTPBadRequest):
    """A 400 whose body is ``{"error": message}``."""

    def __init__(self, message: str) -> None:
        super().__init__(text=json.dumps({"error": message}), content_type="application/json")


def jobs_json(jobs: Sequence[JobRecord] | None) -> dict[str, Any]:
    """Every job the controller knows, by name; ``last_checkpoint_ms`` when it was complete."""
    if jobs is None:
        return {"jobs": [], "available": False}
    rows = []
    for rec in sorted(jobs, key=lambda r: r.job):
        row = rec.to_dict()
        row["last_checkpoint_ms"] = rec.last_complete_ms or None
        rows.append(row)
    return {"jobs": rows, "available": True}


@dataclass
class DashboardState:
    """What the dashboard reads. ``breaker`` may be set later (self-healing plugs in here)."""

    registry: NodeRegistry
    queries: Queries | None = None  # incidents, fabric, jobs, node rows (None: none of them)
    breaker: BreakerProvider | None = None
    lifecycle: LifecycleProvider = field(default=lambda: {})
    spares: SparesProvider | None = None
    history: History = field(default_factory=History)

    def spares_state(self) -> dict[str, int] | None:
        """The spare pool (available, allocated, unavailable, target), or None without self-healing."""
        if self.spares is None:
            return None
        try:
            return dict(self.spares())
        except Exception:
            log.exception("spares_provider_failed")
            return None

    def lifecycle_of(self) -> Mapping[str, LifecycleRecord]:
        """Every node's lifecycle row (a node without one is in service); {} when it cannot be read."""
        try:
            return self.lifecycle()
        except Exception:
            log.exception("lifecycle_provider_failed")
            return {}

    @property
    def fabric(self) -> Fabric | None:
        return self.queries.fabric() if self.queries is not None else None

    def open_incidents(self) -> list[Incident]:
        """Open incidents, newest first."""
        if self.queries is None:
            return []
        return self.queries.open_incidents(MAX_INCIDENT_LIMIT)

    def incidents(self, include_resolved: bool, limit: int) -> list[Incident]:
        if self.queries is None:
            return []
        if include_resolved:
            return self.queries.incidents(include_resolved=True, limit=limit)
        return self.queries.open_incidents(limit)

    def breaker_state(self) -> dict[str, Any]:
        """The circuit breaker's state, or the placeholder while no breaker exists."""
        if self.breaker is None:
            return dict(DEFAULT_BREAKER)
        try:
            return {"available": True, **dict(self.breaker())}
        except Exception:
            log.exception("breaker_provider_failed")
            return {"state": UNKNOWN, "available": False, "error": "breaker provider failed"}

    def compute_nodes(self) -> list[NodeRecord]:
        return [n for n in self.registry.nodes.values() if n.role != ipb.NODE_ROLE_SWITCH]

    def signature(self) -> Hashable:
        """Cheap fingerprint of what the page shows: open incidents, node states, breaker."""
        incidents = tuple((i.id, i.updated_ms, i.severity, len(i.affected_nodes)) for i in self.open_incidents())
        nodes = (self.registry.presence_version, len(self.registry.nodes))
        breaker = json.dumps(self.breaker_state(), sort_keys=True, default=str)
        life = tuple(sorted((n, str(r.state), r.since_ms) for n, r in self.lifecycle_of().items()))
        spares = tuple(sorted((self.spares_state() or {}).items()))
        return hash((incidents, nodes, breaker, life, spares))


# -- incidents on the picture --------------------------------------------------------------


def element_of(component: str) -> str:
    """The drawn element a component lives on: ``node-003/gpu-5`` -> ``node-003``, ``leaf-b0-r3:Ethernet8`` -> leaf."""
    return component.split(":", 1)[0].split("/", 1)[0]


@dataclass
class Mark:
    """How the open incidents touch one drawn element."""

    severity: str | None = None
    root_cause_of: list[str] = field(default_factory=list)
    affected_by: list[str] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)  # faulty sub-components (GPU, NIC, port)

    def add(self, incident: Incident, root: bool, part: str | None = None) -> None:
        if self.severity is None or SEVERITY_ORDER.get(incident.severity, 0) > SEVERITY_ORDER.get(self.severity, 0):
            self.severity = incident.severity
        ids = self.root_cause_of if root else self.affected_by
        if incident.id not in ids:
            ids.append(incident.id)
        if part and part not in self.parts:
            self.parts.append(part)

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.severity or "ok",
            "root_cause_of": self.root_cause_of,
            "affected_by": self.affected_by,
            "parts": self.parts,
        }


_NO_MARK: dict[str, Any] = Mark().to_json()


def mark_components(incidents: Iterable[Incident]) -> tuple[dict[str, Mark], list[dict[str, Any]]]:
    """Element name -> Mark, plus the faulty cables (a link root cause marks its two ends as affected)."""
    marks: dict[str, Mark] = {}
    links: list[dict[str, Any]] = []
    for inc in incidents:
        rc = inc.root_cause
        ends: set[str] = set()
        if LINK_SEPARATOR in rc:
            a, _, b = rc.partition(LINK_SEPARATOR)
            ends = {element_of(a), element_of(b)}
            links.append(
                {
                    "name": rc,
                    "a": element_of(a),
                    "b": element_of(b),
                    "status": inc.severity,
                    "incident": inc.id,
                    "kind": inc.kind,
                }
            )
            for end, part in ((element_of(a), a), (element_of(b), b)):
                marks.setdefault(end, Mark()).add(inc, root=False, part=part if part != end else None)
        elif rc:
            element = element_of(rc)
            ends = {element}
            marks.setdefault(element, Mark()).add(inc, root=True, part=rc if rc != element else None)
        for node in inc.affected_nodes:
            if node not in ends:
                marks.setdefault(node, Mark()).add(inc, root=False)
    return marks, links


# -- JSON builders -------------------------------------------------------------------------


def incident_json(inc: Incident) -> dict[str, Any]:
    return {
        "id": inc.id,
        "kind": inc.kind,
        "root_cause": inc.root_cause,
        "component_type": inc.component_type,
        "affected_nodes": list(inc.affected_nodes),
        "affected_jobs": list(inc.affected_jobs),
        "severity": inc.severity,
        "action": inc.action,
        "open": inc.resolved_ms is None,
        "opened_ms": inc.opened_ms,
        "updated_ms": inc.updated_ms,
        "resolved_ms": inc.resolved_ms,
        "evidence": inc.evidence,
    }


def fabric_json(state: DashboardState) -> dict[str, Any]:
    """The layout-ready fabric (nodes only when the controller has no fabric)."""
    marks, links = mark_components(state.open_incidents())
    nodes = state.registry.nodes
    life = state.lifecycle_of()

    def mark(name: str) -> dict[str, Any]:
        m = marks.get(name)
        return m.to_json() if m is not None else dict(_NO_MARK)

    def node_entry(name: str, spare: bool) -> dict[str, Any]:
        rec = nodes.get(name)
        return {
            "name": name,
            "state": rec.state if rec else UNKNOWN,
            "last_seen_ms": rec.last_seen_ms if rec else None,
            "spare": spare,
            **lifecycle_json(life.get(name)),
            **mark(name),
        }

    def switch_entry(name: str, **extra: Any) -> dict[str, Any]:
        rec = nodes.get(name)
        return {"name": name, **extra, "state": rec.state if rec else None, **mark(name)}

    fabric = state.fabric
    if fabric is None:
        loose = sorted(n.node_id for n in state.compute_nodes())
        return {
            "fabric": False,
            "summary": None,
            "rails": [],
            "spines": [],
            "blocks": [],
            "nodes": [node_entry(n, False) for n in loose],
            "links": links,
        }

    spines = fabric.spines()
    spine_index = {s: i for i, s in enumerate(spines)}
    by_block: dict[int, dict[int, str]] = {}
    for leaf in fabric.leaves():
        attrs = fabric.graph.nodes[leaf]
        by_block.setdefault(int(attrs["block"]), {})[int(attrs["rail"])] = leaf
    rails = sorted({r for leaves in by_block.values() for r in leaves})
    blocks = []
    for b in sorted(set(fabric.blocks()) | set(by_block)):
        leaves = by_block.get(b, {})
        blocks.append(
            {
                "block": b,
                "leaves": [
                    switch_entry(leaf, rail=r, spines=sorted(spine_index[s] for s in fabric.spines_of(leaf)))
                    for r, leaf in sorted(leaves.items())
                ],
                "nodes": [node_entry(n, fabric.is_spare(n)) for n in fabric.nodes_in_block(b)],
            }
        )
    placed = set(fabric.nodes())
    loose = sorted(n.node_id for n in state.compute_nodes() if n.node_id not in placed)
    view = state.queries.topology() if state.queries is not None else None
    return {
        "probes": probe_links_json(view.probe_health if view is not None else {}),
        "fabric": True,
        "summary": fabric.summary(),
        "rails": rails,
        "spines": [switch_entry(s, index=i) for i, s in enumerate(spines)],
        "blocks": blocks,
        "nodes": [node_entry(n, False) for n in loose],
        "links": links,
    }


PROBE_WARN_LOSS = 0.001  # 0.1 %: amber on the fabric view
PROBE_BAD_LOSS = 0.005  # 0.5 %: red (the localisation's default loss threshold)
PROBE_SLOW_US = 500.0  # network p99 over R-Pingmesh's SLA: amber


def probe_links_json(health: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Probe health per leaf-spine cable (issue 29): its ends, loss, p99 and a colour level."""
    out = []
    for name, h in sorted(health.items()):
        if h.get("kind") != "link" or LINK_SEPARATOR not in name:
            continue
        a, _, b = name.partition(LINK_SEPARATOR)
        loss, p99 = float(h.get("loss", 0.0)), float(h.get("p99_us", 0.0))
        level = "bad" if loss >= PROBE_BAD_LOSS else "warn" if loss >= PROBE_WARN_LOSS or p99 >= PROBE_SLOW_US else "ok"
        out.append(
            {"name": name, "a": a, "b": b, "loss": loss, "p99_us": p99, "sent": h.get("sent", 0), "level": level}
        )
    return out


def lifecycle_json(rec: LifecycleRecord | None) -> dict[str, Any]:
    """A node's lifecycle for the page: state, since when and why (in service when no row)."""
    if rec is None:
        return {"lifecycle": str(NodeHealState.IN_SERVICE), "lifecycle_since_ms": None, "lifecycle_reason": ""}
    return {"lifecycle": str(rec.state), "lifecycle_since_ms": rec.since_ms, "lifecycle_reason": rec.reason}


def breaker_json(st: BreakerState, now_ms: int) -> dict[str, Any]:
    """The real breaker for the chip: state, reason, and since when in words (not raw ms)."""
    out: dict[str, Any] = {"state": "open" if st.open else "closed", "reason": st.reason}
    if st.open and st.opened_ms is not None:
        out["opened_ms"] = st.opened_ms
        out["open_for"] = format_duration((now_ms - st.opened_ms) / 1000)
    if not st.open and st.closed_by:
        out["closed_by"] = st.closed_by
        out["closed_ms"] = st.closed_ms
        if st.closed_ms is not None:
            out["closed_ago"] = format_duration((now_ms - st.closed_ms) / 1000)
    return out


def summary_json(state: DashboardState, version: int) -> dict[str, Any]:
    """Counts for the header: nodes by state, open incidents by kind/severity, breaker."""
    by_state: dict[str, int] = {"online": 0, "unreachable": 0}
    for rec in state.compute_nodes():
        by_state[rec.state] = by_state.get(rec.state, 0) + 1
    fabric = state.fabric
    if fabric is not None:
        by_state[UNKNOWN] = sum(1 for n in fabric.nodes() if n not in state.registry.nodes)
    switches: dict[str, int] = {}
    for rec in state.registry.nodes.values():
        if rec.role == ipb.NODE_ROLE_SWITCH:
            switches[rec.state] = switches.get(rec.state, 0) + 1
    life = state.lifecycle_of()
    names = set(fabric.nodes()) if fabric is not None else {n.node_id for n in state.compute_nodes()}
    lifecycle = dict.fromkeys((str(s) for s in NodeHealState), 0)
    for name in names:
        row = life.get(name)
        lifecycle[str(row.state) if row is not None else str(NodeHealState.IN_SERVICE)] += 1
    by_kind: dict[str, int] = {}
    by_severity: dict[str, int] = {}
    open_incidents = state.open_incidents()
    for inc in open_incidents:
        by_kind[inc.kind] = by_kind.get(inc.kind, 0) + 1
        by_severity[inc.severity] = by_severity.get(inc.severity, 0) + 1
    return {
        "nodes": {"total": sum(by_state.values()), **by_state},
        "lifecycle": lifecycle,
        "switches": switches,
        "incidents": {"open": len(open_incidents), "by_kind": by_kind, "by_severity": by_severity},
        "breaker": state.breaker_state(),
        "spares": state.spares_state(),
        "fabric": fabric.summary() if fabric is not None else None,
        "version": version,
        "now_ms": state.registry.clock.time_ms(),  # the clock last-seen times are on
    }


def node_rows(state: DashboardState) -> list[dict[str, Any]]:
    """``/api/nodes``'s rows (the same NodeStatus as JSON), for a snapshot page; [] without a query surface."""
    if state.queries is None:
        return []
    return [
        MessageToDict(s, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
        for s in state.queries.node_statuses()
    ]


def snapshot_json(state: DashboardState, version: int) -> dict[str, Any]:
    """Everything the page fetches on a refresh, in one object (embedded in ``/?live=0``)."""
    limit = DEFAULT_INCIDENT_LIMIT
    return {
        "fabric": fabric_json(state),
        "incidents": {
            "incidents": [incident_json(i) for i in state.incidents(True, limit)],
            "all": True,
            "limit": limit,
        },
        "summary": summary_json(state, version),
        "nodes": {"nodes": node_rows(state)},
    }


def node_page_json(state: DashboardState, name: str) -> dict[str, Any] | None:
    """One node's page, or None when neither the registry nor the fabric knows the name."""
    rec = state.registry.nodes.get(name)
    fabric = state.fabric
    placed = fabric is not None and name in fabric.graph and name in set(fabric.nodes())
    if rec is None and not placed:
        return None
    if rec is not None and rec.role == ipb.NODE_ROLE_SWITCH:
        return None
    spare = fabric.is_spare(name) if placed and fabric is not None else False
    life = lifecycle_json(state.lifecycle_of().get(name))
    return node_json(name, rec, life, spare, state.registry.clock.time_ms())


# -- query parameters ----------------------------------------------------------------------


def check_params(request: web.Request, allowed: Iterable[str]) -> None:
    unknown = sorted(set(request.query) - set(allowed))
    if unknown:
        raise ApiError(f"unknown query parameter(s): {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")


def flag_param(request: web.Request, name: str, default: bool = False) -> bool:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes"):
        return True
    if value in ("0", "false", "no"):
        return False
    raise ApiError(f"{name} must be 1 or 0 (got {raw!r})")


def int_param(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(f"{name} must be an integer (got {raw!r})") from None
    if not lo <= value <= hi:
        raise ApiError(f"{name} must be between {lo} and {hi} (got {value})")
    return value


# -- change stream -------------------------------------------------------------------------


class ChangeWatcher:
    """Polls a signature every ``poll_s`` and bumps ``version`` when it changes."""

    def __init__(self, signature: Callable[[], Hashable], poll_s: float = 1.0) -> None:
        self._signature = signature
        self.poll_s = poll_s
        self.version = 0
        self.closed = False
        self._last: Hashable = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def check(self) -> bool:
        """Compare the signature now; True (and a new version) when it changed."""
        try:
            sig = self._signature()
        except Exception:
            log.exception("dashboard_signature_failed")
            return False
        if sig == self._last:
            return False
        self._last = sig
        self.version += 1
        self._wake()
        return True

    def _wake(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def wait(self, version: int, within_s: float) -> None:
        """Return once ``version`` is stale, the watcher closes, or ``within_s`` passes."""
        if self.version != version or self.closed:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), within_s)

    async def _run(self) -> None:
        while not self.closed:
            self.check()
            await asyncio.sleep(self.poll_s)

    def start(self) -> None:
        self.check()
        self._task = asyncio.create_task(self._run())

    def close(self) -> None:
        """Wake every stream so it ends (the HTTP server waits for open handlers on shutdown)."""
        self.closed = True
        self._wake()

    async def stop(self) -> None:
        self.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def _sse(event: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


# -- routes --------------------------------------------------------------------------------

STATE_KEY = web.AppKey("dashboard_state", DashboardState)
WATCHER_KEY = web.AppKey("dashboard_watcher", ChangeWatcher)


def not_found(message: str) -> web.HTTPNotFound:
    return web.HTTPNotFound(text=json.dumps({"error": message}), content_type="application/json")


def add_view_routes(app: web.Application, state: DashboardState) -> None:
    """The per-node page, its time series, and the jobs view."""

    async def node_handler(request: web.Request) -> web.Response:
        check_params(request, ())
        name = request.match_info["name"]
        page = node_page_json(state, name)
        if page is None:
            raise not_found(f"no node {name!r}")
        return web.json_response(page)

    async def history_handler(request: web.Request) -> web.Response:
        check_params(request, ())
        name = request.match_info["name"]
        if node_page_json(state, name) is None:
            raise not_found(f"no node {name!r}")
        return web.json_response(state.history.of(name))

    async def jobs_handler(request: web.Request) -> web.Response:
        check_params(request, ())
        return web.json_response(jobs_json(state.queries.jobs() if state.queries is not None else None))

    app.router.add_get("/api/node/{name}", node_handler)
    app.router.add_get("/api/node/{name}/history", history_handler)
    app.router.add_get("/api/jobs", jobs_handler)


def add_api_routes(app: web.Application, state: DashboardState, poll_s: float = 1.0, keepalive_s: float = 15.0) -> None:
    """Mount the dashboard's JSON endpoints and the change stream on ``app``."""
    watcher = ChangeWatcher(state.signature, poll_s)
    app[STATE_KEY] = state
    app[WATCHER_KEY] = watcher

    async def fabric_handler(request: web.Request) -> web.Response:
        check_params(request, ())
        return web.json_response(fabric_json(state))

    async def incidents_handler(request: web.Request) -> web.Response:
        check_params(request, ("all", "limit"))
        include_resolved = flag_param(request, "all")
        limit = int_param(request, "limit", DEFAULT_INCIDENT_LIMIT, 1, MAX_INCIDENT_LIMIT)
        rows = [incident_json(i) for i in state.incidents(include_resolved, limit)]
        return web.json_response({"incidents": rows, "all": include_resolved, "limit": limit})

    async def summary_handler(request: web.Request) -> web.Response:
        check_params(request, ())
        return web.json_response(summary_json(state, watcher.version))

    async def stream_handler(request: web.Request) -> web.StreamResponse:
        check_params(request, ())
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
        await resp.prepare(request)
        version = watcher.version
        try:
            await resp.write(b"retry: 3000\n\n" + _sse("changed", {"version": version}))
            while not watcher.closed:
                await watcher.wait(version, keepalive_s)
                if watcher.closed:
                    break
                if watcher.version != version:
                    version = watcher.version
                    await resp.write(_sse("changed", {"version": version}))
                else:
                    await resp.write(b": keepalive\n\n")
        except ConnectionError:
            pass  # the browser went away
        return resp

    sampler = Sampler(state.history)

    async def on_startup(app: web.Application) -> None:
        watcher.start()
        sampler.start(lambda: list(state.registry.nodes.values()), state.registry.clock.time_ms)

    async def on_shutdown(app: web.Application) -> None:
        watcher.close()

    async def on_cleanup(app: web.Application) -> None:
        await watcher.stop()
        await sampler.stop()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    app.router.add_get("/api/fabric", fabric_handler)
    app.router.add_get("/api/incidents", incidents_handler)
    app.router.add_get("/api/summary", summary_handler)
    add_view_routes(app, state)
    app.router.add_get("/api/stream", stream_handler)
    add_page_routes(app, lambda: snapshot_json(state, watcher.version))
