"""`starpulse relay`: terminates agents' streams near them and carries them to the controller batched.

Agents connect to a relay exactly as to a controller (the same Telemetry.Connect, the same
agent). The relay does not parse their messages: it forwards each as bytes, tagged with a
stream id, and writes the controller's answers back as bytes. So it holds no node state
and nothing durable; every decision (Hello checks, acks, rejections, commands) stays the
controller's. With mTLS the relay verifies each agent's certificate and tells the
controller the node id it names; the controller trusts that only from relays listed in
its ``ingest.relays``.

When the relay loses the controller, it ends every agent stream with UNAVAILABLE and
refuses new ones until it is back: agents keep their events buffered and replay what the
controller had not acked, so a relay restart or a controller failover loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass, field

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from relay.metrics import RelayCollector
from relay.upstream import Upstream
from starpulse import __version__
from starpulse.core import sdnotify
from starpulse.core.listen import GRPC_SERVER_OPTIONS, add_grpc_port
from starpulse.core.metrics_http import MetricsServer, serve_collector
from starpulse.core.schema import meta, setting
from starpulse.core.tls import TLSSettings, load_channel_credentials, load_server_credentials, peer_node_id
from starpulse.v1 import service_pb2 as spb

log = structlog.get_logger(__name__)

CONNECT_METHOD = "Connect"
TELEMETRY_SERVICE = "starpulse.v1.Telemetry"
_STATUS_BY_CODE = {code.value[0]: code for code in grpc.StatusCode}


@dataclass
class RelayConfig:
    """Relay settings; units in names. The settings file places them in sections (starpulse.app.config)."""

    controllers: list[str] = field(
        metadata=meta(
            "Controller addresses, tried in order; with HA every replica (a standby names the leader)",
            address=True,
            nonempty=True,
            example=["controller.example.internal:50051"],
        )
    )
    relay_id: str = field(
        metadata=meta(
            "This relay's name; with mutual TLS its certificate's name, listed in the controller's ingest.relays",
            nonempty=True,
            example="relay-pod3",
        )
    )
    listen: str = setting("0.0.0.0:50051", "Address the agents of this pod connect to", address=True)
    linger_s: float = setting(
        0.02, "Seconds a batch gathers before it goes up: fewer, larger messages, added to report latency", ge=0
    )
    max_message_bytes: int = setting(
        4 * 1024 * 1024 - 64 * 1024,
        "Bytes of the largest batch sent up: below the controller's own 4 MiB limit",
        ge=1024,
    )
    tls: TLSSettings | None = None
    extra_listen: list[str] = setting([], "More addresses to listen on", address=True)
    metrics_listen: str | None = setting(None, "Serve Prometheus /metrics at this address; null: off", address=True)


@dataclass(eq=False)
class _AgentStream:
    outbox: asyncio.Queue[spb.RelayedControllerMessage]
    generation: int
    # Given when its first message goes up, so ids rise in the order the controller first
    # sees them: it can tell a late message of an ended stream (lower id) from a new stream.
    stream_id: int = 0
    announced: bool = False  # a message of it went up: the controller knows the stream


class Relay:
    def __init__(self, config: RelayConfig) -> None:
        if not config.relay_id:
            raise ValueError("a relay needs a relay id")
        self.config = config
        credentials = load_channel_credentials(config.tls) if config.tls is not None else None
        self.upstream = Upstream(
            config.controllers,
            config.relay_id,
            on_down=self._deliver,
            on_lost=self._upstream_lost,
            credentials=credentials,
            linger_s=config.linger_s,
            version=__version__,
        )
        self.streams: dict[int, _AgentStream] = {}  # by stream id: those the controller knows
        self._agents: set[_AgentStream] = set()  # every open agent stream
        self._ids = itertools.count(1)
        self._server: grpc.aio.Server | None = None
        self._upstream_task: asyncio.Task[None] | None = None
        self.health = health.HealthServicer(experimental_non_blocking=True)
        self.port = 0
        self.refused = 0  # agents' streams refused while no controller was reachable
        self._metrics: MetricsServer | None = None
        self.metrics_port = 0

    def agent_streams(self) -> set[_AgentStream]:
        return self._agents

    # -- agent side -------------------------------------------------------------------------
    async def _connect(self, request_iterator: object, context: grpc.aio.ServicerContext) -> None:
        """One agent's Telemetry.Connect, as bytes both ways."""
        if not self.upstream.ready.is_set():
            self.refused += 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the relay has no controller right now; retry")
            return
        stream = _AgentStream(asyncio.Queue(), self.upstream.generation)
        self._agents.add(stream)
        identity = (peer_node_id(context) or "") if self.config.tls is not None else ""
        pump = asyncio.create_task(self._pump(stream, context, identity))
        try:
            while True:
                if pump.done():
                    if pump.exception() is not None:
                        return  # the agent's side broke; the finally tells the controller
                    out = await stream.outbox.get()  # the agent said all; wait for the controller's end
                else:
                    get = asyncio.ensure_future(stream.outbox.get())
                    await asyncio.wait({get, pump}, return_when=asyncio.FIRST_COMPLETED)
                    if not get.done():
                        get.cancel()
                        continue
                    out = get.result()
                if not out.closed:
                    await context.write(out.message)
                    continue
                stream.announced = False  # the controller ended it: nothing to tell it back
                if out.status_code != grpc.StatusCode.OK.value[0]:
                    code = _STATUS_BY_CODE.get(out.status_code, grpc.StatusCode.UNKNOWN)
                    await context.abort(code, out.status_detail)
                return
        finally:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
            self._agents.discard(stream)
            self.streams.pop(stream.stream_id, None)
            if stream.announced and stream.generation == self.upstream.generation and self.upstream.ready.is_set():
                self.upstream.send(spb.RelayedAgentMessage(stream=stream.stream_id, closed=True))

    async def _pump(self, stream: _AgentStream, context: grpc.aio.ServicerContext, identity: str) -> None:
        """Agent → controller: every message up as it came; the agent's end goes up as `closed`."""
        peer = context.peer()
        while True:
            await self.upstream.room()
            message = await context.read()
            if stream.generation != self.upstream.generation or not self.upstream.ready.is_set():
                return  # the controller this stream was opened to is gone; _upstream_lost ends it
            if message is grpc.aio.EOF:
                if stream.announced:
                    self.upstream.send(spb.RelayedAgentMessage(stream=stream.stream_id, closed=True))
                    stream.announced = False
                return
            if not stream.stream_id:
                stream.stream_id = next(self._ids)
                self.streams[stream.stream_id] = stream
            item = spb.RelayedAgentMessage(stream=stream.stream_id, message=message)
            if not stream.announced:
                item.peer = peer
                item.identity = identity
                stream.announced = True
            self.upstream.send(item)

    # -- controller side --------------------------------------------------------------------
    def _deliver(self, down: spb.RelayDown) -> None:
        for out in down.messages:
            stream = self.streams.get(out.stream)
            if stream is not None:
                stream.outbox.put_nowait(out)

    def _upstream_lost(self) -> None:
        log.warning("relay_upstream_lost", agent_streams=len(self._agents))
        for stream in list(self._agents):
            stream.announced = False
            stream.outbox.put_nowait(
                spb.RelayedControllerMessage(
                    stream=stream.stream_id,
                    closed=True,
                    status_code=grpc.StatusCode.UNAVAILABLE.value[0],
                    status_detail="the relay lost its controller; reconnect",
                )
            )

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.config
        server = grpc.aio.server(
            options=[
                *GRPC_SERVER_OPTIONS,
                ("grpc.max_receive_message_length", cfg.max_message_bytes),
                ("grpc.keepalive_time_ms", 60_000),
                ("grpc.keepalive_timeout_ms", 20_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 20_000),
                ("grpc.http2.max_ping_strikes", 0),
            ]
        )
        handler = grpc.method_handlers_generic_handler(
            TELEMETRY_SERVICE,
            {CONNECT_METHOD: grpc.stream_stream_rpc_method_handler(self._connect)},  # bytes in, bytes out
        )
        server.add_generic_rpc_handlers((handler,))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        credentials = load_server_credentials(cfg.tls) if cfg.tls is not None else None
        for address in [cfg.listen, *cfg.extra_listen]:
            port = add_grpc_port("relay.listen", server, address, credentials)
            self.port = self.port or port
        await server.start()
        self._server = server
        self._upstream_task = asyncio.create_task(self.upstream.run())
        if cfg.metrics_listen:
            collector = RelayCollector(
                cfg.relay_id, self.upstream, lambda: len(self.agent_streams()), lambda: self.refused
            )
            self._metrics = serve_collector(collector, cfg.metrics_listen, "metrics.listen")
            self.metrics_port = self._metrics.port
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "relay_started",
            relay=cfg.relay_id,
            port=self.port,
            controllers=cfg.controllers,
            linger_ms=round(cfg.linger_s * 1000, 1),
            tls=cfg.tls is not None,
        )
        sdnotify.ready(f"relaying on port {self.port}")

    async def stop(self) -> None:
        self.health.enter_graceful_shutdown()
        await self.upstream.stop()
        if self._upstream_task is not None:
            self._upstream_task.cancel()
            await asyncio.gather(self._upstream_task, return_exceptions=True)
        if self._server is not None:
            await self._server.stop(1.0)
        if self._metrics is not None:
            await asyncio.to_thread(self._metrics.close)
        log.info("relay_stopped", relay=self.config.relay_id)

    async def serve_forever(self, stop: asyncio.Event) -> None:
        await self.start()
        watchdog = sdnotify.Watchdog()  # WATCHDOG=1 while the loop turns and the upstream task lives
        try:
            while not stop.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=1.0)
                if self._upstream_task is not None and not self._upstream_task.done():
                    watchdog.kick()
        finally:
            sdnotify.stopping("ending agents' streams")
            await self.stop()
