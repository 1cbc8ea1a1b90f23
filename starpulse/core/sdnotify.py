"""A tiny sd_notify(3) client: tell systemd a Type=notify service is ready, alive, stopping.

Stdlib only (one AF_UNIX datagram to ``$NOTIFY_SOCKET``; a leading ``@`` names the
abstract namespace). Outside systemd (no ``NOTIFY_SOCKET``) every call is a no-op that
returns False, and no call ever raises: a service must not die because its supervisor's
socket is gone.

The watchdog: with ``WatchdogSec=`` in the unit, systemd sets ``WATCHDOG_USEC`` (and
``WATCHDOG_PID``) and kills the service when no ``WATCHDOG=1`` arrives within that time.
Send it from the loop whose progress it vouches for, about every half interval
(``Watchdog.kick``), so a hung loop (a blocked NVML call, a wedged event loop) is restarted.
"""

from __future__ import annotations

import os
import socket
import time

__all__ = ["Watchdog", "notify", "ready", "stopping", "watchdog", "watchdog_interval_s"]

_SEND_TIMEOUT_S = 1.0  # systemd drains the socket at once; never stall the caller's loop for long


def _address() -> str | None:
    """``$NOTIFY_SOCKET`` as a socket address, or None (unset, or a kind this client does not speak)."""
    raw = os.environ.get("NOTIFY_SOCKET", "")
    if raw.startswith("@"):
        return "\0" + raw[1:]  # abstract namespace
    if raw.startswith("/"):
        return raw
    return None  # unset, empty, or vsock:... (not used for host services)


def notify(state: str) -> bool:
    """Send ``state`` (e.g. ``"READY=1"``, newline-separated assignments); True when it was sent."""
    address = _address()
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(_SEND_TIMEOUT_S)
            sock.connect(address)
            sock.sendall(state.encode("utf-8", errors="replace"))
        return True
    except Exception:  # never raise: OSError, a timeout, an odd path
        return False


def ready(status: str | None = None) -> bool:
    """READY=1: start-up finished (systemd then starts units ordered after this one)."""
    return notify("READY=1" + (f"\nSTATUS={_one_line(status)}" if status else ""))


def stopping(status: str | None = None) -> bool:
    """STOPPING=1: a graceful shutdown began (flushing buffers; TimeoutStopSec= bounds it)."""
    return notify("STOPPING=1" + (f"\nSTATUS={_one_line(status)}" if status else ""))


def watchdog() -> bool:
    """WATCHDOG=1: the service is alive; resets systemd's WatchdogSec= timer."""
    return notify("WATCHDOG=1")


def watchdog_interval_s() -> float | None:
    """The watchdog timeout systemd expects pings within (seconds), or None when there is none for us."""
    try:
        usec = int(os.environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    pid = os.environ.get("WATCHDOG_PID", "")
    if pid:
        try:
            if int(pid) != os.getpid():
                return None  # meant for another process (our parent, a wrapper)
        except ValueError:
            return None
    return usec / 1_000_000


def _one_line(text: str) -> str:
    return " ".join(text.split())


class Watchdog:
    """Pings systemd's watchdog at most every half interval; a no-op when no watchdog is configured."""

    def __init__(self, interval_s: float | None = None) -> None:
        self.interval_s = watchdog_interval_s() if interval_s is None else interval_s
        self._last = float("-inf")

    @property
    def enabled(self) -> bool:
        return self.interval_s is not None and self.interval_s > 0

    def kick(self, now: float | None = None) -> bool:
        """Send WATCHDOG=1 when half the interval passed since the last ping; True when sent."""
        if not self.enabled or self.interval_s is None:
            return False
        now = time.monotonic() if now is None else now
        if now - self._last < self.interval_s / 2:
            return False
        self._last = now
        return watchdog()
