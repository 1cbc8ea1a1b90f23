"""The controller's detection shards: per-node detection spread over worker processes.

Each compute node belongs to one shard (crc32 of its id), so its reports and events are
handled in arrival order by one ``ConditionEngine`` (controller.detect.shard_worker). The
controller hands over the bytes that arrived, batched: everything submitted during one
turn of the event loop goes out as one frame per shard. Answers come back on the shards'
stdout and are applied on the event loop: each report's verdict to the sink ``bind`` names
(Detection's, which completes it and hands it to ingest), the condition changes to
``on_changes`` together with what each batch of events opened and when (``EventsOpened``:
the stage trace's ``condition`` mark and the event grouping window). Detection hands over
only compute nodes: switches' reports and presence stay with its own engine.

Flow control: at most ``max_in_flight`` reports may be with the shards; past that, the
streams feeding them wait in ``room()`` (and gRPC's flow control holds the rest at the
agents and relays). A shard that dies is fatal (``on_lost``): its nodes' condition state
is gone, and the controller must be restarted (systemd, or the HA standby takes over).
"""

from __future__ import annotations

import asyncio
import sys
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from controller.detect.model import ConditionChange
from controller.detect.shard_worker import (
    OP_EVENTS,
    OP_FORGET,
    OP_NODE,
    OP_REPORT,
    EventsOpened,
    ProbeAnswer,
    ShardSettings,
)
from controller.detect.shardwire import encode_frame, frame_parts, read_frame
from controller.ingest.registry import NodeRecord
from controller.ingest.verdict import ReportResult
from controller.metrics import StageCpu
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

READY_TIMEOUT_S = 60.0
# Reports submitted within this long go to a shard as one frame: fewer, larger frames cost
# both ends less per report (bench.scale), and 2 ms is nothing next to a 5 s report interval.
# 10 ms was tried (issue 31): 5 % less CPU per report at 4,000 nodes, but every report waits
# longer (processing p50 4 -> 15 ms on a loaded machine), so it stays 2 ms. Events (and
# forgets) go at once: a fault's first word waits for no linger.
FLUSH_LINGER_S = 0.002


class ShardLost(Exception):
    """A shard process ended while the controller still needed it."""


@dataclass
class _Shard:
    index: int
    proc: asyncio.subprocess.Process
    ops: list[tuple[Any, ...]] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=dict)  # node -> stream token the shard knows
    reader: asyncio.Task[None] | None = None
    in_flight: int = 0
    asked: deque[asyncio.Future[Any]] = field(default_factory=deque)  # probe questions, in order


def _unbound(verdict: ReportResult) -> None:
    raise RuntimeError("a shard's verdict before bind(): the TelemetryServicer binds its verdict sink")


