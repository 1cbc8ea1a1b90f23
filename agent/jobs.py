"""The agent's local job gateway: training ranks on this node register over a unix socket,
report step times and checkpoints, and receive checkpoint requests.

The wire protocol is documented in ``starpulse.job`` (JSON lines). The gateway keeps,
per (job, rank), the latest step, step time (and a short moving average), pid,
world_size and last checkpoint; ``JobCollector`` copies that into every report as
``JobStepSample`` so the controller sees job progress (fail-slow detection, checkpoint
state for checkpoint-before-evict).

State is read from the collector's worker thread and written on the event loop, so it
sits behind a lock. A rank is forgotten when its process is gone or it has been silent
for ``stale_after_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from starpulse.core.findings import Finding
from starpulse.core.joblimits import (
    MAX_CHECKPOINT_PATH,
    MAX_JOB_NAME,
    MAX_RANKS_PER_NODE,
    int_problem,
    job_name_problem,
    step_time_problem,
    text_problem,
)
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

DEFAULT_SOCKET = "/run/starpulse/jobs.sock"
MAX_LINE = 64 * 1024
# Connections held at once: every rank keeps one, and a local process opening them without end
# would take the agent's file descriptors from its collectors.
MAX_CONNECTIONS = 1024
AVG_WINDOW = 8  # steps in the moving average
_OPS = frozenset({"register", "step", "checkpoint_done", "phase"})
PHASES = frozenset({"starting", "training", "checkpointing", "evaluating"})


@dataclass
class RankState:
    job: str
    rank: int
    pid: int = 0
    world_size: int = 0
    signal_name: str | None = None  # the signal the rank handles as "checkpoint now"
    step: int = 0
    step_time_s: float = 0.0
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=AVG_WINDOW))
    last_checkpoint_step: int = 0
    checkpoint_path: str = ""
    last_checkpoint_ms: int = 0
    resumed_from_step: int = 0  # the checkpoint this run of the rank started from (0: fresh start)
    checkpoint_dir: str = ""
    last_seen: float = 0.0  # monotonic
    phase: str = ""  # starpulse.job phases; "" until the rank says (a library from before phases)
    phase_since_ms: int = 0  # wall clock when it entered the phase

    @property
    def avg_step_time_s(self) -> float:
        return sum(self.recent) / len(self.recent) if self.recent else self.step_time_s


def _set_phase(state: RankState, phase: object) -> None:
    """Enter ``phase`` (when it is one we know and differs); its start is the agent's wall clock."""
    if isinstance(phase, str) and phase in PHASES and phase != state.phase:
        state.phase = phase
        state.phase_since_ms = int(time.time() * 1000)


def pid_alive(pid: int) -> bool:
    """True when a process with this pid exists (EPERM: it exists, just not ours)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _peer_pid(writer: asyncio.StreamWriter) -> int:
    """The connecting process's pid from the kernel (SO_PEERCRED), 0 where unavailable.

    Signals go to this pid, never to one a client merely claims, so a local client cannot
    make the agent signal an arbitrary process.
    """
    sock = writer.get_extra_info("socket")
    peercred = getattr(socket, "SO_PEERCRED", None)
    if sock is None or peercred is None:
        return 0
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, peercred, struct.calcsize("3i"))
        pid, _uid, _gid = struct.unpack("3i", raw)
    except OSError:
        return 0
    return int(pid)


def _prepare_socket_path(path: str) -> None:
    """Create the socket's folder; remove a socket file a previous agent left (bind would fail)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.is_socket():
        p.unlink()


class _Fields:
    """One message's optional fields, each checked against the shared limits; a bad one is
    dropped (the caller's fallback kept) with a log line naming the job, rank and field."""

    def __init__(self, msg: dict[str, Any], job: str, rank: int) -> None:
        self.msg = msg
        self.job = job
        self.rank = rank

    def _dropped(self, key: str, problem: str) -> None:
        log.warning("job_field_dropped", job=self.job, rank=self.rank, field=key, problem=problem[:200])

    def integer(self, key: str, wire_field: str, fallback: int, missing: int | None = None) -> int:
        """``msg[key]`` as the integer field ``wire_field``; ``missing`` (else 0) when absent or null."""
        value = self.msg.get(key)
        if value is None:
            return missing if missing is not None else 0
        problem = int_problem(wire_field, value)
        if problem is not None:
            self._dropped(key, problem)
            return fallback
        return int(value)

    def step_time(self, key: str) -> float | None:
        value = self.msg.get(key)
        if value is None:
            return None
        problem = step_time_problem(value)
        if problem is not None:
            self._dropped(key, problem)
            return None
        return float(value)

    def text(self, key: str, limit: int, fallback: str) -> str:
        value = self.msg.get(key)
        if value is None:
            return fallback
        problem = text_problem(value, limit)
        if problem is not None:
            self._dropped(key, problem)
            return fallback
        return str(value)


