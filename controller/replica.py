"""One controller replica: a standby until elected, then the full controller, fenced.

Lifecycle:

1. standby: serve reads from the local SQLite that follows etcd, refuse agents and admin
   calls with the leader's address, campaign for the leader key;
2. elected: stop the standby server, restore the local tables from etcd (authoritative),
   build the ordinary ``Controller`` on them with the scheduler wrapped in
   ``FencedScheduler``, acks held until the events are in etcd, and a flusher pushing
   every other change; its start-up is the restart path that already exists (planned
   actions replayed, every node a fresh heartbeat timeout);
3. leadership lost (keep-alives failing past the lease, or a fenced write refused):
   stop acting and exit with ``LeadershipLost`` (crash-only: the service manager starts
   the process again and it rejoins as a standby). A graceful stop resigns the lease so
   a standby takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time

import aetcd
import grpc
import structlog
from aiohttp import web
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from controller.detect.shards import ShardLost
from controller.ha.config import HAConfig
from controller.ha.election import Elector, NotLeader
from controller.ha.etcd import connect
from controller.ha.fenced import FencedScheduler
from controller.ha.mirror import StateMirror
from controller.ha.standby import StandbyQuery, StandbyRelay, StandbyTelemetry, standby_admin, standby_http
from controller.service import (
    ADMIN_SERVICE,
    QUERY_SERVICE,
    TELEMETRY_SERVICE,
    Controller,
    ControllerConfig,
    http_ssl_context,
    split_host_port,
)
from controller.store import Store
from starpulse.core import sdnotify
from starpulse.core.auth import AuthInterceptor
from starpulse.core.clock import Clock
from starpulse.core.listen import GRPC_SERVER_OPTIONS, add_grpc_port, ensure_free
from starpulse.core.tls import load_server_credentials
from starpulse.v1 import service_pb2_grpc as sgrpc

log = structlog.get_logger(__name__)


class LeadershipLost(RuntimeError):
    """This replica led and lost the lease; it stopped acting and must be restarted (as a standby)."""


class Replica:
    """Runs one replica until stop is set (or its leadership is lost)."""

    def __init__(self, config: ControllerConfig, clock: Clock) -> None:
        """``clock``: the one the leader's controller and the standby's queries read (the system clock in service)."""
        if config.ha is None:
            raise ValueError("a replica needs the ha settings")
        self.config = config
        self.clock = clock
        self.ha: HAConfig = config.ha
        self.advertise = self.ha.advertise or config.listen
        self.role = "starting"
        self.controller: Controller | None = None
        self.elector: Elector | None = None
        self.mirror: StateMirror | None = None
        self.elected_at = 0.0  # monotonic
        self.acting_at = 0.0

    async def serve_forever(self, stop: asyncio.Event) -> None:
        client = await connect(self.ha)
        try:
            elector = Elector(
                client, self.ha.key("leader"), self.advertise, self.ha.lease_ttl_s, self.ha.poll_interval_s
            )
            self.elector = elector
            if not await self._standby(client, elector, stop):
                return
            await self._lead(client, elector, stop)
        finally:
            await client.close()

    # -- standby ----------------------------------------------------------------------------
    def _prepare_db(self) -> None:
        """Create every module's tables in the local file (building a controller does that), then close it."""
        throwaway = Controller(self.config, clock=self.clock)
        throwaway.store.close()

    async def _standby(self, client: aetcd.Client, elector: Elector, stop: asyncio.Event) -> bool:
        self._prepare_db()
        store = Store(self.config.db_path)
        mirror = StateMirror(store.connection, client, self.ha)
        self.role = "standby"
        server, runner = await self._start_standby_servers(store, elector)
        follower = asyncio.create_task(mirror.follow())
        watchdog = asyncio.create_task(self._watchdog_loop())
        log.info("ha_standby", me=self.advertise, grpc=self.config.listen)
        sdnotify.ready(f"standby, serving reads on {self.config.listen}")
        try:
            won = await elector.campaign(stop)
        finally:
            watchdog.cancel()
            follower.cancel()
            # Bounded: a watch being torn down inside aetcd must not hold up a takeover.
            done, _ = await asyncio.wait({follower}, timeout=2.0)
            log.info("ha_standby_stopping", step="follower stopped" if done else "follower still stopping")
            await server.stop(0)
            await runner.cleanup()
            store.close()
            log.info("ha_standby_stopped")
        if won:
            self.elected_at = time.monotonic()
        return won

    @staticmethod
    async def _watchdog_loop() -> None:
        """WATCHDOG=1 while a standby waits (the leader's sweep loop does it once elected)."""
        watchdog = sdnotify.Watchdog()
        while True:
            watchdog.kick()
            await asyncio.sleep(1.0)

    async def _start_standby_servers(self, store: Store, elector: Elector) -> tuple[grpc.aio.Server, web.AppRunner]:
        cfg = self.config

        def leader() -> str:
            return elector.current_leader

        ensure_free("server.listen", cfg.listen)
        ensure_free("server.http", cfg.http)
        server = grpc.aio.server(interceptors=[AuthInterceptor(cfg.auth)], options=GRPC_SERVER_OPTIONS)
        sgrpc.add_TelemetryServicer_to_server(StandbyTelemetry(leader), server)
        sgrpc.add_RelayServicer_to_server(StandbyRelay(leader), server)
        sgrpc.add_QueryServicer_to_server(StandbyQuery(store, leader, self.clock), server)
        sgrpc.add_AdminServicer_to_server(standby_admin(leader), server)
        checks = health.HealthServicer(experimental_non_blocking=True)
        health_pb2_grpc.add_HealthServicer_to_server(checks, server)
        for svc, ok in (("", True), (QUERY_SERVICE, True), (TELEMETRY_SERVICE, False), (ADMIN_SERVICE, False)):
            status = health_pb2.HealthCheckResponse.SERVING if ok else health_pb2.HealthCheckResponse.NOT_SERVING
            checks.set(svc, status)
        credentials = load_server_credentials(cfg.tls) if cfg.tls is not None else None
        add_grpc_port("server.listen", server, cfg.listen, credentials)
        await server.start()
        runner = web.AppRunner(standby_http(leader), access_log=None)
        await runner.setup()
        host, http_port = split_host_port(cfg.http)
        await web.TCPSite(runner, host, http_port, ssl_context=http_ssl_context(cfg)).start()
        return server, runner

    # -- leader -------------------------------------------------------------------------------
    async def _lead(self, client: aetcd.Client, elector: Elector, stop: asyncio.Event) -> None:
        restore_store = Store(self.config.db_path)
        await StateMirror(restore_store.connection, client, self.ha, elector).restore()
        restore_store.close()
        log.info("ha_takeover", step="state restored")
        config = self.config
        fenced: FencedScheduler | None = None
        if config.heal is not None:
            fenced = FencedScheduler(config.heal.scheduler, elector, None)  # type: ignore[arg-type]
            config = dataclasses.replace(config, heal=dataclasses.replace(config.heal, scheduler=fenced))
        # Built off the event loop: loading the rules and the policy holds the CPU for a second
        # or more on a loaded host, and the lease's keep-alive must go on meanwhile (a 2 s lease
        # ran out mid-build, and the new leader stood down with no one left to take over).
        controller = await asyncio.to_thread(Controller, config, clock=self.clock)
        mirror = StateMirror(controller.store.connection, client, self.ha, elector)
        if fenced is not None:
            fenced.mirror = mirror
        controller.telemetry.before_ack = mirror.flush  # acks only for events already in etcd
        self.controller, self.mirror = controller, mirror
        try:
            await mirror.check()  # still ours? (the lease may have run out while restoring)
        except NotLeader as exc:
            await elector.close()
            raise LeadershipLost(f"{self.advertise} lost the leader lease while taking over: {exc}") from None
        log.info("ha_takeover", step="controller built, lease confirmed")
        await controller.start()
        self.role = "leader"
        self.acting_at = time.monotonic()
        log.warning(
            "ha_leader_acting",
            me=self.advertise,
            token=elector.token,
            took_s=round(self.acting_at - self.elected_at, 3),
        )
        flusher = asyncio.create_task(self._flush_loop(mirror))
        lost = asyncio.create_task(elector.lost.wait())
        stopping = asyncio.create_task(stop.wait())
        failing = asyncio.create_task(controller.failed.wait())  # e.g. a detection shard ended
        await asyncio.wait({lost, stopping, failing}, return_when=asyncio.FIRST_COMPLETED)
        lost.cancel()
        stopping.cancel()
        failing.cancel()
        deposed = elector.lost.is_set()
        flusher.cancel()
        await asyncio.gather(flusher, return_exceptions=True)
        if not deposed:
            with contextlib.suppress(NotLeader, aetcd.exceptions.ClientError):
                await mirror.flush()
        self.role = "stopping"
        await controller.stop()
        if deposed:
            await elector.close()
            raise LeadershipLost(f"{self.advertise} lost the leader lease (token {elector.token})")
        await elector.resign()
        if controller.failed.is_set():
            raise ShardLost(controller.failure)  # resigned: a standby takes over with whole detection

    async def _flush_loop(self, mirror: StateMirror) -> None:
        """Push changes nothing else pushed (incidents, outbox, presence transitions) every flush_interval_s."""
        while True:
            await asyncio.sleep(self.ha.flush_interval_s)
            try:
                await mirror.flush()
            except NotLeader:
                return  # the elector is marked lost; _lead stops the controller
            except aetcd.exceptions.ClientError as exc:
                log.warning("ha_flush_failed", detail=str(exc))
