"""Sleep until a log has something new, instead of waking every poll interval to look.

A tail that wakes 5 times a second to find nothing costs a tenth of the agent's CPU
budget in wakeups alone (bench/README.md, agent overhead pass 2).
``/dev/kmsg`` supports poll(2); a regular file (the simulator's kernel log) is watched
with inotify. Either way a stop request wakes the sleeper through a pipe, and a safety
timeout still wakes it now and then, so nothing depends on an event being delivered.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import select

# <sys/inotify.h>
IN_MODIFY = 0x002
IN_ATTRIB = 0x004  # also a link-count change: the file was unlinked or renamed over
IN_CLOSE_WRITE = 0x008
IN_MOVE_SELF = 0x800
IN_DELETE_SELF = 0x400
_FILE_EVENTS = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVE_SELF | IN_DELETE_SELF


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name, use_errno=True)
        lib.inotify_init1  # noqa: B018 - a libc without inotify: AttributeError
    except (OSError, AttributeError):
        return None
    return lib


_LIBC = _libc()


class Waiter:
    """One sleeping thread's wake-up pipe, plus the file descriptor it waits on."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._closed = False

    def wake(self) -> None:
        """Wake the sleeper now (from any thread)."""
        with contextlib.suppress(OSError):
            os.write(self._w, b"x")

    def wait(self, fd: int | None, timeout_s: float) -> None:
        """Sleep until ``fd`` is readable, ``wake`` is called, or ``timeout_s`` passes."""
        poller = select.poll()
        poller.register(self._r, select.POLLIN)
        if fd is not None:
            poller.register(fd, select.POLLIN | select.POLLPRI)
        try:
            ready = poller.poll(max(0.0, timeout_s) * 1000.0)
        except InterruptedError:
            return
        for ready_fd, _ in ready:
            if ready_fd == self._r:
                _drain(self._r)

    def watch_file(self, path: str) -> int | None:
        """An inotify descriptor that turns readable when ``path`` changes; None without inotify."""
        if _LIBC is None:
            return None
        fd = int(_LIBC.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
        if fd < 0:
            return None
        if int(_LIBC.inotify_add_watch(fd, os.fsencode(path), _FILE_EVENTS)) < 0:
            os.close(fd)
            return None
        return fd

    @staticmethod
    def consume(fd: int) -> None:
        """Forget the events queued on a watch descriptor (the caller re-reads the file anyway)."""
        _drain(fd)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)


def _drain(fd: int) -> None:
    with contextlib.suppress(OSError):
        while os.read(fd, 4096):
            pass
