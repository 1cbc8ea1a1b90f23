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
_SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
_TIMESPEC = struct.Struct("@qq")
_CMSG_SPACE = socket.CMSG_SPACE(_TIMESPEC.size)
# <linux/in.h>, <linux/errqueue.h>: ICMP errors on the socket's error queue, with the offender
_IP_RECVERR = getattr(socket, "IP_RECVERR", 11)
_MSG_ERRQUEUE = getattr(socket, "MSG_ERRQUEUE", 0x2000)
_EXTENDED_ERR = struct.Struct("=IBBBBII")  # errno, origin, type, code, pad, info, data
_SO_EE_ORIGIN_ICMP = 2
_ICMP_TIME_EXCEEDED = 11
_ERR_CMSG_SPACE = socket.CMSG_SPACE(_EXTENDED_ERR.size + 16) + _CMSG_SPACE  # and the receive stamp


class Endpoint(Protocol):
    """One bound place probes leave from or arrive at (non-blocking)."""

    def fileno(self) -> int: ...

    def send(self, data: bytes, address: str, port: int) -> None: ...

    def receive(self) -> tuple[bytes, str, int] | None: ...

    def close(self) -> None: ...


class Tracer(Protocol):
    """An endpoint that can also trace: send with a small TTL and hear who it expired at."""

    def send_ttl(self, data: bytes, address: str, port: int, ttl: int) -> None: ...

    def expired(self) -> list[tuple[str, bytes]]: ...


EndpointFactory = Callable[[str, int, int], Endpoint]  # (local address, local port, dscp)


