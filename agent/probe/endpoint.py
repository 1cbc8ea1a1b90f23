"""Where a probe leaves and arrives: the seam between the prober and the rail.

``UdpEndpoint`` is a UDP socket bound to one rail's own address (so the probe is routed out
of that rail, not whichever interface the default route names), marked with the RoCE
class's DSCP and never fragmented (the probe is sized to the rail MTU: a path whose MTU is
smaller drops it, which is the point). The RDMA UD path (``agent.probe.verbs``) implements the
same protocol where rdma-core's ``pyverbs`` is present.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable
from typing import Protocol

# Linux <linux/in.h>: never fragment, whatever the route's MTU says.
_IP_MTU_DISCOVER = getattr(socket, "IP_MTU_DISCOVER", 10)
_IP_PMTUDISC_DO = getattr(socket, "IP_PMTUDISC_DO", 2)


class Endpoint(Protocol):
    """One bound place probes leave from or arrive at (non-blocking)."""

    def fileno(self) -> int: ...

    def send(self, data: bytes, address: str, port: int) -> None: ...

    def receive(self) -> tuple[bytes, str, int] | None: ...

    def close(self) -> None: ...


EndpointFactory = Callable[[str, int, int], Endpoint]  # (local address, local port, dscp)


class UdpEndpoint:
    """A UDP socket bound to (rail address, port), in the RoCE traffic class."""

    def __init__(self, address: str, port: int, dscp: int) -> None:
        self.address, self.port = address, port
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self._sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, (dscp & 0x3F) << 2)
            self._sock.setsockopt(socket.IPPROTO_IP, _IP_MTU_DISCOVER, _IP_PMTUDISC_DO)
            self._sock.setblocking(False)
            self._sock.bind((address, port))
        except OSError:
            self._sock.close()
            raise

    def fileno(self) -> int:
        return self._sock.fileno()

    def send(self, data: bytes, address: str, port: int) -> None:
        # A full queue or an unreachable route is a lost probe, which is what it counts as.
        with contextlib.suppress(OSError):
            self._sock.sendto(data, (address, port))

    def receive(self) -> tuple[bytes, str, int] | None:
        try:
            data, (address, port) = self._sock.recvfrom(65536)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            return None  # e.g. ICMP port unreachable queued from an earlier send
        return data, address, port

    def close(self) -> None:
        self._sock.close()
