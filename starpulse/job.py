"""The job-side library: a training script registers with its node's agent, reports step
times, checkpoints when asked and resumes from the latest *complete* checkpoint.

Pure stdlib, and best effort towards the agent: a training job must never die or stall
because the agent is away. Every send is non-blocking and dropped when the socket is
gone; the connection is retried now and then from ``step()``.

Socket protocol (unix SOCK_STREAM, default ``/run/starpulse/jobs.sock`` or
``$STARPULSE_JOB_SOCKET``): UTF-8 JSON objects, one per line (``\\n``-terminated).

Job -> agent::

    {"op": "register", "job": "llm", "rank": 0, "world_size": 8, "pid": 1234,
     "signal": "SIGUSR1", "checkpoint_dir": "/ckpt/llm",
     "last_checkpoint_step": 100, "checkpoint_path": "/ckpt/llm/step-0000000100",
     "last_checkpoint_ms": 1700000000000}
    {"op": "step", "job": "llm", "rank": 0, "step": 101, "step_time_s": 0.52}
    {"op": "checkpoint_done", "job": "llm", "rank": 0, "step": 110,
     "path": "/ckpt/llm/step-0000000110", "time_ms": 1700000000000}
    {"op": "phase", "job": "llm", "rank": 0, "phase": "evaluating", "step": 110}

``phase`` is what the rank is doing: ``starting`` (from registration to its first step),
``training``, ``checkpointing`` (``save_checkpoint`` enters it and returns to training
itself) or ``evaluating``. It is sent only when it changes, so it costs nothing per step.
The progress signal is the step itself, never a timer thread: a thread proves the process
is alive, not that it moves, and the controller judges a hang by steps that stop
(controller.jobs.hang), each phase against its own bound. ``register`` also carries the
rank's current ``step`` and ``phase``, so an agent that restarted does not see the rank
start over.

``signal`` names the signal the job handles as "checkpoint now" (null: none; the agent
then only asks over the socket). ``step`` and ``checkpoint_done`` carry job and rank so
an agent that restarted still knows who is talking; the library re-registers on every
reconnect anyway.

Agent -> job::

    {"op": "checkpoint"}        # checkpoint at the next step boundary

Checkpoint layout under ``checkpoint_dir``::

    step-0000000110/rank-0.ckpt       the state (raw bytes, or JSON for a dict)
    step-0000000110/rank-0.COMPLETE   manifest: step, rank, world_size, format, size, sha256

Both files are written to a temporary name, fsynced and renamed, the state first, so a
step folder whose ranks do not all have their ``COMPLETE`` manifest (a crash mid-write)
is never the latest checkpoint.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import signal
import socket
import time
from pathlib import Path
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/run/starpulse/jobs.sock"
SOCKET_ENV = "STARPULSE_JOB_SOCKET"
STEP_DIR_RE = re.compile(r"^step-(\d+)$")
MARKER_SUFFIX = ".COMPLETE"
STATE_SUFFIX = ".ckpt"
MAX_OUTBOX = 64 * 1024  # bytes queued for a slow agent; beyond this, messages are dropped
PHASE_STARTING = "starting"
PHASE_TRAINING = "training"
PHASE_CHECKPOINTING = "checkpointing"
PHASE_EVALUATING = "evaluating"
PHASES = (PHASE_STARTING, PHASE_TRAINING, PHASE_CHECKPOINTING, PHASE_EVALUATING)


def step_dir_name(step: int) -> str:
    return f"step-{step:010d}"


def _fsync_dir(path: Path) -> None:
    """Make a rename durable (the directory entry), where the platform allows it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _atomic_write(path: Path, data: bytes) -> None:
    """tmp file, fsync, rename: a reader sees the old file, the whole new file, or nothing."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class StarpulseJob:
    """One rank of a training job, as seen by the node's starpulse agent."""

    def __init__(
        self,
        job: str,
        rank: int = 0,
        world_size: int = 1,
        checkpoint_dir: str | os.PathLike[str] = "checkpoints",
        socket_path: str | None = None,
        signal_number: int | None = signal.SIGUSR1,
        reconnect_interval_s: float = 5.0,
    ) -> None:
        if not job:
            raise ValueError("job name is empty")
        if not 0 <= rank < max(world_size, 1):
            raise ValueError(f"rank {rank} outside world_size {world_size}")
        self.job = job
        self.rank = rank
        self.world_size = world_size
        self.checkpoint_dir = Path(checkpoint_dir)
        self.socket_path = socket_path or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET
        self.signal_number = signal_number
        self.reconnect_interval_s = reconnect_interval_s
        self._sock: socket.socket | None = None
        self._outbox = bytearray()
        self._inbox = bytearray()
        self._next_connect = 0.0
        self._warned_away = False
        self._requested = False
        self._registered = False
        self._previous_handler: Any = None
        self.last_checkpoint: tuple[int, str, int] | None = None  # (step, path, time_ms)
        self.resumed_from_step: int | None = None  # set by resume(): where this run started from
        self.phase = PHASE_STARTING
        self.last_step = 0
        if signal_number is not None:
            self._install_signal(signal_number)

    # -- agent link ----------------------------------------------------------------------

    def register(self) -> bool:
        """Announce this rank to the agent; True when connected. Never raises for agent trouble.

        When the agent is away, ``step()`` retries the connection every
        ``reconnect_interval_s`` and registers again once it is back.
        """
        self._registered = True
        if self.last_checkpoint is None:
            latest = self.latest_checkpoint()
            if latest is not None:
                self.last_checkpoint = (latest[0], latest[1], self._mtime_ms(latest[1]))
        return self._connect()

    def step(self, step: int, step_time_s: float) -> None:
        """Report one finished step (cheap: a non-blocking send, dropped when the agent is away).

        A step means training: a rank still ``starting`` moves to ``training`` with it.
        """
        if self._sock is None and self._registered:
            self._maybe_reconnect()
        self.last_step = int(step)
        if self.phase == PHASE_STARTING:
            self.phase = PHASE_TRAINING  # the agent sets it from the step too: no message needed
        self._send(
            {"op": "step", "job": self.job, "rank": self.rank, "step": int(step), "step_time_s": float(step_time_s)}
        )
        self._poll()

    def set_phase(self, phase: str) -> None:
        """Say what this rank does now (one of PHASES); sent only when it changes.

        ``evaluating`` around an evaluation pass, ``training`` after it: an evaluation is
        judged against its own bound, not against the step time.
        """
        if phase not in PHASES:
            raise ValueError(f"phase {phase!r} is not one of {PHASES}")
        if phase == self.phase:
            return
        self.phase = phase
        self._send({"op": "phase", "job": self.job, "rank": self.rank, "phase": phase, "step": self.last_step})

    @property
    def checkpoint_requested(self) -> bool:
        """True once the agent asked for a checkpoint (signal or socket); cleared by save_checkpoint."""
        self._poll()
        return self._requested

    def request_checkpoint(self) -> None:
        """Ask this process to checkpoint at its next step boundary (what the signal handler does)."""
        self._requested = True

    def close(self) -> None:
        """Drop the agent connection and restore the previous signal handler. Idempotent."""
        self._disconnect()
        self._registered = False
        if self.signal_number is not None and self._previous_handler is not None:
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(self.signal_number, self._previous_handler)
            self._previous_handler = None

    def __enter__(self) -> StarpulseJob:
        self.register()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def _install_signal(self, signum: int) -> None:
        try:
            self._previous_handler = signal.signal(signum, self._on_signal)
        except (ValueError, OSError) as exc:  # not the main thread, or no such signal here
            log.warning("starpulse: cannot handle signal %s (%s); checkpoint requests come by socket only", signum, exc)
            self.signal_number = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._requested = True
        previous = self._previous_handler
        if callable(previous):
            previous(signum, frame)

    def _register_message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {
            "op": "register",
            "job": self.job,
            "rank": self.rank,
            "world_size": self.world_size,
            "pid": os.getpid(),
            "signal": signal.Signals(self.signal_number).name if self.signal_number is not None else None,
            "checkpoint_dir": str(self.checkpoint_dir.absolute()),
            "phase": self.phase,
            "step": self.last_step,
        }
        if self.last_checkpoint is not None:
            step, path, time_ms = self.last_checkpoint
            msg.update(last_checkpoint_step=step, checkpoint_path=path, last_checkpoint_ms=time_ms)
        if self.resumed_from_step is not None:
            msg["resumed_from_step"] = self.resumed_from_step
        return msg

    def _connect(self) -> bool:
        self._disconnect()
        self._next_connect = time.monotonic() + self.reconnect_interval_s
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(0.5)  # a unix connect is instant unless the agent is wedged
            sock.connect(self.socket_path)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            if not self._warned_away:
                log.warning(
                    "starpulse: agent not reachable at %s (%s); training continues, will retry", self.socket_path, exc
                )
                self._warned_away = True
            return False
        self._sock = sock
        self._outbox.clear()
        self._inbox.clear()
        if self._warned_away:
            log.info("starpulse: connected to agent at %s", self.socket_path)
        self._warned_away = False
        self._send(self._register_message())
        return self._sock is not None

    def _maybe_reconnect(self) -> None:
        if time.monotonic() >= self._next_connect:
            self._connect()

    def _disconnect(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None
        self._outbox.clear()

    def _send(self, msg: dict[str, Any]) -> None:
        if self._sock is None:
            return
        line = json.dumps(msg, separators=(",", ":")).encode() + b"\n"
        if len(self._outbox) + len(line) > MAX_OUTBOX:
            return  # the agent is not reading: drop rather than grow or block
        self._outbox += line
        self._flush()

    def _flush(self) -> None:
        sock = self._sock
        while sock is not None and self._outbox:
            try:
                sent = sock.send(self._outbox)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._lost(exc)
                return
            del self._outbox[:sent]

    def _poll(self) -> None:
        """Read what the agent sent (non-blocking) and flush what is queued."""
        sock = self._sock
        if sock is None:
            return
        self._flush()
        while self._sock is not None:
            try:
                data = sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self._lost(exc)
                return
            if not data:
                self._lost(OSError(errno.ECONNRESET, "agent closed the connection"))
                return
            self._inbox += data
            if len(self._inbox) > MAX_OUTBOX and b"\n" not in self._inbox:
                self._inbox.clear()  # not our protocol: drop rather than grow
        while b"\n" in self._inbox:
            line, _, rest = bytes(self._inbox).partition(b"\n")
            self._inbox = bytearray(rest)
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict) and msg.get("op") == "checkpoint":
                log.info("starpulse: agent asked for a checkpoint")
                self._requested = True

    def _lost(self, exc: OSError) -> None:
        log.warning("starpulse: lost the agent connection (%s); training continues, will retry", exc)
        self._warned_away = True
        self._disconnect()
        self._next_connect = time.monotonic() + self.reconnect_interval_s

    # -- checkpoints ---------------------------------------------------------------------

    def save_checkpoint(self, step: int, state: bytes | dict[str, Any]) -> str:
        """Write this rank's checkpoint for `step` atomically; return the step folder.

        The state is written and renamed first, then the ``COMPLETE`` manifest: a crash in
        between leaves a folder that is never "latest". Clears ``checkpoint_requested``
        and tells the agent.
        """
        previous_phase = self.phase
        self.set_phase(PHASE_CHECKPOINTING)
        try:
            return self._write_checkpoint(step, state)
        finally:
            self.set_phase(PHASE_TRAINING if previous_phase == PHASE_STARTING else previous_phase)

    def _write_checkpoint(self, step: int, state: bytes | dict[str, Any]) -> str:
        if isinstance(state, bytes | bytearray | memoryview):
            data, fmt = bytes(state), "bytes"
        else:
            data, fmt = json.dumps(state, sort_keys=True).encode(), "json"
        folder = self.checkpoint_dir / step_dir_name(step)
        folder.mkdir(parents=True, exist_ok=True)
        state_path = folder / f"rank-{self.rank}{STATE_SUFFIX}"
        _atomic_write(state_path, data)
        now_ms = int(time.time() * 1000)
        manifest = {
            "step": int(step),
            "rank": self.rank,
            "world_size": self.world_size,
            "job": self.job,
            "format": fmt,
            "file": state_path.name,
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "time_ms": now_ms,
        }
        _atomic_write(folder / f"rank-{self.rank}{MARKER_SUFFIX}", json.dumps(manifest).encode())
        self._requested = False
        self.last_checkpoint = (int(step), str(folder), now_ms)
        self._send(
            {
                "op": "checkpoint_done",
                "job": self.job,
                "rank": self.rank,
                "step": int(step),
                "path": str(folder),
                "time_ms": now_ms,
            }
        )
        log.info("starpulse: checkpoint step %d written to %s", step, folder)
        return str(folder)

    def latest_checkpoint(self) -> tuple[int, str] | None:
        """(step, folder) of the newest checkpoint every rank completed, or None."""
        for step, folder in self._candidates():
            if self._complete(folder) is not None:
                return step, str(folder)
        return None

    def resume(self) -> tuple[int, bytes | dict[str, Any]] | None:
        """(step, state) from the newest complete checkpoint whose data checks out, or None.

        A checkpoint whose file does not match its manifest (size or sha256) is skipped
        with a warning and the next older complete one is tried.
        """
        for step, folder in self._candidates():
            manifests = self._complete(folder)
            if manifests is None:
                continue
            manifest = manifests.get(self.rank) or manifests.get(0)
            if manifest is None:
                continue
            try:
                data = (folder / str(manifest["file"])).read_bytes()
            except OSError as exc:
                log.warning("starpulse: checkpoint %s unreadable (%s); trying an older one", folder, exc)
                continue
            if len(data) != manifest.get("size") or hashlib.sha256(data).hexdigest() != manifest.get("sha256"):
                log.warning("starpulse: checkpoint %s does not match its manifest; trying an older one", folder)
                continue
            state: bytes | dict[str, Any] = json.loads(data) if manifest.get("format") == "json" else data
            self.last_checkpoint = (step, str(folder), int(manifest.get("time_ms", 0)))
            self.resumed_from_step = step
            self.last_step = step
            self._send(self._register_message())  # tell the controller where this run restarted from
            log.info("starpulse: resuming from step %d (%s)", step, folder)
            return step, state
        return None

    def _candidates(self) -> list[tuple[int, Path]]:
        try:
            entries = list(self.checkpoint_dir.iterdir())
        except OSError:
            return []
        found = []
        for entry in entries:
            m = STEP_DIR_RE.fullmatch(entry.name)
            if m and entry.is_dir():
                found.append((int(m.group(1)), entry))
        return sorted(found, reverse=True)

    @staticmethod
    def _complete(folder: Path) -> dict[int, dict[str, Any]] | None:
        """The manifests of a step folder when all ranks of the world that wrote it finished."""
        manifests: dict[int, dict[str, Any]] = {}
        for marker in folder.glob(f"rank-*{MARKER_SUFFIX}"):
            try:
                manifest = json.loads(marker.read_bytes())
                rank = int(manifest["rank"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if (folder / str(manifest.get("file", ""))).is_file():
                manifests[rank] = manifest
        if not manifests:
            return None
        world = max(int(m.get("world_size", 1)) for m in manifests.values())
        if any(r not in manifests for r in range(world)):
            return None
        return manifests

    @staticmethod
    def _mtime_ms(path: str) -> int:
        try:
            return int(os.stat(path).st_mtime * 1000)
        except OSError:
            return 0
