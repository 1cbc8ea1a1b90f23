"""Load through relays: each load process plays a few relays, each carrying many nodes' streams.

What the controller receives is exactly what a real relay (`relay/`) sends it:
one ``Relay.Connect`` stream per relay, ``RelayHello`` first, then ``RelayedAgentBatch``es
of the nodes' pre-encoded AgentMessages (the same bytes ``bench.loadgen`` sends direct,
Hello first on every stream), gathered for ``linger_s`` as the real relay's upstream
does. A report is stamped at its due time, so the linger a report waits in the relay is
part of the report→decision latency the controller measures.

This measures the controller. What the relays themselves cost runs on their own machines
in a deployment; ``bench.scale --real-relays`` measures that with real relay processes.
"""

from __future__ import annotations

import asyncio
import heapq
import random
import time
from typing import Any

from bench.loadgen import EVENT_TAG, REPORT_TAG, NodeStats, Profile, Templates, carries, encode

MAX_BATCH_BYTES = 2 * 1024 * 1024  # the real relay's default (relay.upstream.Upstream)


class SimRelay:
    """One relay's stream to the controller, and the nodes behind it."""

    def __init__(
        self,
        port: int,
        relay_id: str,
        nodes: list[tuple[int, str, Profile]],
        linger_s: float,
        probes: dict[str, list[bytes]] | None = None,
        probe_window_s: int = 10,
    ) -> None:
        """``probes``: each node's probe-result windows (bench.probeload), appended to its reports."""
        self.port = port
        self.probes = probes or {}
        self.probe_window_s = probe_window_s
        self.relay_id = relay_id
        self.nodes = nodes  # (stream id, node id, profile)
        self.linger_s = linger_s
        self.welcomed: set[int] = set()
        self.delta: dict[int, bool] = {}
        self.closed: dict[str, int] = {}
        self.acked_reports: dict[int, int] = {}
        self._all_welcomed = asyncio.Event()
        self.channel: Any = None
        self.call: Any = None
        self.reader: asyncio.Task[None] | None = None

    async def connect(self, inventory: bytes) -> float:
        import grpc

        from starpulse.v1 import inventory_pb2 as ipb
        from starpulse.v1 import service_pb2 as spb
        from starpulse.v1 import service_pb2_grpc as sgrpc

        self.channel = grpc.aio.insecure_channel(
            f"127.0.0.1:{self.port}",
            options=[("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)],
        )
        self.call = sgrpc.RelayStub(self.channel).Connect()
        await self.call.write(spb.RelayUp(hello=spb.RelayHello(relay_id=self.relay_id, version="loadgen")))
        accepted = await self.call.read()
        if accepted is grpc.aio.EOF:
            raise ConnectionError(f"{self.relay_id}: not accepted")
        self.reader = asyncio.create_task(self._read())
        inv = ipb.Inventory.FromString(inventory)
        t0 = time.perf_counter()
        batch, size = spb.RelayedAgentBatch(), 0
        for stream, node_id, _ in self.nodes:
            hello = spb.Hello(
                node_id=node_id,
                role=ipb.NODE_ROLE_COMPUTE,
                inventory=inv,
                agent_version="loadgen",
                buffer_epoch=f"loadgen-{node_id}",
                next_event_seq=1,
            )
            message = spb.AgentMessage(hello=hello).SerializeToString()
            if size + len(message) > MAX_BATCH_BYTES:  # as the real relay: batches stay under the controller's limit
                await self.call.write(spb.RelayUp(batch=batch))
                batch, size = spb.RelayedAgentBatch(), 0
            batch.messages.add(stream=stream, message=message, peer=f"ipv4:10.0.0.1:{stream}")
            size += len(message)
        await self.call.write(spb.RelayUp(batch=batch))
        await asyncio.wait_for(self._all_welcomed.wait(), timeout=600)
        return time.perf_counter() - t0

    async def _read(self) -> None:
        import grpc

        from starpulse.v1 import service_pb2 as spb

        while True:
            down = await self.call.read()
            if down is grpc.aio.EOF:
                return
            for out in down.messages:
                if out.closed:
                    key = f"closed_{out.status_code}"
                    self.closed[key] = self.closed.get(key, 0) + 1
                    self.welcomed.add(out.stream)
                    continue
                msg = spb.ControllerMessage.FromString(out.message)
                if msg.HasField("welcome"):
                    self.welcomed.add(out.stream)
                    self.delta[out.stream] = msg.welcome.accepts_delta_reports
                elif msg.HasField("ack"):
                    self.acked_reports[out.stream] = msg.ack.report_seq
            if len(self.welcomed) >= len(self.nodes):
                self._all_welcomed.set()

    async def drive(
        self,
        interval_s: float,
        jitter: float,
        t_launch: float,
        t_start: float,
        t_end: float,
        rng: random.Random,
        st: NodeStats,
        use_delta: bool,
    ) -> None:
        """Every linger tick: each node that is due sends its next messages; all of them go as one batch."""
        from starpulse.v1 import service_pb2 as spb

        due: list[tuple[float, int]] = [(t_launch + rng.uniform(0, interval_s), i) for i in range(len(self.nodes))]
        heapq.heapify(due)
        seqs = [0] * len(self.nodes)
        event_seqs = [0] * len(self.nodes)
        while True:
            now = time.time()
            if now >= t_end:
                return
            batch, size = spb.RelayedAgentBatch(), 0
            while due and due[0][0] <= now and size < MAX_BATCH_BYTES:
                at, i = heapq.heappop(due)
                stream, node_id, profile = self.nodes[i]
                wire = profile.deltas if use_delta and self.delta.get(stream) else profile.reports
                following = at + interval_s * (1.0 + rng.uniform(-jitter, jitter))
                while following <= now:
                    # Sending was held up (flow control) past the node's next cycle: as an agent
                    # does, the newer report replaces the unsent one (events still all go). Its
                    # delta may refer to a full report that was replaced too; the controller then
                    # reads the absent (unchanged) counters at the older full report's values,
                    # which for counters that only grow is a pause, not a false jump.
                    for ev in profile.events.get(seqs[i] % len(profile.reports), ()):
                        event_seqs[i] += 1
                        st.events_sent += 1
                        batch.messages.add(stream=stream, message=encode(EVENT_TAG, ev, event_seqs[i], int(at * 1000)))
                    seqs[i] += 1
                    st.replaced += 1
                    at, following = following, following + interval_s * (1.0 + rng.uniform(-jitter, jitter))
                step = seqs[i] % len(profile.reports)
                seqs[i] += 1
                ts = int(at * 1000)
                for ev in profile.events.get(step, ()):
                    event_seqs[i] += 1
                    st.events_sent += 1
                    batch.messages.add(stream=stream, message=encode(EVENT_TAG, ev, event_seqs[i], ts))
                body = wire[step]
                windows = self.probes.get(node_id)
                if windows and carries(seqs[i], interval_s, self.probe_window_s):
                    body += windows[seqs[i] % len(windows)]
                    st.probe_windows += 1
                batch.messages.add(stream=stream, message=encode(REPORT_TAG, body, seqs[i], ts))
                size += len(body) + 32
                if at >= t_start:
                    st.sent_in_window += 1
                heapq.heappush(due, (following, i))
            if batch.messages:
                await self.call.write(spb.RelayUp(batch=batch))
            await asyncio.sleep(self.linger_s)

    async def close(self) -> None:
        if self.call is not None:
            self.call.cancel()
        if self.reader is not None:
            self.reader.cancel()
            await asyncio.gather(self.reader, return_exceptions=True)
        if self.channel is not None:
            await self.channel.close(grace=None)


async def relay_worker_main(cfg: dict[str, Any], control: Any, results: Any) -> None:
    """Like bench.loadgen.worker_main, with the worker's nodes split over cfg["relays"] relays."""
    tpl: Templates = cfg["templates"]
    ids: list[str] = cfg["node_ids"]
    faulty: set[str] = set(cfg["faulty"])
    n_relays = max(1, cfg["relays"])
    relays: list[SimRelay] = []
    for n in range(n_relays):
        nodes = []
        for k, node_id in enumerate(ids[n::n_relays]):
            profile = tpl.faulty[k % len(tpl.faulty)] if node_id in faulty else tpl.healthy
            nodes.append((k + 1, node_id, profile))
        probes = {node_id: cfg["probes"][node_id] for _, node_id, _ in nodes if node_id in cfg.get("probes", {})}
        relays.append(
            SimRelay(
                cfg["port"],
                f"loadgen-w{cfg['worker']}-r{n}",
                nodes,
                cfg["linger_s"],
                probes,
                cfg.get("probe_window_s", 10),
            )
        )
    t0 = time.perf_counter()
    await asyncio.gather(*(r.connect(tpl.inventory) for r in relays))
    connect_wall = time.perf_counter() - t0
    streams = sum(len(r.welcomed) for r in relays)
    results.put(("ready", cfg["worker"], {"connect_s": connect_wall, "streams": streams}))
    t_launch, t_start, t_end = await asyncio.to_thread(control.get)
    rng = random.Random(cfg["worker"])
    stats = NodeStats()
    await asyncio.gather(
        *(r.drive(cfg["interval_s"], cfg["jitter"], t_launch, t_start, t_end, rng, stats, cfg["delta"]) for r in relays)
    )
    await asyncio.sleep(1.0)
    errors: dict[str, int] = {}
    for r in relays:
        for reason, count in r.closed.items():
            errors[reason] = errors.get(reason, 0) + count
        await r.close()
    results.put(
        (
            "done",
            cfg["worker"],
            {
                "acked_in_window": 0,
                "latencies": [],
                "hello_rtt": [],  # Hellos go in batches: connect_s (all Welcomes back) is the figure
                "events_sent": stats.events_sent,
                "sent_in_window": stats.sent_in_window,
                "delta_streams": sum(1 for r in relays for v in r.delta.values() if v) if cfg["delta"] else 0,
                "reports_replaced": stats.replaced,
                "probe_windows": stats.probe_windows,
                "errors": errors,
            },
        )
    )


def relay_worker(cfg: dict[str, Any], control: Any, results: Any) -> None:
    from bench.common import quiet_logging

    quiet_logging()
    asyncio.run(relay_worker_main(cfg, control, results))