class UdpEndpoint:
    """A UDP socket bound to (rail address, port), in the RoCE traffic class.

    Each datagram carries the kernel's receive time (``SO_TIMESTAMPNS``, read into
    ``last_rx_ns``, CLOCK_REALTIME ns, 0 where the kernel gave none), so a prober that wakes in
    batches measures a round trip from when the packet arrived, not from when it was read.
    Datagrams are read into one buffer the socket keeps (no 64 KiB allocation per read).

    Tracing (``send_ttl``): a probe sent with TTL 2 crosses the NIC's leaf and expires at the
    spine its flow's ECMP hash picked (same 5-tuple, same path); the spine's ICMP time-exceeded
    comes back on this socket's error queue (``IP_RECVERR``) with the spine's address and the
    start of the probe, and ``expired`` hands out (offender address, probe bytes) pairs.
    """

    def __init__(self, address: str, port: int, dscp: int) -> None:
        self.address, self.port = address, port
        self.last_rx_ns = 0
        self.peer: tuple[str, int] = ("", 0)  # who sent what ``read`` read
        self._buf = bytearray(65536)
        self._view = memoryview(self._buf)
        self.view = self._view  # what ``read`` read, in place
        self._bufs = [self._view]
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self._sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, (dscp & 0x3F) << 2)
            self._sock.setsockopt(socket.IPPROTO_IP, _IP_MTU_DISCOVER, _IP_PMTUDISC_DO)
            self.stamps = True  # the kernel stamps what arrives: the prober may wake in batches
            try:
                self._sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            except OSError:
                self.stamps = False
            self._expired: list[tuple[str, bytes]] = []
            with contextlib.suppress(OSError):
                self._sock.setsockopt(socket.IPPROTO_IP, _IP_RECVERR, 1)
            self._sock.setblocking(False)
            self._sock.bind((address, port))
        except OSError:
            self._sock.close()
            raise

    def fileno(self) -> int:
        return self._sock.fileno()

    def reserve(self, nbytes: int) -> int:
        """Ask for a receive buffer of ``nbytes`` and return what the kernel granted (bytes of
        datagrams with their overhead): a responder that answers once a tick holds that tick's
        requests meanwhile. ``SO_RCVBUFFORCE`` where the agent may (``CAP_NET_ADMIN``), else
        ``SO_RCVBUF``, which the kernel caps at ``net.core.rmem_max``."""
        for option in (_SO_RCVBUFFORCE, socket.SO_RCVBUF):
            try:
                self._sock.setsockopt(socket.SOL_SOCKET, option, nbytes)
                break
            except OSError:
                continue
        return int(self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))

    def send(self, data: bytes, address: str, port: int) -> None:
        # A full queue or an unreachable route is a lost probe, which is what it counts as. An ICMP
        # error that reached this socket (IP_RECVERR) fails the next send once, taking the error
        # with it: that probe is sent again, not lost.
        for _ in range(2):
            try:
                self._sock.sendto(data, (address, port))
                return
            except OSError:
                continue

    def send_to(self, data: bytes | bytearray, peer: tuple[str, int]) -> None:
        """``send`` with the peer as one tuple and the data as any buffer (the hot path: no copies)."""
        for _ in range(2):
            try:
                self._sock.sendto(data, peer)
                return
            except OSError:
                continue

    def reply(self, n: int) -> None:
        """Send the first ``n`` bytes of ``view`` (a request turned into its reply) back to ``peer``."""
        with contextlib.suppress(OSError):
            self._sock.sendto(self._view[:n], self.peer)

    def read(self) -> int:
        """One datagram into ``view``: its length, 0 when none is waiting (nothing raised, no errors
        drained: that is ``drain_errors``' job when the poller reports them). The sender lands in
        ``peer`` and the kernel's receive stamp in ``last_rx_ns``."""
        try:
            n, ancdata, _, self.peer = self._sock.recvmsg_into(self._bufs, _CMSG_SPACE)
        except OSError:
            return 0
        stamp = 0
        for level, kind, raw in ancdata:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(raw) >= _TIMESPEC.size:
                sec, nsec = _TIMESPEC.unpack_from(raw)
                stamp = sec * 1_000_000_000 + nsec
        self.last_rx_ns = stamp
        return int(n)

    def drain_errors(self) -> None:
        """Read the error queue empty and clear the socket's pending error (both keep it polling
        as errored); what it held of trace expiries waits in ``expired``."""
        self._drain_errors()
        with contextlib.suppress(OSError):
            self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)

    def send_ttl(self, data: bytes, address: str, port: int, ttl: int) -> None:
        """Send one datagram with IP TTL ``ttl`` (then back to the default)."""
        with contextlib.suppress(OSError):
            self._sock.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
            try:
                self.send(data, address, port)
            finally:
                self._sock.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, -1)

    def expired(self) -> list[tuple[str, bytes]]:
        """The (offender address, probe bytes) of every time-exceeded read since the last call."""
        out, self._expired = self._expired, []
        return out

    def _drain_errors(self) -> None:
        """Read the error queue empty: it keeps the socket readable until it is (a busy loop)."""
        for _ in range(256):
            try:
                data, ancdata, _, _ = self._sock.recvmsg(512, _ERR_CMSG_SPACE, _MSG_ERRQUEUE)
            except OSError:
                return
            for level, kind, raw in ancdata:
                if level != socket.IPPROTO_IP or kind != _IP_RECVERR or len(raw) < _EXTENDED_ERR.size + 8:
                    continue
                _, origin, icmp_type, _, _, _, _ = _EXTENDED_ERR.unpack_from(raw)
                if origin == _SO_EE_ORIGIN_ICMP and icmp_type == _ICMP_TIME_EXCEEDED:
                    offender = socket.inet_ntoa(raw[_EXTENDED_ERR.size + 4 : _EXTENDED_ERR.size + 8])
                    self._expired.append((offender, bytes(data)))

    def receive(self) -> tuple[bytes, str, int] | None:
        try:
            n, ancdata, _, (address, port) = self._sock.recvmsg_into([self._view], _CMSG_SPACE)
        except (BlockingIOError, InterruptedError):
            self._drain_errors()
            return None
        except OSError:
            self._drain_errors()  # an ICMP error (port unreachable, time exceeded) is pending
            return None
        self.last_rx_ns = 0
        for level, kind, raw in ancdata:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(raw) >= _TIMESPEC.size:
                sec, nsec = _TIMESPEC.unpack_from(raw)
                self.last_rx_ns = sec * 1_000_000_000 + nsec
        return bytes(self._view[:n]), address, port

    def close(self) -> None:
        self._sock.close()