class JobGateway:
    """An asyncio unix-socket server for the training processes on this node."""

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        stale_after_s: float = 300.0,
        mode: int = 0o660,
        alive: Callable[[int], bool] = pid_alive,
        max_ranks: int = MAX_RANKS_PER_NODE,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.socket_path = socket_path
        self.max_ranks = max_ranks  # registrations kept: a local process cannot grow the agent without end
        self.max_connections = max_connections
        self.stale_after_s = stale_after_s
        self.mode = mode
        self._alive = alive
        self._lock = threading.Lock()
        self._ranks: dict[tuple[str, int], RankState] = {}
        self._writers: dict[asyncio.StreamWriter, set[tuple[str, int]]] = {}
        self._server: asyncio.base_events.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- server --------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the socket (its folder created, a stale socket file replaced, mode 0660)."""
        _prepare_socket_path(self.socket_path)
        self._loop = asyncio.get_running_loop()
        self._server = await asyncio.start_unix_server(self._serve, path=self.socket_path, limit=MAX_LINE)
        os.chmod(self.socket_path, self.mode)
        log.info("job_gateway_started", socket=self.socket_path)

    async def close(self) -> None:
        """Stop serving and drop connections. Idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for writer in list(self._writers):
            writer.close()
        with contextlib.suppress(Exception):
            await server.wait_closed()
        with contextlib.suppress(OSError):
            os.unlink(self.socket_path)
        log.info("job_gateway_stopped", socket=self.socket_path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer_pid = _peer_pid(writer)
        if len(self._writers) >= self.max_connections:
            log.warning("job_gateway_connections_full", peer_pid=peer_pid, max_connections=self.max_connections)
            writer.close()
            return
        self._writers[writer] = set()
        try:
            while True:
                try:
                    line = await reader.readline()
                except (ValueError, asyncio.LimitOverrunError):
                    # The over-long line is discarded (the reader drops what it buffered) and the
                    # connection's next lines still count: one bad line never costs a rank the rest.
                    log.warning("job_gateway_line_too_long", peer_pid=peer_pid, limit=MAX_LINE)
                    continue
                except ConnectionError:
                    break
                if not line:
                    break
                try:
                    msg = json.loads(line)
                except ValueError:
                    log.warning("job_gateway_bad_message", peer_pid=peer_pid)
                    continue
                if isinstance(msg, dict):
                    key = self.handle(msg, peer_pid)
                    if key is not None:
                        self._writers[writer].add(key)
        finally:
            self._writers.pop(writer, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def handle(self, msg: dict[str, Any], peer_pid: int = 0) -> tuple[str, int] | None:
        """Apply one message from a rank; returns its (job, rank) key, None when refused.

        The limits are the controller's own (``starpulse.core.joblimits``): a message whose
        job or rank breaks them is refused whole, a field that breaks them is dropped, each
        with a log line naming the job and the field, and the rest is applied. So one rank's
        NaN, its 300-character job name or a rank past the wire's uint32 never reaches a
        report, where it would make the controller refuse the node's every report.
        """
        op = msg.get("op")
        job = msg.get("job")
        rank = msg.get("rank", 0)
        if op not in _OPS:
            log.warning("job_gateway_bad_message", op=str(op)[:64], job=str(job)[:MAX_JOB_NAME], field="op")
            return None
        problem = job_name_problem(job)
        field_name = "job"
        if problem is None:
            problem, field_name = int_problem("rank", rank), "rank"
        if problem is not None:
            log.warning(
                "job_message_refused", op=op, job=str(job)[:MAX_JOB_NAME], field=field_name, problem=problem[:200]
            )
            return None
        assert isinstance(job, str) and isinstance(rank, int)
        key = (job, rank)
        with self._lock:
            state = self._ranks.get(key)
            if state is None:
                if len(self._ranks) >= self.max_ranks:
                    log.warning("job_registrations_full", job=job, rank=rank, max_ranks=self.max_ranks)
                    return None
                state = self._ranks[key] = RankState(job=job, rank=rank)
                if op != "register":
                    log.info("job_rank_seen", job=job, rank=rank)
            state.last_seen = time.monotonic()
            if peer_pid:
                state.pid = peer_pid
            fields = _Fields(msg, job, rank)
            if op == "register":
                self._register(state, fields, peer_pid)
            elif op == "step":
                state.step = fields.integer("step", "step", state.step)
                step_time = fields.step_time("step_time_s")
                if step_time is not None:
                    state.step_time_s = step_time
                    state.recent.append(step_time)
                if state.phase in ("", "starting"):
                    _set_phase(state, "training")  # a step means training
            elif op == "phase":
                _set_phase(state, msg.get("phase"))
            else:
                state.last_checkpoint_step = fields.integer("step", "last_checkpoint_step", state.last_checkpoint_step)
                state.checkpoint_path = fields.text("path", MAX_CHECKPOINT_PATH, "")
                state.last_checkpoint_ms = fields.integer(
                    "time_ms", "last_checkpoint_ms", int(time.time() * 1000), missing=int(time.time() * 1000)
                )
                log.info(
                    "job_checkpoint_done",
                    job=job,
                    rank=rank,
                    step=state.last_checkpoint_step,
                    path=state.checkpoint_path,
                )
        return key

    @staticmethod
    def _register(state: RankState, fields: _Fields, peer_pid: int) -> None:
        if not peer_pid:
            state.pid = fields.integer("pid", "pid", 0)
        state.world_size = fields.integer("world_size", "world_size", 0)
        sig = fields.msg.get("signal")
        state.signal_name = sig if isinstance(sig, str) and sig in signal.Signals.__members__ else None
        state.checkpoint_dir = fields.text("checkpoint_dir", MAX_CHECKPOINT_PATH, "")
        if fields.msg.get("resumed_from_step") is not None:
            state.resumed_from_step = fields.integer("resumed_from_step", "resumed_from_step", 0)
        if fields.msg.get("last_checkpoint_step") is not None:
            state.last_checkpoint_step = fields.integer("last_checkpoint_step", "last_checkpoint_step", 0)
            state.checkpoint_path = fields.text("checkpoint_path", MAX_CHECKPOINT_PATH, "")
            state.last_checkpoint_ms = fields.integer("last_checkpoint_ms", "last_checkpoint_ms", 0)
        if fields.msg.get("step") is not None:  # an agent that restarted: where the rank is
            state.step = max(state.step, fields.integer("step", "step", 0))
        _set_phase(state, fields.msg.get("phase") or "starting")
        log.info(
            "job_rank_registered",
            job=state.job,
            rank=state.rank,
            pid=state.pid,
            world_size=state.world_size,
            last_checkpoint_step=state.last_checkpoint_step,
        )

    # -- queries and requests ------------------------------------------------------------

    def ranks(self) -> list[RankState]:
        """Live ranks (forgetting the dead and the long-silent first), sorted by job and rank."""
        self.prune()
        with self._lock:
            return sorted(self._ranks.values(), key=lambda s: (s.job, s.rank))

    def prune(self) -> list[tuple[str, int]]:
        """Forget ranks whose process is gone or that have been silent for stale_after_s."""
        now = time.monotonic()
        gone: list[tuple[str, int]] = []
        with self._lock:
            for key, state in list(self._ranks.items()):
                dead = state.pid > 0 and not self._alive(state.pid)
                if dead or now - state.last_seen > self.stale_after_s:
                    del self._ranks[key]
                    gone.append(key)
                    log.info(
                        "job_rank_forgotten",
                        job=key[0],
                        rank=key[1],
                        pid=state.pid,
                        reason="process gone" if dead else "silent",
                    )
        return gone

    def request_checkpoint(self, job: str | None = None) -> int:
        """Ask every rank of `job` (None: of every job) to checkpoint; returns how many were asked.

        A rank that declared a signal gets it (SIGUSR1 by default); every connected rank
        also gets {"op": "checkpoint"} on its socket. Either sets its flag; both is harmless.
        """
        asked: set[tuple[str, int]] = set()
        for state in self.ranks():
            if job is not None and state.job != job:
                continue
            if state.signal_name and state.pid > 0:
                try:
                    os.kill(state.pid, signal.Signals[state.signal_name])
                    asked.add((state.job, state.rank))
                except OSError as exc:
                    log.warning(
                        "job_checkpoint_signal_failed", job=state.job, rank=state.rank, pid=state.pid, error=str(exc)
                    )
        line = json.dumps({"op": "checkpoint"}).encode() + b"\n"
        for writer, keys in list(self._writers.items()):
            mine = {k for k in keys if job is None or k[0] == job}
            if not mine or writer.is_closing():
                continue
            self._write(writer, line)
            asked |= mine
        log.info("job_checkpoint_requested", job=job or "*", ranks=len(asked))
        return len(asked)

    def _write(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is not None and running is not loop:
            loop.call_soon_threadsafe(writer.write, data)
        else:
            writer.write(data)


class JobCollector:
    """Puts the gateway's per-rank progress into each report (one JobStepSample per rank).

    ``step_time_s`` is the short moving average (last few steps): a single slow step is
    noise, a rank that stays slow is what fail-slow detection looks for.
    """

    name = "jobs"

    def __init__(self, gateway: JobGateway) -> None:
        self.gateway = gateway

    def supported(self) -> bool:
        return True

    def describe(self, inventory: ipb.Inventory) -> None:
        return None

    def collect(self, report: tpb.Report) -> list[Finding]:
        for state in self.gateway.ranks():
            report.job_steps.add(
                job=state.job,
                rank=state.rank,
                step=max(state.step, 0),
                step_time_s=state.avg_step_time_s,
                last_checkpoint_step=max(state.last_checkpoint_step, 0),
                checkpoint_path=state.checkpoint_path,
                last_checkpoint_ms=state.last_checkpoint_ms,
                pid=max(state.pid, 0),
                world_size=max(state.world_size, 0),
                resumed_from_step=max(state.resumed_from_step, 0),
                phase=state.phase,
                phase_since_ms=state.phase_since_ms,
            )
        return []

    def close(self) -> None:
        return None
