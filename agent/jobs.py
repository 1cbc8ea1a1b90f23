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
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

DEFAULT_SOCKET = "/run/starpulse/jobs.sock"
MAX_LINE = 64 * 1024
AVG_WINDOW = 8  # steps in the moving average
_OPS = frozenset({"register", "step", "checkpoint_done", "phase"})
PHASES = frozenset({"starting", "training", "checkpointing", "evaluating"})


def _set_phase(state: RankState, phase: object) -> None:
    """Enter ``phase`` (when it is one we know and differs); its start is the agent's wall clock."""
    if isinstance(phase, str) and phase in PHASES and phase != state.phase:
        state.phase = phase
        state.phase_since_ms = int(time.time() * 1000)


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


class JobGateway:
    """An asyncio unix-socket server for the training processes on this node."""

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        stale_after_s: float = 300.0,
        mode: int = 0o660,
        alive: Callable[[int], bool] = pid_alive,
    ) -> None:
        self.socket_path = socket_path
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
        self._writers[writer] = set()
        try:
            while True:
                try:
                    line = await reader.readline()
                except (ValueError, asyncio.LimitOverrunError):
                    log.warning("job_gateway_line_too_long", peer_pid=peer_pid)
                    break
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
        """Apply one message from a rank; returns its (job, rank) key, None when invalid."""
        op = msg.get("op")
        job = msg.get("job")
        try:
            rank = int(msg.get("rank", 0))
        except (TypeError, ValueError):
            return None
        if not isinstance(job, str) or not job or rank < 0 or op not in _OPS:
            log.warning("job_gateway_bad_message", op=op, job=job)
            return None
        key = (job, rank)
        try:
            with self._lock:
                state = self._ranks.get(key)
                if state is None:
                    state = self._ranks[key] = RankState(job=job, rank=rank)
                    if op != "register":
                        log.info("job_rank_seen", job=job, rank=rank)
                state.last_seen = time.monotonic()
                if peer_pid:
                    state.pid = peer_pid
                if op == "register":
                    if not peer_pid:
                        state.pid = int(msg.get("pid") or 0)
                    state.world_size = int(msg.get("world_size") or 0)
                    sig = msg.get("signal")
                    state.signal_name = sig if isinstance(sig, str) and sig in signal.Signals.__members__ else None
                    state.checkpoint_dir = str(msg.get("checkpoint_dir") or "")
                    if msg.get("resumed_from_step") is not None:
                        state.resumed_from_step = int(msg["resumed_from_step"])
                    if msg.get("step") is not None:  # an agent that restarted: where the rank is
                        state.step = max(state.step, int(msg["step"]))
                    _set_phase(state, msg.get("phase") or "starting")
                    if msg.get("last_checkpoint_step") is not None:
                        state.last_checkpoint_step = int(msg["last_checkpoint_step"])
                        state.checkpoint_path = str(msg.get("checkpoint_path") or "")
                        state.last_checkpoint_ms = int(msg.get("last_checkpoint_ms") or 0)
                    log.info(
                        "job_rank_registered",
                        job=job,
                        rank=rank,
                        pid=state.pid,
                        world_size=state.world_size,
                        last_checkpoint_step=state.last_checkpoint_step,
                    )
                elif op == "step":
                    state.step = int(msg.get("step", 0))
                    state.step_time_s = float(msg.get("step_time_s", 0.0))
                    state.recent.append(state.step_time_s)
                    if state.phase in ("", "starting"):
                        _set_phase(state, "training")  # a step means training
                elif op == "phase":
                    _set_phase(state, msg.get("phase"))
                else:
                    state.last_checkpoint_step = int(msg.get("step", 0))
                    state.checkpoint_path = str(msg.get("path") or "")
                    state.last_checkpoint_ms = int(msg.get("time_ms") or time.time() * 1000)
                    log.info(
                        "job_checkpoint_done",
                        job=job,
                        rank=rank,
                        step=state.last_checkpoint_step,
                        path=state.checkpoint_path,
                    )
        except (TypeError, ValueError):
            log.warning("job_gateway_bad_message", op=op, job=job, rank=rank)
            return None
        return key

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