class DetectShards:
    """The sharded report decider: compute nodes' reports decided in worker processes."""

    def __init__(
        self,
        workers: int,
        settings: ShardSettings,
        on_changes: Callable[[list[ConditionChange], list[EventsOpened]], None],
        on_lost: Callable[[int], None],
        max_in_flight: int = 4096,
        cpu: StageCpu | None = None,
        shard_cpu: dict[int, dict[str, float]] | None = None,
        now_ms: Callable[[], int] = lambda: 0,
    ) -> None:
        """``cpu``: where the event loop's share of the hand-over is charged (ControllerMetrics.stage_cpu);
        ``shard_cpu``: each shard's CPU by stage, as it last said (ControllerMetrics.shard_stage_cpu);
        ``now_ms``: the controller's clock, handed over with each report (its probe results' arrival)."""
        if workers < 1:
            raise ValueError("detection shards need at least one worker")
        self.workers = workers
        self.settings = settings
        self._on_verdict: Callable[[ReportResult], None] = _unbound
        self._on_changes = on_changes
        self._on_lost = on_lost
        self.max_in_flight = max_in_flight
        self._shards: list[_Shard] = []
        self._flush_at: asyncio.TimerHandle | None = None
        self._in_flight = 0
        self._room = asyncio.Event()
        self._room.set()
        self._stopping = False
        self._cpu = cpu if cpu is not None else StageCpu()
        self._shard_cpu = shard_cpu if shard_cpu is not None else {}
        self._now_ms = now_ms

    # -- life ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Start every shard and wait until each has loaded its rules."""
        for index in range(self.workers):
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "controller.detect.shard_main",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                limit=1 << 24,
            )
            shard = _Shard(index, proc)
            self._shards.append(shard)
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(encode_frame(self.settings))
            ready = await asyncio.wait_for(read_frame(proc.stdout), READY_TIMEOUT_S)
            if not (isinstance(ready, tuple) and ready[:1] == ("ready",)):
                await self.stop()
                raise ShardLost(f"detection shard {index} did not start (said {ready!r})")
            shard.reader = asyncio.create_task(self._read(shard))
            log.info("detect_shard_started", shard=index, pid=proc.pid)

    async def stop(self) -> None:
        self._stopping = True
        self.flush()
        for shard in self._shards:
            if shard.proc.stdin is not None and not shard.proc.stdin.is_closing():
                shard.proc.stdin.close()
        for shard in self._shards:
            try:
                await asyncio.wait_for(shard.proc.wait(), 10)
            except TimeoutError:
                shard.proc.kill()
                await shard.proc.wait()
            if shard.reader is not None:  # the shard's last answers are applied before it is gone
                try:
                    await asyncio.wait_for(shard.reader, 10)
                except (TimeoutError, asyncio.CancelledError):
                    log.warning("detect_shard_answers_dropped", shard=shard.index)
        self._shards.clear()

    @property
    def pids(self) -> list[int]:
        return [s.proc.pid for s in self._shards]

    def running(self) -> list[int]:
        """The shards whose process is still alive."""
        return [s.index for s in self._shards if s.proc.returncode is None]

    @property
    def in_flight(self) -> int:
        return self._in_flight

    # -- input --------------------------------------------------------------------------
    def shard_of(self, node_id: str) -> int:
        return zlib.crc32(node_id.encode()) % self.workers

    # -- reports (from Detection.decide: compute nodes only) --------------------------------
    def bind(self, on_verdict: Callable[[ReportResult], None]) -> None:
        self._on_verdict = on_verdict

    def decide(self, node: NodeRecord, message: spb.AgentMessage, started: float) -> None:
        """A compute node's valid report from a direct stream: re-serialised for its shard (not checked again)."""
        self._submit(node, message.SerializeToString(), True, started)

    def decide_raw(self, node: NodeRecord, agent_message: bytes, started: float) -> bool:
        """A compute node's relayed report as the bytes that arrived: its shard decodes and validates it."""
        self._submit(node, agent_message, False, started)
        return True

    @property
    def full(self) -> bool:
        return not self._room.is_set()

    async def room(self) -> None:
        """Wait while too many reports are with the shards."""
        if not self._room.is_set():
            await self._room.wait()

    def _submit(self, node: NodeRecord, agent_message: bytes, validated: bool, started: float) -> None:
        """One AgentMessage (a report) to its shard; its ``ReportResult`` comes back to the verdict sink."""
        shard = self._for(node)
        shard.ops.append(
            (OP_REPORT, node.node_id, node.stream_token, agent_message, validated, started, self._now_ms())
        )
        shard.in_flight += 1
        self._in_flight += 1
        if self._in_flight >= self.max_in_flight:
            self._room.clear()
        self._schedule_flush()

    def submit_events(self, node: NodeRecord, events: list[tpb.Event]) -> None:
        shard = self._for(node)
        shard.ops.append((OP_EVENTS, node.node_id, [ev.SerializeToString() for ev in events]))
        self._schedule_flush(0.0)  # a fault's first word: no linger (the reports before it go too, in order)

    def forget(self, node_id: str) -> None:
        shard = self._shards[self.shard_of(node_id)]
        shard.tokens.pop(node_id, None)
        shard.ops.append((OP_FORGET, node_id))
        self._schedule_flush(0.0)

    # -- the probe window (controller.detect.probe_sums), held in the shards ----------------
    def ask(self, op: tuple[Any, ...]) -> asyncio.Future[list[Any]]:
        """One probe question to every shard, after what was submitted before it: their answers, in shard order."""
        loop = asyncio.get_running_loop()
        waits: list[asyncio.Future[Any]] = []
        for shard in self._shards:
            fut: asyncio.Future[Any] = loop.create_future()
            shard.asked.append(fut)
            shard.ops.append(op)
            waits.append(fut)
        self._schedule_flush(0.0)
        return asyncio.gather(*waits)

    def tell(self, op: tuple[Any, ...]) -> None:
        """A probe operation that has no answer (release the window, a new fabric) to every shard."""
        for shard in self._shards:
            shard.ops.append(op)
        self._schedule_flush(0.0)

    def _for(self, node: NodeRecord) -> _Shard:
        shard = self._shards[self.shard_of(node.node_id)]
        if shard.tokens.get(node.node_id) != node.stream_token:
            # A new stream (or the first): the shard learns the node's inventory and naming.
            shard.tokens[node.node_id] = node.stream_token
            shard.ops.append((OP_NODE, node.node_id, node.role, node.stream_token, node.inventory.SerializeToString()))
        return shard

    def _schedule_flush(self, linger_s: float = FLUSH_LINGER_S) -> None:
        """Flush within ``linger_s``: a flush already due sooner stands, a later one is brought forward."""
        pending = self._flush_at
        if pending is not None and pending.when() <= asyncio.get_running_loop().time() + linger_s:
            return
        if pending is not None:
            pending.cancel()
        self._flush_at = asyncio.get_running_loop().call_later(linger_s, self.flush)

    def flush(self) -> None:
        """Everything submitted since the last flush, one frame per shard."""
        if self._flush_at is not None:
            self._flush_at.cancel()  # called directly (stop): the scheduled one has nothing left
            self._flush_at = None
        at = time.thread_time()
        for shard in self._shards:
            if shard.ops and shard.proc.stdin is not None and not shard.proc.stdin.is_closing():
                ops, shard.ops = shard.ops, []
                header, body = frame_parts(ops)
                shard.proc.stdin.write(header)  # two writes: writelines() would join them (a copy)
                shard.proc.stdin.write(body)
        self._cpu.since("shard_handover", at)

    # -- output -------------------------------------------------------------------------
    async def _read(self, shard: _Shard) -> None:
        assert shard.proc.stdout is not None
        reason = "exited"
        try:
            while True:
                frame = await read_frame(shard.proc.stdout)
                if frame is None:
                    break
                if isinstance(frame, ProbeAnswer):
                    self._answered(shard, frame)
                    continue
                at = time.thread_time()
                wire, changes, opened, totals = frame
                shard.in_flight -= len(wire)
                self._in_flight -= len(wire)
                if not self._room.is_set() and self._in_flight < self.max_in_flight // 2:
                    self._room.set()
                for values in wire:
                    result = ReportResult.from_wire(values)
                    try:
                        self._on_verdict(result)
                    except Exception:
                        log.exception("shard_result_failed", node=result.node_id)
                at = self._cpu.since("verdicts", at)
                if changes or opened:
                    try:
                        self._on_changes(changes, opened)
                    except Exception:  # a bug downstream must not read as a lost shard
                        log.exception("shard_changes_failed", shard=shard.index, changes=len(changes))
                    self._cpu.since("conditions", at)
                if totals:
                    self._shard_cpu[shard.index] = totals
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            reason = repr(exc)
        self._unanswered(shard, reason)
        if not self._stopping:
            log.critical("detect_shard_lost", shard=shard.index, pid=shard.proc.pid, reason=reason)
            self._on_lost(shard.index)

    @staticmethod
    def _answered(shard: _Shard, answer: ProbeAnswer) -> None:
        """A probe answer to the oldest question the shard has not answered yet (they answer in order)."""
        if shard.asked:
            asked = shard.asked.popleft()
            if not asked.done():
                asked.set_result(answer.payload)

    @staticmethod
    def _unanswered(shard: _Shard, reason: str) -> None:
        """The shard ended: the questions it will never answer fail (the localisation gives up)."""
        while shard.asked:
            asked = shard.asked.popleft()
            if not asked.done():
                asked.set_exception(ShardLost(f"detection shard {shard.index} ended ({reason})"))
