"""One agent per state folder: the event buffer's sequence numbers are only contiguous with one writer.

Two agents on the same ``--state-dir`` would interleave appends to one SQLite buffer (one of them
soon dies on a duplicate ``seq``) and replay each other's events under the wrong node. The agent
process takes an exclusive ``flock`` on ``agent.lock`` in the folder for its whole life; the kernel
drops it when the process ends, however it ends, so a crash never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

LOCK_FILE = "agent.lock"


class StateDirInUse(OSError):
    """Another live process holds the folder's lock (its pid when it wrote one)."""

    def __init__(self, folder: Path, holder: str) -> None:
        who = f"agent pid {holder}" if holder else "another process"
        super().__init__(f"{folder}: already in use by {who} (one agent per state folder)")
        self.folder = folder
        self.holder = holder


class StateLock:
    """The held lock on a state folder; ``release()`` (or process exit) frees it."""

    def __init__(self, folder: Path, handle: IO[str]) -> None:
        self.folder = folder
        self._handle = handle

    def release(self) -> None:
        fcntl.flock(self._handle, fcntl.LOCK_UN)
        self._handle.close()


def lock_state_dir(folder: Path) -> StateLock:
    """Create the folder if needed and lock it for this process; StateDirInUse when another holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    handle = (folder / LOCK_FILE).open("a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip()
        handle.close()
        raise StateDirInUse(folder, holder) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return StateLock(folder, handle)
