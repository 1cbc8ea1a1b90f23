"""The controller's HTTP side: /metrics, /healthz, a small JSON API, and the web dashboard at ``/``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web
from google.protobuf.json_format import MessageToDict
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from controller.heal.states import parse_states
from controller.ingest.registry import NodeRegistry
from controller.metrics import ControllerMetrics
from controller.outputs.http_auth import auth_middleware
from controller.outputs.web.api import (
    ApiError,
    BreakerProvider,
    DashboardState,
    SparesProvider,
    add_api_routes,
)
from controller.query.store import StoreQueries
from controller.query.surface import Queries
from controller.store import Store
from starpulse.core.auth import HttpAuthConfig
from starpulse.core.findings import event_kind_name, severity_name


def build_app(
    registry: NodeRegistry,
    store: Store,
    metrics: ControllerMetrics,
    healthy: Callable[[], bool],
    queries: Queries | None = None,
    breaker: BreakerProvider | None = None,
    poll_s: float = 1.0,
    spares: SparesProvider | None = None,
    http_auth: HttpAuthConfig | None = None,
    secure: bool = False,
) -> web.Application:
    """The aiohttp app. ``queries`` is what it reads (the controller's live query surface;
    None: the store's alone, without a fabric); ``http_auth`` (None: open) guards it,
    ``secure`` says it is served over HTTPS (cookie flags)."""
    reads = queries if queries is not None else StoreQueries(store, registry.clock)
    dashboard = DashboardState(registry, reads, breaker, lifecycle=reads.lifecycle, spares=spares)

    async def metrics_handler(request: web.Request) -> web.Response:
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(request: web.Request) -> web.Response:
        if healthy():
            return web.Response(text="ok\n")
        return web.Response(status=503, text="not serving\n")

    async def api_nodes(request: web.Request) -> web.Response:
        try:  # ?state=repairing,validating: only nodes in those lifecycle states
            states = parse_states(s for s in request.query.get("state", "").split(",") if s.strip())
        except ValueError as err:
            raise ApiError(str(err)) from None
        rows = [
            MessageToDict(s, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
            for s in reads.node_statuses(states)
        ]
        return web.json_response({"nodes": rows})

    async def api_events(request: web.Request) -> web.Response:
        try:
            limit = min(int(request.query.get("limit", "100")), 10_000)
        except ValueError:
            raise web.HTTPBadRequest(text="limit must be an integer") from None
        node = request.query.get("node") or None
        events: list[dict[str, Any]] = []
        for row in reads.events(node, limit):
            ev = row.event
            events.append(
                {
                    "node": row.node_id,
                    "seq": ev.seq,
                    "timestamp_ms": ev.timestamp_ms,
                    "received_ms": row.received_ms,
                    "kind": event_kind_name(ev.kind),
                    "severity": severity_name(ev.severity),
                    "component": ev.component,
                    "message": ev.message,
                    "action": ev.action,
                    "xid": ev.xid or None,
                    "pci": ev.pci or None,
                    "source": ev.source,
                }
            )
        return web.json_response({"events": events})

    middlewares = [auth_middleware(http_auth, secure)] if http_auth is not None else []
    app = web.Application(client_max_size=1024 * 1024, middlewares=middlewares)
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/api/nodes", api_nodes)
    app.router.add_get("/api/events", api_events)
    add_api_routes(app, dashboard, poll_s=poll_s)  # also / and /static/ (web/page.py)
    return app
