"""Many datagrams per system call: libc's ``recvmmsg`` and ``sendmmsg`` through ctypes (Linux).

A responder's requests of one tick are read in one call, turned into their replies in place
and sent back in one more, where ``socket`` would take a call per datagram and one more to find
the socket empty. ``Batch`` holds fixed slots (data, sender, control space for the kernel's
receive stamp) made once, so a call allocates nothing. ``batch()`` is None where libc lacks the
calls (not Linux, or no glibc/musl symbols): the prober then reads datagram by datagram.
"""

from __future__ import annotations

import ctypes
import errno
import socket
import struct

_MSG_DONTWAIT = 0x40
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_NAME = 16  # sizeof(struct sockaddr_in)
_CTRL = socket.CMSG_SPACE(16)  # one struct timespec
_CMSG = struct.Struct("@Nii")  # cmsg_len, cmsg_level, cmsg_type
_TIMESPEC = struct.Struct("@qq")
_LEN = struct.Struct("@I")
_SIZE = struct.Struct("@N")
_SOCKADDR_IN = struct.Struct("!2xH4s")  # family (skipped), port, address


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [
        ("msg_name", ctypes.c_void_p),
        ("msg_namelen", ctypes.c_uint32),
        ("msg_iov", ctypes.c_void_p),
        ("msg_iovlen", ctypes.c_size_t),
        ("msg_control", ctypes.c_void_p),
        ("msg_controllen", ctypes.c_size_t),
        ("msg_flags", ctypes.c_int),
    ]


class _Mmsghdr(ctypes.Structure):
    _fields_ = [("msg_hdr", _Msghdr), ("msg_len", ctypes.c_uint)]


_STRIDE = ctypes.sizeof(_Mmsghdr)
_LEN_AT = _Mmsghdr.msg_len.offset
_CTRLLEN_AT = _Msghdr.msg_controllen.offset
_IOV_STRIDE = ctypes.sizeof(_Iovec)
_IOV_LEN_AT = _Iovec.iov_len.offset


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.recvmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
        libc.sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


class Batch:
    """``slots`` datagrams of up to ``size`` bytes: ``recv`` fills them from one socket, ``send_back``
    returns the first ``n`` to their senders (each with its own length, from its own slot)."""

    def __init__(self, libc: ctypes.CDLL, slots: int, size: int) -> None:
        self.slots, self.size = slots, size
        self._recvmmsg, self._sendmmsg = libc.recvmmsg, libc.sendmmsg
        self._data = (ctypes.c_char * (slots * size))()
        self._names = (ctypes.c_char * (slots * _NAME))()
        self._ctrl = (ctypes.c_char * (slots * _CTRL))()
        self._iov = (_Iovec * slots)()
        self._send_iov = (_Iovec * slots)()
        self._recv = (_Mmsghdr * slots)()
        self._send = (_Mmsghdr * slots)()
        data, names, ctrl = ctypes.addressof(self._data), ctypes.addressof(self._names), ctypes.addressof(self._ctrl)
        for i in range(slots):
            self._iov[i].iov_base = self._send_iov[i].iov_base = data + i * size
            self._iov[i].iov_len = size
            r, s = self._recv[i].msg_hdr, self._send[i].msg_hdr
            r.msg_name = s.msg_name = names + i * _NAME
            r.msg_namelen = s.msg_namelen = _NAME
            r.msg_iov = ctypes.addressof(self._iov) + i * _IOV_STRIDE
            s.msg_iov = ctypes.addressof(self._send_iov) + i * _IOV_STRIDE
            r.msg_iovlen = s.msg_iovlen = 1
            r.msg_control = ctrl + i * _CTRL
            r.msg_controllen = _CTRL
        self._pristine = bytes(self._recv)  # the kernel rewrites each name and control length: reset per call
        self.data = memoryview(self._data).cast("B")
        self._hdrs = memoryview(self._recv).cast("B")
        self._ctrl_view = memoryview(self._ctrl).cast("B")
        self._names_view = memoryview(self._names).cast("B")
        self._send_iov_view = memoryview(self._send_iov).cast("B")

    def recv(self, fd: int) -> int:
        """Read up to ``slots`` waiting datagrams from ``fd`` without blocking: how many (0: none)."""
        ctypes.memmove(self._recv, self._pristine, len(self._pristine))
        n = self._recvmmsg(fd, self._recv, self.slots, _MSG_DONTWAIT, None)
        return n if n > 0 else 0

    def length(self, i: int) -> int:
        """Bytes slot ``i`` received (at most ``size``: a longer datagram is cut)."""
        return min(int(_LEN.unpack_from(self._hdrs, i * _STRIDE + _LEN_AT)[0]), self.size)

    def stamp(self, i: int) -> int:
        """Slot ``i``'s kernel receive time (CLOCK_REALTIME ns), 0 where the kernel gave none."""
        if _SIZE.unpack_from(self._hdrs, i * _STRIDE + _CTRLLEN_AT)[0] < _CMSG.size + _TIMESPEC.size:
            return 0
        at = i * _CTRL
        _, level, kind = _CMSG.unpack_from(self._ctrl_view, at)
        if level != socket.SOL_SOCKET or kind != _SO_TIMESTAMPNS:
            return 0
        sec, nsec = _TIMESPEC.unpack_from(self._ctrl_view, at + _CMSG.size)
        return int(sec * 1_000_000_000 + nsec)

    def sender(self, i: int) -> tuple[str, int]:
        """Who sent slot ``i`` (address, port)."""
        port, address = _SOCKADDR_IN.unpack_from(self._names_view, i * _NAME)
        return socket.inet_ntoa(address), int(port)

    def send_back(self, fd: int, lengths: list[int]) -> int:
        """Send slots 0.. ``len(lengths)`` - 1, each its given length, to their senders: how many left.

        A send that fails stops ``sendmmsg`` there, and one reply's failure is often another's
        doing: a reply to a port that has closed (a prober that switched plans or restarted)
        comes back at once, on loopback within this very call, as ICMP port unreachable, which
        the socket (``IP_RECVERR``) hands to its next send as ECONNREFUSED. So the call goes on
        from the first unsent slot; a slot that fails twice in a row is its own failure and is
        skipped. Without this a starved responder's big batch lost every reply after the first
        such one: this host's loss, which the probers counted as the network's.
        """
        view = self._send_iov_view
        for i, n in enumerate(lengths):
            _SIZE.pack_into(view, i * _IOV_STRIDE + _IOV_LEN_AT, n)
        total, at, failed_at = len(lengths), 0, -1
        sent_total = 0
        base = ctypes.addressof(self._send)
        while at < total:
            sent = self._sendmmsg(fd, base + at * _STRIDE, total - at, _MSG_DONTWAIT)
            if sent > 0:
                sent_total += sent
                at += sent
                continue
            if failed_at == at or ctypes.get_errno() in (errno.EAGAIN, errno.EWOULDBLOCK):
                at += 1  # this slot's own failure (or the queue is full): it is lost, the rest go on
                failed_at = -1
            else:
                failed_at = at  # an error left by an earlier reply, taken by this call: once more
        return sent_total


def batch(slots: int, size: int) -> Batch | None:
    """A ``Batch``, or None where libc has no ``recvmmsg``/``sendmmsg``."""
    return Batch(_LIBC, slots, size) if _LIBC is not None else None
