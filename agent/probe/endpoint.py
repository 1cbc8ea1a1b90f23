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
import struct
from collections.abc import Callable
from typing import Protocol

# Linux <linux/in.h>: never fragment, whatever the route's MTU says.
_IP_MTU_DISCOVER = getattr(socket, "IP_MTU_DISCOVER", 10)
_IP_PMTUDISC_DO = getattr(socket, "IP_PMTUDISC_DO", 2)
# <asm-generic/socket.h>: the kernel's receive time in each datagram's ancillary data
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("@qq")
_CMSG_SPACE = socket.CMSG_SPACE(_TIMESPEC.size)


class Endpoint(Protocol):
    """One bound place probes leave from or arrive at (non-blocking)."""

    def fileno(self) -> int: ...

    def send(self, data: bytes, address: str, port: int) -> None: ...

    def receive(self) -> tuple[bytes, str, int] | None: ...

    def close(self) -> None: ...


EndpointFactory = Callable[[str, int, int], Endpoint]  # (local address, local port, dscp)


class UdpEndpoint:
    """A UDP socket bound to (rail address, port), in the RoCE traffic class.

    Each datagram carries the kernel's receive time (``SO_TIMESTAMPNS``, read into
    ``last_rx_ns``, CLOCK_REALTIME ns, 0 where the kernel gave none), so a prober that wakes in
    batches measures a round trip from when the packet arrived, not from when it was read.
    Datagrams are read into one buffer the socket keeps (no 64 KiB allocation per read).
    """

    def __init__(self, address: str, port: int, dscp: int) -> None:
        self.address, self.port = address, port
        self.last_rx_ns = 0
        self._buf = bytearray(65536)
        self._view = memoryview(self._buf)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self._sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, (dscp & 0x3F) << 2)
            self._sock.setsockopt(socket.IPPROTO_IP, _IP_MTU_DISCOVER, _IP_PMTUDISC_DO)
            self.stamps = True  # the kernel stamps what arrives: the prober may wake in batches
            try:
                self._sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            except OSError:
                self.stamps = False
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
            n, ancdata, _, (address, port) = self._sock.recvmsg_into([self._view], _CMSG_SPACE)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            return None  # e.g. ICMP port unreachable queued from an earlier send
        self.last_rx_ns = 0
        for level, kind, raw in ancdata:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(raw) >= _TIMESPEC.size:
                sec, nsec = _TIMESPEC.unpack_from(raw)
                self.last_rx_ns = sec * 1_000_000_000 + nsec
        return bytes(self._view[:n]), address, port

    def close(self) -> None:
        self._sock.close()
