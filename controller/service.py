"""The controller process: gRPC (telemetry, query, health), HTTP, and the heartbeat sweep."""

from __future__ import annotations

import asyncio
import ssl

import grpc
import structlog
from aiohttp import web
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from controller import gcpolicy
from controller.core import DecisionCore
from controller.detect.shards import ShardLost
from controller.fabric import load_fabric
from controller.heal.states import NodeHealState, lifecycle_counts
from controller.ingest.quota import IngestQuota
from controller.ingest.relayed import RelayServicer, relayed_or_peer_node_id
from controller.ingest.servicer import TelemetryServicer
from controller.metrics import ControllerMetrics
from controller.outputs import http_logs
from controller.outputs.admin import AdminServicer
from controller.outputs.http import build_app
from controller.outputs.notify import Notifier, Outbox
from controller.outputs.query import QueryServicer
from controller.outputs.web.api import breaker_json
from controller.query.fleet import CAUSES, headline
from controller.query.live import LiveIncidentCommands, LiveQueries
from controller.settings import ControllerConfig, HealSettings
from controller.stages import StageTracker
from controller.store import Store
from starpulse.core import sdnotify
from starpulse.core.auth import AuthInterceptor
from starpulse.core.clock import Clock
from starpulse.core.listen import GRPC_SERVER_OPTIONS, ListenError, add_grpc_port, ensure_free
from starpulse.core.tls import ADMIN_CERT_NAME, load_server_credentials, peer_node_id, server_ssl_context
from starpulse.v1 import service_pb2_grpc as sgrpc

log = structlog.get_logger(__name__)

__all__ = ["Controller", "ControllerConfig", "HealSettings", "http_ssl_context", "split_host_port"]

TELEMETRY_SERVICE = "starpulse.v1.Telemetry"
QUERY_SERVICE = "starpulse.v1.Query"
ADMIN_SERVICE = "starpulse.v1.Admin"
RELAY_SERVICE = "starpulse.v1.Relay"
METRICS_WINDOW_S = 30 * 86400.0  # the fleet report's series cover the last 30 days


def http_ssl_context(config: ControllerConfig) -> ssl.SSLContext | None:
    """The HTTPS context of the HTTP side: the gRPC side's certificates, unless http.tls is off."""
    if config.tls is None or not config.http_auth.tls:
        return None
    return server_ssl_context(config.tls, client_certs=config.http_auth.require_auth)


