"""RDMA UD probes through rdma-core's ``pyverbs``: the production path where a device exists.

The same ``Endpoint`` seam as UDP (agent.probe.endpoint): one UD queue pair per rail NIC
(``Context(name=device)``, ``PD``, a ``CQ`` on a ``CompChannel`` whose fd the prober's selector
waits on, ``QP`` of type ``IBV_QPT_UD`` brought to RTS), sourced from the rail's own address
(the GID index whose GID is the IPv4-mapped address), in the RoCE class (``GlobalRoute``
traffic class = DSCP << 2). A send builds an ``AH`` to the peer's IPv4-mapped GID and posts a
``SendWR`` with ``set_wr_ud(ah, remote_qpn, qkey)``; a receive polls the CQ, skips the 40-byte
GRH, and answers to the GRH's source GID and the completion's ``src_qp``.

The peer responder's QP number is what ``port`` names here (UDP's port); learning it is the
``qpn_of`` resolver's job (R-Pingmesh's agents register theirs with the controller). Written
against pyverbs' names; this machine has no RDMA device, so it is tested against a fake with
those names (tests/agent/probe/test_probe_verbs.py), not on hardware.
"""

from __future__ import annotations

import contextlib
import importlib
import ipaddress
from collections.abc import Callable
from types import ModuleType
from typing import Any

GRH = 40
QKEY = 0x11111111
_BUF = 8192
_RECVS = 64


def _mapped(address: str) -> str:
    return str(ipaddress.IPv6Address(f"::ffff:{address}"))


def load_pyverbs() -> ModuleType | None:
    """``pyverbs`` when rdma-core's Python bindings are installed, else None."""
    try:
        package = importlib.import_module("pyverbs")
        for part in ("device", "pd", "cq", "qp", "mr", "wr", "addr", "enums"):
            importlib.import_module(f"pyverbs.{part}")
    except ImportError:
        return None
    return package


def verbs_endpoints(verbs: Any, device_of: Callable[[str], str]) -> Callable[[str, int, int], VerbsEndpoint]:
    """The prober's endpoint factory on RDMA: ``device_of(rail address)`` names the HCA ("mlx5_3")."""

    def make(address: str, port: int, dscp: int) -> VerbsEndpoint:
        return VerbsEndpoint(address, port, dscp, device=device_of(address), verbs=verbs)

    return make


class VerbsEndpoint:
    """One UD queue pair on one rail NIC; ``verbs``: the pyverbs package (or a fake with its names)."""

    def __init__(
        self,
        address: str,
        port: int,
        dscp: int,
        *,
        device: str,
        verbs: Any,
        ib_port: int = 1,
        qpn_of: Callable[[str, int], int] = lambda address, port: port,
    ) -> None:
        e = verbs.enums
        self._v, self._e = verbs, e
        self.address, self.port, self._ib_port = address, port, ib_port
        self._tclass = (dscp & 0x3F) << 2
        self._qpn_of = qpn_of
        self.ctx = verbs.device.Context(name=device)
        self.sgid_index = self._gid_index(_mapped(address))
        self.pd = verbs.pd.PD(self.ctx)
        self.channel = verbs.cq.CompChannel(self.ctx)
        self.cq = verbs.cq.CQ(self.ctx, 2 * _RECVS, None, self.channel, 0)
        cap = verbs.qp.QPCap(max_send_wr=_RECVS, max_recv_wr=_RECVS, max_send_sge=1, max_recv_sge=1)
        init = verbs.qp.QPInitAttr(qp_type=e.IBV_QPT_UD, scq=self.cq, rcq=self.cq, cap=cap)
        attr = verbs.qp.QPAttr(port_num=ib_port)
        attr.qkey = QKEY
        self.qp = verbs.qp.QP(self.pd, init, attr)
        self.qp.to_rts(attr)
        self.recv_mr = verbs.mr.MR(self.pd, _BUF * _RECVS, e.IBV_ACCESS_LOCAL_WRITE)
        self.send_mr = verbs.mr.MR(self.pd, _BUF, e.IBV_ACCESS_LOCAL_WRITE)
        for slot in range(_RECVS):
            self._post_recv(slot)
        self.cq.req_notify()

    def _gid_index(self, gid: str) -> int:
        want = ipaddress.IPv6Address(gid)
        for index in range(256):
            try:
                found = self.ctx.query_gid(self._ib_port, index)
            except Exception:
                break
            with contextlib.suppress(ValueError):
                if ipaddress.IPv6Address(str(found)) == want:
                    return index
        raise OSError(f"no GID {gid} on this device (is the rail address configured?)")

    def _post_recv(self, slot: int) -> None:
        sge = self._v.wr.SGE(self.recv_mr.buf + slot * _BUF, _BUF, self.recv_mr.lkey)
        self.qp.post_recv(self._v.wr.RecvWR(wr_id=slot, num_sge=1, sg=[sge]))

    def fileno(self) -> int:
        return int(self.channel.fd)

    def send(self, data: bytes, address: str, port: int) -> None:
        v, e = self._v, self._e
        gr = v.addr.GlobalRoute(dgid=v.addr.GID(_mapped(address)), sgid_index=self.sgid_index)
        gr.traffic_class = self._tclass
        gr.flow_label = self.port & 0xFFFFF  # RoCEv2 derives the UDP source port (the ECMP entropy) from it
        ah = v.addr.AH(self.pd, attr=v.addr.AHAttr(gr=gr, is_global=1, port_num=self._ib_port))
        size = min(len(data), _BUF)
        self.send_mr.write(data[:size], size, 0)
        sge = v.wr.SGE(self.send_mr.buf, size, self.send_mr.lkey)
        wr = v.wr.SendWR(wr_id=_RECVS, opcode=e.IBV_WR_SEND, num_sge=1, sg=[sge], send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_ud(ah, self._qpn_of(address, port), QKEY)
        with contextlib.suppress(Exception):  # a full send queue is a lost probe, which is what it counts as
            self.qp.post_send(wr)

    def receive(self) -> tuple[bytes, str, int] | None:
        e = self._e
        while True:
            npolled, wcs = self.cq.poll(num_entries=1)
            if not npolled:
                self.cq.req_notify()
                return None
            wc = wcs[0]
            if wc.opcode != e.IBV_WC_RECV or wc.wr_id >= _RECVS:
                continue  # a send's completion
            slot = int(wc.wr_id)
            raw = bytes(self.recv_mr.read(wc.byte_len, slot * _BUF))
            self._post_recv(slot)
            if wc.status != e.IBV_WC_SUCCESS or len(raw) <= GRH:
                continue
            src = ipaddress.IPv6Address(raw[8:24])  # the GRH's source GID
            mapped = src.ipv4_mapped
            return raw[GRH:], str(mapped) if mapped is not None else str(src), int(wc.src_qp)

    def close(self) -> None:
        for part in (self.qp, self.send_mr, self.recv_mr, self.cq, self.channel, self.pd, self.ctx):
            with contextlib.suppress(Exception):
                part.close()
