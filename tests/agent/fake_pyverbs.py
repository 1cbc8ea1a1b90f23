"""A fake of rdma-core's pyverbs with its own names, wired as one in-memory RoCE fabric.

Only what agent.probe.verbs uses: device.Context(name).query_gid, pd.PD, cq.CompChannel (.fd),
cq.CQ(...).poll/req_notify, qp.QPCap/QPInitAttr/QPAttr/QP(.to_rts, post_recv, post_send,
qp_num), mr.MR(.buf, lkey, write, read), wr.SGE/RecvWR/SendWR(.set_wr_ud), addr.GID/
GlobalRoute/AHAttr/AH, and the enums. A send lands in the receive buffer of the QP with that
number on the device whose GID table holds the destination GID, behind a 40-byte GRH.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import os
from collections import deque
from types import SimpleNamespace
from typing import Any

enums = SimpleNamespace(
    IBV_QPT_UD=4,
    IBV_WR_SEND=2,
    IBV_SEND_SIGNALED=2,
    IBV_WC_SUCCESS=0,
    IBV_WC_RECV=128,
    IBV_WC_SEND=0,
    IBV_ACCESS_LOCAL_WRITE=1,
)


class Fabric:
    def __init__(self) -> None:
        self.gids: dict[str, list[str]] = {}  # device -> GID table
        self.qps: dict[int, Any] = {}
        self.numbers = itertools.count(0x100)
        self.sent: list[dict[str, Any]] = []  # what went on the wire (traffic class, flow label)


FABRIC = Fabric()


class GID:
    def __init__(self, val: str) -> None:
        self.gid = str(ipaddress.IPv6Address(val))

    def __str__(self) -> str:
        return self.gid


class Context:
    def __init__(self, name: str) -> None:
        if name not in FABRIC.gids:
            raise OSError(f"no device {name}")
        self.name = name

    def query_gid(self, port_num: int, index: int) -> GID:
        table = FABRIC.gids[self.name]
        if index >= len(table):
            raise OSError("no such GID index")
        return GID(table[index])

    def close(self) -> None: ...


class PD:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def close(self) -> None: ...


class CompChannel:
    def __init__(self, ctx: Context) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        self.fd = self._r

    def notify(self) -> None:
        os.write(self._w, b"x")

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._r, 4096)

    def close(self) -> None:
        os.close(self._r)
        os.close(self._w)


class CQ:
    def __init__(self, ctx: Context, cqe: int, cq_context: Any, channel: CompChannel, comp_vector: int) -> None:
        self.channel = channel
        self.wcs: deque[Any] = deque()

    def poll(self, num_entries: int = 1) -> tuple[int, list[Any]]:
        if not self.wcs:
            return 0, []
        return 1, [self.wcs.popleft()]

    def req_notify(self, solicited_only: bool = False) -> None:
        self.channel.drain()
        if self.wcs:
            self.channel.notify()

    def close(self) -> None: ...


class QPCap:
    def __init__(self, **kw: int) -> None:
        self.__dict__.update(kw)


class QPInitAttr:
    def __init__(self, qp_type: int, scq: CQ, rcq: CQ, cap: QPCap) -> None:
        self.qp_type, self.scq, self.rcq, self.cap = qp_type, scq, rcq, cap


class QPAttr:
    def __init__(self, port_num: int = 1) -> None:
        self.port_num = port_num
        self.qkey = 0


class QP:
    def __init__(self, pd: PD, init: QPInitAttr, attr: QPAttr) -> None:
        assert init.qp_type == enums.IBV_QPT_UD
        self.pd, self.cq, self.qkey = pd, init.rcq, attr.qkey
        self.qp_num = next(FABRIC.numbers)
        self.recvs: deque[Any] = deque()
        self.state = "init"
        FABRIC.qps[self.qp_num] = self

    def to_rts(self, attr: QPAttr) -> None:
        self.state = "rts"

    def post_recv(self, wr: Any) -> None:
        self.recvs.append(wr)

    def post_send(self, wr: Any) -> None:
        assert self.state == "rts"
        ah, rqpn, qkey = wr.ud
        gr = ah.attr.gr
        src = FABRIC.gids[self.pd.ctx.name][gr.sgid_index]
        data = bytes(wr.sg[0].mr_bytes[: wr.sg[0].length])
        FABRIC.sent.append({"traffic_class": gr.traffic_class, "flow_label": gr.flow_label, "dgid": str(gr.dgid)})
        self.cq.wcs.append(SimpleNamespace(opcode=enums.IBV_WC_SEND, wr_id=wr.wr_id, status=0, byte_len=0, src_qp=0))
        peer = FABRIC.qps.get(rqpn)
        table = {ipaddress.IPv6Address(g) for g in FABRIC.gids[peer.pd.ctx.name]} if peer is not None else set()
        if peer is None or qkey != peer.qkey or ipaddress.IPv6Address(str(gr.dgid)) not in table or not peer.recvs:
            return  # dropped, as the wire would
        recv = peer.recvs.popleft()
        grh = bytes(8) + ipaddress.IPv6Address(src).packed + ipaddress.IPv6Address(str(gr.dgid)).packed
        recv.sg[0].mr_write(grh + data)
        peer.cq.wcs.append(
            SimpleNamespace(
                opcode=enums.IBV_WC_RECV, wr_id=recv.wr_id, status=0, byte_len=len(grh) + len(data), src_qp=self.qp_num
            )
        )
        peer.cq.channel.notify()

    def close(self) -> None:
        FABRIC.qps.pop(self.qp_num, None)


class MR:
    _next = itertools.count(1 << 20, 1 << 20)

    def __init__(self, pd: PD, length: int, access: int) -> None:
        self.mem = bytearray(length)
        self.buf = next(MR._next)  # an address
        self.lkey = self.buf >> 20

    def write(self, data: bytes, length: int, offset: int = 0) -> None:
        self.mem[offset : offset + length] = data[:length]

    def read(self, length: int, offset: int) -> bytes:
        return bytes(self.mem[offset : offset + length])

    def close(self) -> None: ...


class SGE:
    def __init__(self, addr: int, length: int, lkey: int) -> None:
        self.addr, self.length, self.lkey = addr, length, lkey

    def _mr(self) -> tuple[MR, int]:
        for mr in _LIVE:
            if mr.buf <= self.addr < mr.buf + len(mr.mem):
                return mr, self.addr - mr.buf
        raise KeyError("address not in a registered MR")

    @property
    def mr_bytes(self) -> bytes:
        mr, off = self._mr()
        return bytes(mr.mem[off : off + self.length])

    def mr_write(self, data: bytes) -> None:
        mr, off = self._mr()
        mr.mem[off : off + len(data)] = data


_LIVE: list[MR] = []
_orig_init = MR.__init__


def _tracked_init(self: MR, pd: PD, length: int, access: int) -> None:
    _orig_init(self, pd, length, access)
    _LIVE.append(self)


MR.__init__ = _tracked_init  # type: ignore[method-assign]


class RecvWR:
    def __init__(self, wr_id: int, num_sge: int, sg: list[SGE]) -> None:
        self.wr_id, self.num_sge, self.sg = wr_id, num_sge, sg


class SendWR:
    def __init__(self, wr_id: int, opcode: int, num_sge: int, sg: list[SGE], send_flags: int) -> None:
        self.wr_id, self.opcode, self.num_sge, self.sg, self.send_flags = wr_id, opcode, num_sge, sg, send_flags
        self.ud: tuple[Any, int, int] | None = None

    def set_wr_ud(self, ah: Any, rqpn: int, rqkey: int) -> None:
        self.ud = (ah, rqpn, rqkey)


class GlobalRoute:
    def __init__(self, dgid: GID, sgid_index: int) -> None:
        self.dgid, self.sgid_index = dgid, sgid_index
        self.traffic_class = 0
        self.flow_label = 0


class AHAttr:
    def __init__(self, gr: GlobalRoute, is_global: int, port_num: int) -> None:
        self.gr, self.is_global, self.port_num = gr, is_global, port_num


class AH:
    def __init__(self, pd: PD, attr: AHAttr) -> None:
        self.pd, self.attr = pd, attr


def package() -> SimpleNamespace:
    """The fake, shaped like the pyverbs package after its submodules are imported."""
    return SimpleNamespace(
        enums=enums,
        device=SimpleNamespace(Context=Context),
        pd=SimpleNamespace(PD=PD),
        cq=SimpleNamespace(CQ=CQ, CompChannel=CompChannel),
        qp=SimpleNamespace(QPCap=QPCap, QPInitAttr=QPInitAttr, QPAttr=QPAttr, QP=QP),
        mr=SimpleNamespace(MR=MR),
        wr=SimpleNamespace(SGE=SGE, RecvWR=RecvWR, SendWR=SendWR),
        addr=SimpleNamespace(GID=GID, GlobalRoute=GlobalRoute, AHAttr=AHAttr, AH=AH),
    )
