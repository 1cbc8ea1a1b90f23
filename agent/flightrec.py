"""PyTorch's NCCL flight recorder, read safely from outside the job.

Where a job enables it (``TORCH_NCCL_TRACE_BUFFER_SIZE`` > 0 and
``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<stem>``), every rank creates a FIFO ``<stem><rank>.pipe``;
writing to it makes the rank dump its recorder to ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>``
(default ``/tmp/nccl_trace_rank_<rank>``). The agent runs with ``PrivateTmp=yes``, so it
reaches both through ``/proc/PID/root`` (the rank's own view of the file system).

The dump format followed is torch 2.5's (``torch/distributed/flight_recorder/components/
types.py``, the flight recorder tutorial): top-level ``version``, ``pg_config``, ``pg_status``
and ``entries[]``, each entry with ``record_id``, ``pg_id``, ``collective_seq_id``,
``profiling_name`` (``nccl:all_reduce``), ``state`` (scheduled / started / completed) and
``frames``. A dump is the job's file: never ``pickle.load`` it. JSON (``_dump_nccl_trace_json``,
torch >= 2.5) is read as JSON; a pickle goes through ``SafeUnpickler``, which builds plain
containers only and refuses every global, so a crafted file cannot run code.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import time
from typing import Any

DEFAULT_TEMP_FILE = "/tmp/nccl_trace_rank_"
MAX_DUMP_BYTES = 64 * 1024 * 1024


class UnsafeDump(ValueError):
    """The file is neither JSON nor a pickle of plain containers."""


class SafeUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings, bytes, numbers, booleans and None; nothing else.

    Every global (a class, a function: what ``__reduce__`` exploits use) is refused, so the
    pickle opcodes that could call code have nothing to call.
    """

    def find_class(self, module: str, name: str) -> Any:
        raise UnsafeDump(f"refused global {module}.{name} in a flight-recorder dump")


def load_dump(data: bytes) -> dict[str, Any]:
    """A flight-recorder dump from its bytes: JSON, or a pickle of plain containers; UnsafeDump otherwise."""
    if len(data) > MAX_DUMP_BYTES:
        raise UnsafeDump(f"dump of {len(data)} bytes is larger than {MAX_DUMP_BYTES}")
    stripped = data.lstrip()
    if stripped[:1] in (b"{", b"["):
        try:
            out = json.loads(data)
        except ValueError as exc:
            raise UnsafeDump(f"not JSON: {exc}") from None
    else:
        try:
            out = SafeUnpickler(io.BytesIO(data)).load()
        except UnsafeDump:
            raise
        except Exception as exc:  # a truncated or malformed pickle
            raise UnsafeDump(f"not a readable pickle: {type(exc).__name__}: {exc}") from None
    if not isinstance(out, dict):
        raise UnsafeDump(f"dump is a {type(out).__name__}, not a mapping")
    return out


def last_collective(dump: dict[str, Any]) -> dict[str, Any] | None:
    """The collective this rank is in: its last entry not completed, else its last entry."""
    entries = [e for e in dump.get("entries") or [] if isinstance(e, dict)]
    if not entries:
        return None
    pending = [e for e in entries if e.get("state") != "completed"]
    e = (pending or entries)[-1]
    return {
        "profiling_name": str(e.get("profiling_name", "")),
        "collective_seq_id": e.get("collective_seq_id"),
        "pg_id": e.get("pg_id"),
        "state": str(e.get("state", "")),
    }


def read_environ(pid: int, procfs: str = "/proc") -> dict[str, str]:
    """The process's environment (needs its uid or CAP_SYS_PTRACE); {} when unreadable."""
    try:
        with open(f"{procfs}/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return {}
    env: dict[str, str] = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def dump_rank(pid: int, rank: int, procfs: str = "/proc", wait_s: float = 2.0) -> dict[str, Any] | None:
    """Ask rank ``rank`` (process ``pid``) for its flight-recorder dump and read it; None where not enabled.

    Writes to its debug pipe through ``/proc/PID/root`` and waits up to ``wait_s`` for a newer
    dump file. Raises UnsafeDump for a dump that is not plain data.
    """
    env = read_environ(pid, procfs)
    try:
        enabled = int(env.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or env.get("TORCH_FR_BUFFER_SIZE") or "0") > 0
    except ValueError:
        enabled = False
    stem = env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
    if not enabled or not stem:
        return None
    root = f"{procfs}/{pid}/root"
    dump_path = root + (env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") or DEFAULT_TEMP_FILE) + str(rank)
    before = _mtime(dump_path)
    with contextlib.suppress(OSError):  # no reader on the pipe (ENXIO): the rank is gone or not ready
        fd = os.open(f"{root}{stem}{rank}.pipe", os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, b"1")
        finally:
            os.close(fd)
    deadline = time.monotonic() + wait_s
    while _mtime(dump_path) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        with open(dump_path, "rb") as fh:
            data = fh.read(MAX_DUMP_BYTES + 1)
    except OSError:
        return None
    return load_dump(data)


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None
