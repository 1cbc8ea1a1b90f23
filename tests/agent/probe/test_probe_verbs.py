"""The RDMA UD probe path behind the prober's seam, against a fake with pyverbs' own names."""

from __future__ import annotations

import time

from agent.probe import wire
from agent.probe.prober import Prober
from agent.probe.verbs import VerbsEndpoint, load_pyverbs
from starpulse.v1 import service_pb2 as spb
from tests.agent import fake_pyverbs as fv


def _fabric() -> None:
    fv.FABRIC.gids.update(
        {
            "mlx5_0": ["fe80::1", "::ffff:10.0.0.1"],  # GID 1: the rail's IPv4-mapped address (RoCEv2)
            "mlx5_1": ["fe80::2", "::ffff:10.0.1.1"],
        }
    )


def test_a_probe_and_its_reply_cross_ud_queue_pairs_in_the_roce_class() -> None:
    _fabric()
    verbs = fv.package()
    a = VerbsEndpoint("10.0.0.1", 50001, 26, device="mlx5_0", verbs=verbs)
    b = VerbsEndpoint("10.0.1.1", 0, 26, device="mlx5_1", verbs=verbs)
    try:
        assert a.sgid_index == 1  # sourced from the rail's own address
        a.send(wire.encode(wire.Probe(wire.REQUEST, 1, 123), 256), "10.0.1.1", b.qp.qp_num)
        got = b.receive()
        assert got is not None
        data, source, src_qp = got
        assert (source, src_qp) == ("10.0.0.1", a.qp.qp_num) and wire.decode(data) == wire.Probe(wire.REQUEST, 1, 123)
        assert len(data) == 256
        b.send(wire.reply_to(data, 7, 9), source, src_qp)  # answered to the GRH's source and src_qp
        back = a.receive()
        assert back is not None and wire.decode(back[0]) == wire.Probe(wire.REPLY, 1, 123, 7, 9)
        assert {s["traffic_class"] for s in fv.FABRIC.sent} == {26 << 2}
        assert fv.FABRIC.sent[0]["flow_label"] == 50001  # the flow's entropy for ECMP
        assert a.receive() is None and b.receive() is None
    finally:
        a.close()
        b.close()


def test_the_prober_runs_over_ud_endpoints() -> None:
    _fabric()
    verbs = fv.package()
    devices = {"10.0.0.1": "mlx5_0", "10.0.1.1": "mlx5_1"}
    responders: dict[str, int] = {}

    def endpoint(address: str, port: int, dscp: int) -> VerbsEndpoint:
        ep = VerbsEndpoint(
            address,
            port,
            dscp,
            device=devices[address],
            verbs=verbs,
            qpn_of=lambda addr, p: responders.get(addr, 0) if p == 4791 else p,
        )
        if port == 4791:
            responders[address] = ep.qp.qp_num  # the responder's QP (learned out of band, here directly)
        return ep

    def plan(me: str, peer: str) -> spb.ProbePlan:
        p = spb.ProbePlan(version=1, port=4791, dscp=26, payload_bytes=512, timeout_ms=300, window_s=1)
        p.listen[me] = me
        p.targets.add(
            local_nic=me, local_address=me, peer_nic=peer, peer_address=peer, src_ports=[1, 2], packets_per_s=50
        )
        return p

    a, b = Prober(endpoints=endpoint), Prober(endpoints=endpoint)
    b.apply(plan("10.0.1.1", "10.0.0.1"))
    b.start()
    time.sleep(0.3)
    a.apply(plan("10.0.0.1", "10.0.1.1"))
    a.start()
    try:
        deadline = time.monotonic() + 10
        results = []
        while time.monotonic() < deadline and sum(r.sent for r in results) < 20:
            results += a.take_results()
            time.sleep(0.1)
        sent = sum(r.sent for r in results)
        assert sent >= 20 and sum(r.lost for r in results) <= sent // 4
    finally:
        a.stop()
        b.stop()


def test_without_rdma_core_there_is_no_verbs_path() -> None:
    assert load_pyverbs() is None  # this machine has no pyverbs; the UDP path is used