def split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address {address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


class Controller:
    def __init__(self, config: ControllerConfig, *, clock: Clock) -> None:
        """``clock``: the one clock every part reads the time from and waits on, always handed in.

        The CLI's composition root hands in ``SYSTEM_CLOCK``, a simulation a ``FakeClock``;
        detection shards, being other processes, keep real time.
        Everything that decides is the ``DecisionCore`` (controller.core); this puts gRPC, HTTP
        and alerts in front of it. Every part is built with what it needs: nothing is assigned
        to a part after it is built (tools/wiring_count.py counts).
        """
        self.config = config
        self.clock = clock
        self.metrics = ControllerMetrics()
        self.fabric = config.fabric or (load_fabric(config.fabric_path) if config.fabric_path else None)
        allowed = config.allowed_nodes
        if allowed is None and self.fabric is not None:
            allowed = [*self.fabric.nodes(), *self.fabric.switches()]
        self.store = Store(config.db_path)
        # One trace per event from the agent's read to the delivered webhook (controller.stages).
        self.stages = StageTracker(lambda stage, s: self.metrics.event_stage_seconds.labels(stage).observe(s))
        self.notifier = Notifier(
            config.notify,
            Outbox(self.store.connection, self.clock),
            self.clock,
            metrics_hook=lambda outcome, receiver, n: self.metrics.alert_notifications.labels(receiver, outcome).inc(n),
            stages=self.stages,
        )
        self.metrics.set_outbox_depth_source(self.notifier.outbox_depth)
        self.core = DecisionCore(
            config,
            self.clock,
            self.store,
            self.metrics,
            fabric=self.fabric,
            allowed_nodes=allowed,
            stages=self.stages,
            incident_listeners=[self.notifier],
            on_shard_lost=self._shard_lost,
        )
        self.registry = self.core.registry
        self.jobs = self.core.jobs
        self.detection = self.core.detection
        self.healer = self.core.healer
        # Who decides reports: detection (in its shards when there are workers, started with
        # the controller before its port opens).
        self.shards = self.detection.shards
        self.grouping = self.detection.grouping
        self.queries = LiveQueries(self.store, self.detection, self.registry, self.jobs)  # what outputs read
        self.incident_commands = LiveIncidentCommands(self.detection)
        self._notify_stop = asyncio.Event()
        self._notify_task: asyncio.Task[None] | None = None
        self.metrics.set_fleet_report_source(lambda: headline(self.queries.fleet_report(METRICS_WINDOW_S)), CAUSES)
        self.metrics.set_lifecycle_source(
            [str(st) for st in NodeHealState],
            lambda: {str(k): v for k, v in lifecycle_counts(self.store.connection, self.core.fleet_size()).items()},
        )
        self.health = health.HealthServicer(experimental_non_blocking=True)
        self.telemetry = TelemetryServicer(
            self.registry,
            self.metrics,
            self.detection,
            rate_per_s=config.rate_per_node_per_s,
            burst=config.rate_burst,
            report_interval_s=config.report_interval_s,
            controller_id=config.controller_id,
            identity_of=relayed_or_peer_node_id if config.tls is not None else None,
            report_ack_interval_s=config.report_ack_interval_s,
            not_nodes=frozenset({ADMIN_CERT_NAME, *config.auth.admin_cert_names, *config.relays}),
            quota=IngestQuota(self.store.connection, self.clock),
        )
        self.relay = RelayServicer(
            self.telemetry,
            self.metrics,
            config.max_message_bytes,
            identity_of=peer_node_id if config.tls is not None else None,
            allowed_relays=config.relays,
        )
        self._server: grpc.aio.Server | None = None
        self._runner: web.AppRunner | None = None
        self.failed = asyncio.Event()  # something the controller cannot go on without (a detection shard) ended
        self.failure = ""
        self.grpc_port = 0
        self.http_port = 0
        self._serving = False

    def _breaker_json(self) -> dict[str, object]:
        """The dashboard's breaker chip: the healer's real breaker, with readable times."""
        assert self.healer is not None
        return breaker_json(self.healer.guards.breaker.state(), self.clock.time_ms())

    def _spares_json(self) -> dict[str, int]:
        """The dashboard's spare pool chip: available, allocated, unavailable, and the target."""
        assert self.healer is not None and self.healer.spares is not None
        target = self.healer.repairs.spare_target() if self.healer.repairs is not None else 0
        return {**self.healer.spares.counts(), "target": target}

    def _shard_lost(self, index: int) -> None:
        """A shard held some nodes' conditions: without it detection would be silently partial."""
        self.failure = f"detection shard {index} ended"
        self._serving = False
        self.failed.set()

    async def start(self) -> None:
        cfg = self.config
        ensure_free("server.listen", cfg.listen)  # both before anything opens: no half-started controller
        ensure_free("server.http", cfg.http)
        await self.core.start_shards()  # before the port opens: no report may bypass them
        self.store.start_checkpointer()
        credentials = load_server_credentials(cfg.tls) if cfg.tls is not None else None
        ssl_context = http_ssl_context(cfg)
        server = grpc.aio.server(
            interceptors=[AuthInterceptor(cfg.auth)],
            options=[
                *GRPC_SERVER_OPTIONS,
                ("grpc.max_receive_message_length", cfg.max_message_bytes),
                ("grpc.max_send_message_length", 16 * 1024 * 1024),
                ("grpc.keepalive_time_ms", 60_000),
                ("grpc.keepalive_timeout_ms", 20_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 20_000),
                ("grpc.http2.max_ping_strikes", 0),
            ],
        )
        sgrpc.add_TelemetryServicer_to_server(self.telemetry, server)
        sgrpc.add_RelayServicer_to_server(self.relay, server)
        sgrpc.add_QueryServicer_to_server(QueryServicer(self.queries), server)
        sgrpc.add_AdminServicer_to_server(AdminServicer(self), server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        self.grpc_port = add_grpc_port("server.listen", server, cfg.listen, credentials)
        await server.start()
        self._server = server
        for svc in ("", TELEMETRY_SERVICE, RELAY_SERVICE, QUERY_SERVICE, ADMIN_SERVICE):
            self.health.set(svc, health_pb2.HealthCheckResponse.SERVING)
        self._serving = True

        app = build_app(
            self.registry,
            self.store,
            self.metrics,
            healthy=lambda: self._serving,
            queries=self.queries,
            breaker=self._breaker_json if self.healer is not None else None,
            spares=self._spares_json if self.healer is not None and self.healer.spares is not None else None,
            http_auth=cfg.http_auth,
            secure=ssl_context is not None,
        )
        # aiohttp logs a request it cannot parse with the raw line: never with a credential in it.
        http_logs.install(cfg.http_auth.tokens or ())
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        host, port = split_host_port(cfg.http)
        site = web.TCPSite(self._runner, host, port, ssl_context=ssl_context)
        try:
            await site.start()
        except OSError as exc:  # taken since the probe: close what opened, then say which address
            await server.stop(0)
            await self._runner.cleanup()
            raise ListenError("server.http", cfg.http, exc.strerror or str(exc)) from None
        self.http_port = int(self._runner.addresses[0][1]) if self._runner.addresses else port
        self.core.start()  # the sweep loop, the grouping task, the healer
        self._notify_task = asyncio.create_task(self.notifier.run(self._notify_stop))
        log.info(
            "controller_started",
            grpc=f"{split_host_port(cfg.listen)[0]}:{self.grpc_port}",
            http=f"{host}:{self.http_port}",
            https=ssl_context is not None,
            http_auth="required" if cfg.http_auth.require_auth else "open",
            db=str(cfg.db_path),
            nodes_known=len(self.registry.nodes),
            tls=cfg.tls is not None,
            admin_auth="open" if cfg.auth.admin_open else "required",
            open_reads=cfg.auth.open_reads,
        )
        if cfg.tls is None:
            log.warning("grpc_plaintext", detail="no TLS: any client can claim any node id")
        if cfg.auth.admin_open:
            log.warning(
                "admin_open",
                detail="no admin tokens configured: anyone who reaches the gRPC port may "
                "cordon, drain, approve and reset the breaker (dev mode)",
            )
        sdnotify.ready(f"serving gRPC on port {self.grpc_port}, HTTP on port {self.http_port}")

    async def stop(self) -> None:
        """Graceful: NOT_SERVING first, let streams end, flush presence, close the store."""
        sdnotify.stopping("flushing and closing")
        self._serving = False
        self.health.enter_graceful_shutdown()
        await self.core.stop()  # the sweep loop and the grouping task
        self._notify_stop.set()
        healing = asyncio.create_task(self.core.stop_healing())  # a remediation finishes its step
        if self._notify_task is not None:
            await self._notify_task  # in-flight deliveries finish; the rest waits in the outbox
        await healing
        if self._server is not None:
            await self._server.stop(self.config.grace_s)
        await self.core.stop_shards()  # after the streams: what they handed over is decided first
        if self._runner is not None:
            await self._runner.cleanup()
        self.registry.flush_presence(force=True)
        self.store.close()
        log.info("controller_stopped")

    async def serve_forever(self, stop: asyncio.Event) -> None:
        """The controller process's life (the CLI's): also owns the process-wide GC policy."""
        await self.start()
        gcpolicy.tune()
        collections = asyncio.create_task(gcpolicy.run())
        stopping = asyncio.create_task(stop.wait())
        failing = asyncio.create_task(self.failed.wait())
        try:
            await asyncio.wait({stopping, failing}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            failing.cancel()
            collections.cancel()
            await self.stop()
        if self.failed.is_set():
            raise ShardLost(self.failure)
