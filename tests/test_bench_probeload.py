"""bench.scale --probe-results: the probe results appended to a pre-encoded report decode as the
report a full encode would give, one result per planned target (a stray lost probe alone with
its flow's source port), and every other 5 s report carries a 10 s window."""

from __future__ import annotations

from bench.loadgen import REPORT_TAG, carries, encode
from bench.probeload import fabric_for, payloads
from controller.fabric.probeplan import ProbeConfig, plan_mesh
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb


def test_appended_windows_decode_as_the_plans_targets() -> None:
    fabric = fabric_for(64, per_block=16)
    nodes = sorted(fabric.nodes())
    config = ProbeConfig(enabled=True)
    got = payloads(fabric, nodes, draws=2, stray_loss=0.01)
    mesh = plan_mesh(fabric, config, version=1)
    strays = 0
    for node in nodes[:8]:
        plan = mesh.for_node(node, config)
        ports = {(t.local_nic, t.peer_nic): set(t.src_ports) for t in plan.targets}
        template = tpb.Report(nics=[tpb.NicSample(rdma_device="mlx5_0", port=1)]).SerializeToString()
        for window in got[node]:
            msg = spb.AgentMessage.FromString(encode(REPORT_TAG, template + window, 7, 1234))
            report = msg.report
            assert (report.seq, report.timestamp_ms, len(report.nics)) == (7, 1234, 1)
            summed = [r for r in report.probe_results if r.src_port == 0]
            assert {(r.local_nic, r.peer_nic) for r in summed} == set(ports)
            for r in report.probe_results:
                if r.src_port:
                    strays += 1
                    assert r.lost == 1 and r.src_port in ports[(r.local_nic, r.peer_nic)]
                else:
                    assert r.lost == 0 and 0 < r.rtt_p99_us < config.rtt_threshold_us
            sent = {k: 0 for k in ports}
            for r in report.probe_results:
                sent[(r.local_nic, r.peer_nic)] += r.sent
            want = {(t.local_nic, t.peer_nic): round(t.packets_per_s * config.window_s) for t in plan.targets}
            assert sent == want
    assert strays > 0


def test_every_other_five_second_report_carries_a_ten_second_window() -> None:
    assert [carries(seq, 5.0, 10) for seq in range(1, 7)] == [False, True, False, True, False, True]
    assert all(carries(seq, 10.0, 10) for seq in range(1, 4))
