"""The relay's one stream to the controller: batches up, answers down, reconnect, follow the leader.

Messages from all agents wait in one list; the writer sends what has gathered as one
``RelayedAgentBatch``, after lingering ``linger_s`` so a batch carries more than one
report (the point of a relay: the controller pays gRPC's per-message cost per batch).
Nothing here is durable: when the stream ends, every agent stream that went through it is
ended too, and the agents replay whatever the controller had not acked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import grpc
import structlog

from starpulse.core.clock import SYSTEM_CLOCK
from starpulse.core.grpc_client import CLIENT_CHANNEL_OPTIONS, Backoff, NotAccepted, Reconnector, read, send
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc

log = structlog.get_logger(__name__)

DownHandler = Callable[[spb.RelayDown], None]


class Upstream:
    """Keeps the relay's stream to the (leading) controller and carries batches over it."""

    def __init__(
        self,
        targets: Sequence[str],
        relay_id: str,
        on_down: DownHandler,
        on_lost: Callable[[], None],
        credentials: grpc.ChannelCredentials | None = None,
        linger_s: float = 0.02,
        max_batch_bytes: int = 2 * 1024 * 1024,
        max_pending_bytes: int = 64 * 1024 * 1024,
        version: str = "",
        backoff: Backoff | None = None,
        seed: int | None = None,
    ) -> None:
        # Which controller next and how long to wait: the rule every starpulse client shares.
        self.reconnect = Reconnector(targets, backoff, seed, name="relay", clock=SYSTEM_CLOCK)
        self.targets = self.reconnect.targets  # the same list: a leader a standby names is added to it
        self.backoff = self.reconnect.backoff
        self.relay_id = relay_id
        self._on_down = on_down
        self._on_lost = on_lost
        self._credentials = credentials
        self.linger_s = linger_s
        self.max_batch_bytes = max_batch_bytes
        self.max_pending_bytes = max_pending_bytes
        self.version = version
        self._pending: list[spb.RelayedAgentMessage] = []
        self._pending_bytes = 0
        self._has_pending = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._call: grpc.aio.StreamStreamCall | None = None
        self._stopping = False
        self.ready = asyncio.Event()  # the controller accepted us: agent streams may open
        self.generation = 0  # bumps on every accepted connection
        self.batches_sent = 0
        self.messages_sent = 0

    # -- producer side --------------------------------------------------------------------
    def send(self, item: spb.RelayedAgentMessage) -> None:
        self._pending.append(item)
        self._pending_bytes += len(item.message) + 16
        if self._pending_bytes >= self.max_pending_bytes:
            self._room.clear()  # agents' readers wait: gRPC flow control pushes back on them
        self._has_pending.set()

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    async def room(self) -> None:
        """Wait while too much is waiting to go up (the controller is slow or away)."""
        if not self._room.is_set():
            await self._room.wait()

    # -- lifecycle --------------------------------------------------------------------------
    async def run(self) -> None:
        """Connect and carry batches until stop(); reconnect by the shared rule (``after_failure``)."""
        await self.reconnect.run(self._session, stopping=lambda: self._stopping, ended=self._lost)

    async def stop(self) -> None:
        self._stopping = True
        if self._call is not None:
            self._call.cancel()

    def _lost(self) -> None:
        was_ready = self.ready.is_set()
        self.ready.clear()
        self._call = None
        # What had not gone up is dropped with the agents' streams: they replay it.
        self._pending = []
        self._pending_bytes = 0
        self._room.set()
        if was_ready:
            self._on_lost()

    async def _session(self, target: str) -> None:
        # The agent's channel settings, with room for whole batches.
        options = [o for o in CLIENT_CHANNEL_OPTIONS if not o[0].startswith("grpc.max_")] + [
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
        ]
        channel = (
            grpc.aio.secure_channel(target, self._credentials, options=options)
            if self._credentials is not None
            else grpc.aio.insecure_channel(target, options=options)
        )
        try:
            call = sgrpc.RelayStub(channel).Connect()
            self._call = call
            await send(call, spb.RelayUp(hello=spb.RelayHello(relay_id=self.relay_id, version=self.version)))
            first = await asyncio.wait_for(read(call), timeout=30)
            if first is grpc.aio.EOF:
                raise NotAccepted("controller closed the relay stream without accepting it")
            self.generation += 1
            self.reconnect.accepted()
            self.ready.set()
            log.info("relay_upstream_connected", target=target, generation=self.generation)
            reader = asyncio.create_task(self._read_loop(call))
            try:
                await self._write_loop(call, reader)
            finally:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
                call.cancel()
        finally:
            await channel.close(grace=None)

    async def _read_loop(self, call: grpc.aio.StreamStreamCall) -> None:
        while True:
            down = await read(call)
            if down is grpc.aio.EOF:
                return
            self._on_down(down)

    async def _write_loop(self, call: grpc.aio.StreamStreamCall, reader: asyncio.Task[None]) -> None:
        while True:
            pending = asyncio.ensure_future(self._has_pending.wait())
            await asyncio.wait({pending, reader}, return_when=asyncio.FIRST_COMPLETED)
            if reader.done():
                pending.cancel()
                reader.result()  # the controller's status, if it ended the stream
                return
            if self.linger_s > 0:
                await asyncio.sleep(self.linger_s)
            while self._pending:
                batch = self._take_batch()
                await send(call, spb.RelayUp(batch=spb.RelayedAgentBatch(messages=batch)))
                self.batches_sent += 1
                self.messages_sent += len(batch)
            self._has_pending.clear()

    def _take_batch(self) -> list[spb.RelayedAgentMessage]:
        """Up to max_batch_bytes from the front (at least one message, however big)."""
        size = 0
        n = 0
        for item in self._pending:
            size += len(item.message) + 16
            if n and size > self.max_batch_bytes:
                break
            n += 1
        batch, self._pending = self._pending[:n], self._pending[n:]
        self._pending_bytes -= sum(len(i.message) + 16 for i in batch)
        if self._pending_bytes < self.max_pending_bytes // 2:
            self._room.set()
        return batch
