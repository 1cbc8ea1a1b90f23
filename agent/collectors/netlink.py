"""Netdev link notifications from the kernel: rtnetlink's RTMGRP_LINK group, no extra dependency.

The kernel multicasts an RTM_NEWLINK message whenever a netdev's flags or operstate change
(carrier lost, cable pulled, admin down). Reading them costs nothing while nothing changes,
which is what lets the link watch react to a netdev at once without polling it. Only the
two attributes the watch needs are parsed (IFLA_IFNAME, IFLA_OPERSTATE); pyroute2 would do
the same with a dependency, and nothing else here needs it.
"""

from __future__ import annotations

import socket
import struct

import structlog

log = structlog.get_logger(__name__)

NETLINK_ROUTE = 0
RTMGRP_LINK = 1
RTM_NEWLINK = 16
RTM_DELLINK = 17
IFLA_IFNAME = 3
IFLA_OPERSTATE = 16
# RFC 2863 operational states as rtnetlink numbers them (IF_OPER_*).
OPERSTATES = ("unknown", "notpresent", "down", "lowerlayerdown", "testing", "dormant", "up")
_NLMSGHDR = struct.Struct("=LHHLL")
_IFINFOMSG = struct.Struct("=BxHiII")
_RTATTR = struct.Struct("=HH")


def _align(n: int) -> int:
    return (n + 3) & ~3


def parse_link_messages(data: bytes) -> list[tuple[str, str]]:
    """(netdev name, operstate) of every RTM_NEWLINK/RTM_DELLINK in one datagram ("gone" for DELLINK)."""
    out: list[tuple[str, str]] = []
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _flags, _seq, _pid = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size or offset + length > len(data):
            break  # truncated or garbled: what was read so far stands
        if kind in (RTM_NEWLINK, RTM_DELLINK):
            body = offset + _NLMSGHDR.size
            name, state = "", "unknown"
            at = body + _IFINFOMSG.size
            while at + _RTATTR.size <= offset + length:
                alen, atype = _RTATTR.unpack_from(data, at)
                if alen < _RTATTR.size:
                    break
                value = data[at + _RTATTR.size : at + alen]
                if atype == IFLA_IFNAME:
                    name = value.split(b"\0", 1)[0].decode("ascii", errors="replace")
                elif atype == IFLA_OPERSTATE and value:
                    state = OPERSTATES[value[0]] if value[0] < len(OPERSTATES) else "unknown"
                at += _align(alen)
            if name:
                out.append((name, "gone" if kind == RTM_DELLINK else state))
        offset += _align(length)
    return out


class LinkNotifier:
    """A non-blocking rtnetlink socket subscribed to link changes; ``open`` is None where there is none."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    @classmethod
    def open(cls) -> LinkNotifier | None:
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
            sock.bind((0, RTMGRP_LINK))
        except (OSError, AttributeError) as exc:  # not Linux, or no netlink in this sandbox
            log.info("netlink_unavailable", error=str(exc) or type(exc).__name__)
            return None
        sock.setblocking(False)
        return cls(sock)

    def fileno(self) -> int:
        return self._sock.fileno()

    def read(self) -> list[tuple[str, str]]:
        """Every pending notification, drained: (netdev, operstate)."""
        out: list[tuple[str, str]] = []
        while True:
            try:
                data = self._sock.recv(65536)
            except BlockingIOError:
                return out
            except OSError as exc:  # ENOBUFS: notifications were lost; the caller polls everything anyway
                log.warning("netlink_read_failed", error=str(exc))
                return out
            out.extend(parse_link_messages(data))

    def close(self) -> None:
        self._sock.close()
