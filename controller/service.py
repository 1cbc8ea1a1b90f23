"""The controller process: gRPC (telemetry, query, health), HTTP, and the heartbeat sweep."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import structlog
from aiohttp import web
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from controller import gcpolicy
from controller.detect.grouping_task import GroupingTask
from controller.detect.model import ConditionChange
from controller.detect.pipeline import Detection, DetectionConfig
from controller.detect.rules import load_rules
from controller.detect.shard_worker import ShardSettings
from controller.detect.shards import DetectShards, ShardLost
from controller.fabric import Fabric, load_fabric
from controller.ha.config import HAConfig
from controller.heal.guards import GuardConfig, Guards
from controller.heal.healer import HealConfig, Healer
from controller.heal.policy import Policy, SqliteHealHistory, load_policy
from controller.heal.repair import RepairConfig, RepairLoop
from controller.heal.scheduler.base import Scheduler
from controller.heal.spares import SparePool
from controller.heal.states import AUTOMATIC, NodeHealState, RemediationStore, lifecycle_counts
from controller.ingest.decider import ReportDecider
from controller.ingest.registry import NodeRegistry
from controller.ingest.relayed import RelayServicer, relayed_or_peer_node_id
from controller.ingest.servicer import TelemetryServicer
from controller.jobs.registry import JobRegistry
from controller.metrics import ControllerMetrics
from controller.outputs.admin import AdminServicer
from controller.outputs.http import build_app
from controller.outputs.notify import Notifier, NotifyConfig, Outbox
from controller.outputs.query import QueryServicer
from controller.outputs.web.api import breaker_json
from controller.query.live import LiveIncidentCommands, LiveQueries
from controller.stages import StageTracker
from controller.store import Store
from starpulse.core import sdnotify
from starpulse.core.auth import AuthConfig, AuthInterceptor, HttpAuthConfig
from starpulse.core.clock import SYSTEM_CLOCK, Clock
from starpulse.core.listen import GRPC_SERVER_OPTIONS, ListenError, add_grpc_port, ensure_free
from starpulse.core.schema import setting
from starpulse.core.tls import TLSSettings, load_server_credentials, peer_node_id, server_ssl_context
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2_grpc as sgrpc

log = structlog.get_logger(__name__)

TELEMETRY_SERVICE = "starpulse.v1.Telemetry"
QUERY_SERVICE = "starpulse.v1.Query"
ADMIN_SERVICE = "starpulse.v1.Admin"
RELAY_SERVICE = "starpulse.v1.Relay"


@dataclass
class HealSettings:
    """Self-healing: which scheduler acts, with which policy and guards."""

    scheduler: Scheduler
    policy_path: Path | None = setting(
        None, "Remediation policy file (YAML: incident kind -> action); null: the packaged default policy"
    )
    guards: GuardConfig = field(default_factory=GuardConfig)
    heal: HealConfig = field(default_factory=HealConfig)


@dataclass
class ControllerConfig:
    """Controller settings; units in names. The settings file places them in sections (starpulse.app.config)."""

    listen: str = setting("127.0.0.1:50051", "gRPC address for agents, relays and the CLI", address=True)
    http: str = setting("127.0.0.1:8080", "HTTP address: /metrics, /healthz, /api and the dashboard", address=True)
    db_path: Path = setting(Path("starpulse.db"), "SQLite database: nodes, events, incidents, remediations")
    heartbeat_timeout_s: float = setting(
        15.0, "Seconds a node may stay silent before it is unreachable: three missed reports at 5 s", gt=0
    )
    sweep_interval_s: float = setting(
        1.0, "Seconds between heartbeat sweeps and detection ticks: a silent node is noticed within this", gt=0
    )
    max_message_bytes: int = setting(
        4 * 1024 * 1024,
        "Bytes: a larger agent message is refused (RESOURCE_EXHAUSTED); 4 MiB holds a full report of a "
        "large node many times over",
        ge=1024,
    )
    rate_per_node_per_s: float = setting(
        200.0, "Messages per second a node may send, sustained; far above one report and its events", gt=0
    )
    rate_burst: float = setting(
        5000.0, "Messages a node may send at once: a replay of its buffered events after an outage fits", ge=1
    )
    report_interval_s: float = setting(
        0.0, "Seconds between reports agents are told to keep; 0: each agent keeps its own", ge=0
    )
    report_ack_interval_s: float = setting(
        10.0,
        "Seconds: report-only acks go out at most this often per stream (event acks at once); a report "
        "lost with a dropped stream is superseded by the next one",
        ge=0,
    )
    relays: list[str] = setting(
        [],
        "Relay ids (their certificates' names) that may carry agents' streams under mutual TLS; plaintext: any relay",
    )
    allowed_nodes: list[str] | None = setting(
        None, "Node ids that may register; null: any valid id, or the declared fabric's nodes"
    )
    fabric: Fabric | None = None  # the declared fabric (or fabric_path); None: no topology root cause
    fabric_path: Path | None = setting(
        None, "Declared fabric file (JSON/YAML from `starpulse topology generate`); null: no topology root cause"
    )
    rules_path: Path | None = setting(None, "Detection rules file; null: the packaged default rules")
    jobs: dict[str, list[str]] = setting(
        {}, "Static job -> nodes placement, until a job registry reports it", example={"llama-70b": ["node-001"]}
    )
    detection: DetectionConfig = field(default_factory=DetectionConfig)
    notify: NotifyConfig = field(default_factory=NotifyConfig)  # alert receivers (none: alerts off)
    heal: HealSettings | None = None  # self-healing (None: detect and alert only)
    controller_id: str = setting("controller-0", "This controller's name in acks and logs", nonempty=True)
    grace_s: float = setting(5.0, "Seconds open streams get to end on shutdown before they are cut", ge=0)
    extra_listen: list[str] = setting([], "More gRPC addresses to listen on", address=True)
    # Mutual TLS on the gRPC port (None: plaintext). With it a node may report only as the
    # node id its client certificate names (starpulse.core.tls.peer_node_id).
    tls: TLSSettings | None = None
    # Admin credential and whether reads need it (starpulse.core.auth). Default: dev mode, open.
    auth: AuthConfig = field(default_factory=AuthConfig)
    # The HTTP side: HTTPS on the same certificates, and who may read it (starpulse.core.auth).
    http_auth: HttpAuthConfig = field(default_factory=HttpAuthConfig)
    # Several replicas coordinated by etcd (controller.replica); None: one controller on SQLite.
    ha: HAConfig | None = None


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
    def __init__(self, config: ControllerConfig, clock: Clock | None = None) -> None:
        """``clock``: the one clock every part reads the time from and waits on (None: the real one).

        A simulation hands in a ``FakeClock``; detection shards, being other processes, keep real time.
        """
        self.config = config
        self.clock = clock if clock is not None else SYSTEM_CLOCK
        self.metrics = ControllerMetrics()
        self.fabric = config.fabric or (load_fabric(config.fabric_path) if config.fabric_path else None)
        allowed = config.allowed_nodes
        if allowed is None and self.fabric is not None:
            allowed = [*self.fabric.nodes(), *self.fabric.switches()]
        self.store = Store(config.db_path)
        self.registry = NodeRegistry(
            self.store,
            self.metrics,
            heartbeat_timeout_s=config.heartbeat_timeout_s,
            allowed_nodes=allowed,
            clock=self.clock,
        )
        self.jobs = JobRegistry(self.store.connection, self.clock)
        for job, nodes in config.jobs.items():
            self.jobs.register_job(job, nodes)
        self.registry.listeners.append(self.jobs)
        self.detection = Detection(
            self.store.connection,
            load_rules(config.rules_path),
            self.fabric,
            self.metrics,
            config.detection,
            jobs_of=self.jobs.jobs_of,
            fleet_size=self._fleet_size,
            clock=self.clock,
        )
        self.registry.listeners.append(self.detection)
        self.queries = LiveQueries(self.store, self.detection, self.registry, self.jobs)  # what outputs read
        self.incident_commands = LiveIncidentCommands(self.detection)
        self.notifier = Notifier(
            config.notify,
            Outbox(self.store.connection, self.clock),
            metrics_hook=lambda outcome, receiver, n: self.metrics.alert_notifications.labels(receiver, outcome).inc(n),
        )
        self.metrics.set_outbox_depth_source(self.notifier.outbox_depth)
        self.detection.listeners.append(self.notifier)
        # One trace per event from the agent's read to the delivered webhook (controller.stages).
        self.stages = StageTracker(lambda stage, s: self.metrics.event_stage_seconds.labels(stage).observe(s))
        self.registry.stages = self.detection.stages = self.notifier.stages = self.stages
        self._notify_stop = asyncio.Event()
        self._notify_task: asyncio.Task[None] | None = None
        self.healer = self._build_healer(config.heal) if config.heal is not None else None
        self.metrics.set_lifecycle_source(
            [str(st) for st in NodeHealState],
            lambda: {str(k): v for k, v in lifecycle_counts(self.store.connection, self._fleet_size()).items()},
        )
        self._heal_task: asyncio.Task[None] | None = None
        self.health = health.HealthServicer(experimental_non_blocking=True)
        # Who decides reports: detection's shards when there are workers (started with the
        # controller, before its port opens), else detection itself on this event loop.
        self.shards = self._build_shards() if config.detection.workers > 0 else None
        decider: ReportDecider = self.shards if self.shards is not None else self.detection
        self.telemetry = TelemetryServicer(
            self.registry,
            self.metrics,
            decider,
            rate_per_s=config.rate_per_node_per_s,
            burst=config.rate_burst,
            report_interval_s=config.report_interval_s,
            controller_id=config.controller_id,
            identity_of=relayed_or_peer_node_id if config.tls is not None else None,
            report_ack_interval_s=config.report_ack_interval_s,
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
        self._sweeper: asyncio.Task[None] | None = None
        # Incidents open when their conditions' grouping windows close, not on the next sweep.
        self.detection.windows.sweep_s = config.sweep_interval_s
        self.grouping = GroupingTask(self.detection.correlator.next_due_ms, self.detection.group, self.clock)
        self.detection.on_pending = self.grouping.wake
        self._grouper: asyncio.Task[None] | None = None
        # The sweep's steps, in order, each timed (starpulse_periodic_seconds{step}).
        self.detection.failslow_stepwise = True  # _sweep_loop runs it in steps
        self._periodic: list[tuple[str, Callable[[], object]]] = [
            ("heartbeat_sweep", self.registry.sweep),
            ("presence_flush", self.registry.flush_presence),
            ("detection_tick", self.detection.tick),
        ]
        self.failed = asyncio.Event()  # something the controller cannot go on without (a detection shard) ended
        self.failure = ""
        self.grpc_port = 0
        self.http_port = 0
        self._serving = False

    def _build_healer(self, settings: HealSettings) -> Healer:
        store = RemediationStore(self.store.connection, self.clock)  # the spares' clock too
        guards = Guards(settings.guards, store, self.store.connection, self.clock)
        policy = load_policy(settings.policy_path)
        spares = (
            SparePool(self.fabric, lambda node: self._spare_healthy(node, policy), store)
            if self.fabric is not None
            else None
        )
        correlator = self.detection.correlator
        repairs = RepairLoop(
            policy.repair,
            store,
            settings.scheduler,
            self.registry,
            open_incidents=lambda: correlator.incidents(active_only=True, limit=100_000),
            conditions_clear=correlator.conditions_clear,
            resolve=lambda incident_id, why, since: correlator.resolve_on_evidence(incident_id, why, AUTOMATIC, since),
            spares=spares,
            clock=self.clock,
            config=RepairConfig(poll_s=settings.heal.repair_poll_s),
            holds_node=policy.holds,
        )
        if spares is not None:
            self.metrics.set_spare_sources(spares.counts, policy.repair.spare_target)
        healer = Healer(
            policy,
            guards,
            store,
            SqliteHealHistory(store, self.clock),
            spares,
            settings.scheduler,
            self.jobs,
            self.registry,
            self.metrics,
            fleet_size=self._fleet_size,
            open_incidents=lambda: self.detection.correlator.incidents(active_only=True, limit=100_000),
            config=settings.heal,
            clock=self.clock,
            repairs=repairs,
        )
        self.detection.listeners.append(healer)
        return healer

    def _breaker_json(self) -> dict[str, object]:
        """The dashboard's breaker chip: the healer's real breaker, with readable times."""
        assert self.healer is not None
        return breaker_json(self.healer.guards.breaker.state(), self.clock.time_ms())

    def _spares_json(self) -> dict[str, int]:
        """The dashboard's spare pool chip: available, allocated, unavailable, and the target."""
        assert self.healer is not None and self.healer.spares is not None
        target = self.healer.repairs.policy.spare_target if self.healer.repairs is not None else 0
        return {**self.healer.spares.counts(), "target": target}

    def _spare_healthy(self, node: str, policy: Policy) -> bool:
        """A spare is usable when its agent is heard and no open incident holds it (one that
        blames it and that the policy acts on: not a switch fault it only sits under)."""
        record = self.registry.nodes.get(node)
        if record is None or record.state != "online":
            return False
        return not any(policy.holds(i, node) for i in self.detection.correlator.incidents(active_only=True))

    def _fleet_size(self) -> int:
        if self.fabric is not None:
            return len(self.fabric.nodes())
        return sum(1 for n in self.registry.nodes.values() if n.role == ipb.NODE_ROLE_COMPUTE)

    def _build_shards(self) -> DetectShards:
        """Compute nodes' reports and events to worker processes; switches stay with detection here."""
        cfg = self.config
        shards = DetectShards(
            cfg.detection.workers,
            ShardSettings(
                rules_path=str(cfg.rules_path) if cfg.rules_path is not None else None,
                failslow=cfg.detection.failslow,
                tick_s=cfg.sweep_interval_s,
            ),
            local=self.detection,
            on_changes=self.detection.feed_shard_changes,
            on_lost=self._shard_lost,
        )
        self.detection.shards = shards  # compute nodes' events and forgetting go to their shard
        self.metrics.set_shard_sources(lambda: len(shards.running()), lambda: shards.in_flight)
        return shards

    def _shard_lost(self, index: int) -> None:
        """A shard held some nodes' conditions: without it detection would be silently partial."""
        self.failure = f"detection shard {index} ended"
        self._serving = False
        self.failed.set()

    async def start(self) -> None:
        cfg = self.config
        ensure_free("server.listen", cfg.listen)  # both before anything opens: no half-started controller
        ensure_free("server.http", cfg.http)
        if self.shards is not None:
            await self.shards.start()  # before the port opens: no report may bypass them
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
        self._sweeper = asyncio.create_task(self._sweep_loop())
        self._grouper = asyncio.create_task(self.grouping.run())
        self._notify_task = asyncio.create_task(self.notifier.run(self._notify_stop))
        if self.healer is not None:
            self._heal_task = asyncio.create_task(self.healer.run(self._notify_stop))
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

    async def _sweep_loop(self) -> None:
        watchdog = sdnotify.Watchdog()  # WATCHDOG=1 every half WatchdogSec= while sweeps keep running
        while True:
            await self.clock.sleep(self.config.sweep_interval_s)
            for step, run in self._periodic:
                started = time.perf_counter()
                try:
                    run()
                except Exception:
                    log.exception("periodic_step_failed", step=step)
                self.metrics.periodic_seconds.labels(step).observe(time.perf_counter() - started)
            if self.detection.failslow_due():
                await self._failslow_evaluation()
            watchdog.kick()

    async def _failslow_evaluation(self) -> None:
        """One fail-slow peer comparison in steps of ~500 nodes, reports decided in between.

        In one piece it held the event loop ~150 ms at 10,000 nodes (bench.failslow_eval).
        """
        changes: list[ConditionChange] = []
        steps = self.detection.failslow.evaluation_steps(changes)
        observe = self.metrics.periodic_seconds.labels("failslow_step").observe
        finished = False
        while not finished:
            started = time.perf_counter()
            try:
                next(steps)
            except StopIteration:
                finished = True  # the last step applied the verdicts
            except Exception:
                log.exception("periodic_step_failed", step="failslow_step")
                return
            observe(time.perf_counter() - started)
            if not finished:
                await asyncio.sleep(0)
        try:
            self.detection.feed(changes)
        except Exception:
            log.exception("periodic_step_failed", step="failslow_feed")

    async def stop(self) -> None:
        """Graceful: NOT_SERVING first, let streams end, flush presence, close the store."""
        sdnotify.stopping("flushing and closing")
        self._serving = False
        self.health.enter_graceful_shutdown()
        for task in (self._sweeper, self._grouper):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._notify_stop.set()
        if self._notify_task is not None:
            await self._notify_task  # in-flight deliveries finish; the rest waits in the outbox
        if self._heal_task is not None:
            await self._heal_task  # a remediation in progress finishes its current step
        if self._server is not None:
            await self._server.stop(self.config.grace_s)
        if self.shards is not None:
            await self.shards.stop()  # after the streams: what they handed over is decided first
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
