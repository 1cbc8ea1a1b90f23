"""The Ascend NPUs' own RoCE ports: hccn_tool parsers over the fixtures, and the collector through
the fake hccn_tool on PATH (the real ``run_tool``, a real subprocess per call)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.collectors.accel import hccn_parse as parse
from agent.collectors.accel.ascend import AscendNpuCollector, run_tool
from agent.collectors.accel.hccn import OWNER, HccnPortCollector
from agent.factory import build_collectors
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb
from tests.ascend_tools import FAKES, HCCN, AscendTools


def fixture(name: str) -> str:
    return (HCCN / name).read_text()


class TestParsers:
    def test_link_and_net_health(self) -> None:
        assert parse.parse_link(fixture("link.up.txt")) == "UP"
        assert parse.parse_link(fixture("link.down.txt")) == "DOWN"
        assert parse.parse_link("") == ""
        assert parse.parse_net_health(fixture("net_health.success.txt")) == "Success"
        assert parse.parse_net_health(fixture("net_health.fault.txt")) == "Fault"

    def test_ip_and_speed(self) -> None:
        assert parse.parse_ip(fixture("ip.txt")) == ("29.1.112.213", "255.255.0.0")
        assert parse.parse_speed_mbps(fixture("speed.txt")) == 200000
        assert parse.parse_speed_mbps("Speed: Unknown!\n") is None

    def test_stat_counters(self) -> None:
        stat = parse.parse_stat(fixture("stat.txt"))
        assert len(stat) == 30 and "packet statistics" not in stat
        assert (stat["mac_rx_bad_pkt_num"], stat["nic_rx_all_oct_num"], stat["roce_qp_status_err_num"]) == (
            12,
            482237805,
            0,
        )

    def test_link_stat_of_both_drivers(self) -> None:
        old = parse.parse_link_stat(fixture("link_stat.2023.txt"))
        assert (old.up_count, old.down_count, old.downs) == (2, None, 1)  # no down count: one per later up
        assert old.records == [
            ("Tue Jun  6 16:32:12 2023", "UP"),
            ("Tue Jun  6 16:32:10 2023", "DOWN"),
            ("Tue Jun  6 16:31:55 2023", "UP"),
        ]
        new = parse.parse_link_stat(fixture("link_stat.2025.txt"))
        assert (new.up_count, new.down_count, new.downs, len(new.records)) == (2, 1, 1, 3)

    def test_optical(self) -> None:
        seated = parse.parse_optical(fixture("optical.txt"))
        assert (seated.present, seated.tx_power_mw, seated.rx_power_mw, seated.rx_los) == (True, 1.2735, 1.0189, 0)
        assert seated.fields["Temp High Thres"] == "70 C"
        assert parse.parse_optical(fixture("optical.not-present.txt")).present is False

    def test_lldp_peer(self) -> None:
        peer = parse.parse_lldp(fixture("lldp.txt"))
        assert (peer.system_name, peer.port_id, peer.port_description) == (
            "LEAF-B0-R3",
            "400GE1/1/20:2",
            "400GE1/1/20:2",
        )
        assert (peer.chassis_id, peer.management_address, peer.known) == ("70:c7:f2:5a:1b:03", "26.10.4.3", True)
        assert not parse.parse_lldp("").known


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AscendTools:
    made = AscendTools(tmp_path / "ascend", npus=4)
    for key, value in made.env().items():
        monkeypatch.setenv(key, value)
    return made


def ports(tools: AscendTools, **kwargs: float) -> HccnPortCollector:
    return HccnPortCollector(run_tool, lambda: range(tools.npus), counter_interval_s=0, slow_interval_s=0, **kwargs)


class TestCollector:
    def test_inventory_names_each_npu_port_and_its_peer(self, tools: AscendTools) -> None:
        inv = ipb.Inventory()
        ports(tools).describe(inv)
        assert [(n.rdma_device, n.port, n.netdev, n.owner, n.paired_gpu_index) for n in inv.nics] == [
            (f"npu{d}", 1, f"npu{d}-eth{d}", OWNER, d) for d in range(4)
        ]
        assert {n.rate_gbps for n in inv.nics} == {200.0}
        assert [(nb.local_interface, nb.chassis_name, nb.port_id) for nb in inv.lldp_neighbors] == [
            (f"npu{d}-eth{d}", f"leaf-b0-r{d}", "Ethernet0") for d in range(4)
        ]

    def test_samples_carry_state_and_the_nic_rules_counters(self, tools: AscendTools) -> None:
        collector = ports(tools)
        tools.set_link_stat(1, ups=4, downs=3)
        report = tpb.Report()
        assert collector.collect(report) == []  # all up at the first look: nothing changed
        by_port = {s.rdma_device: s for s in report.nics}
        assert {(s.state_code, s.state, s.phys_state, s.netdev_operstate) for s in report.nics} == {
            (4, "ACTIVE", "LinkUp", "up")
        }
        s = by_port["npu1"]
        assert dict(s.counters) == {
            "link_downed": 3,
            "port_xmit_packets": 131072,
            "port_rcv_packets": 6422528,
            "port_xmit_data": 17825792 // 4,
            "port_rcv_data": 482344960 // 4,
            "port_rcv_errors": 12,
        }
        assert s.hw_counters["roce_rx_err_pkt_num"] == 0 and len(s.hw_counters) == 30

    def test_link_down_and_up_are_findings_on_that_port(self, tools: AscendTools) -> None:
        collector = ports(tools)
        collector.collect(tpb.Report())
        tools.set_link(2, False)
        report = tpb.Report()
        (down,) = collector.collect(report)
        assert (down.kind, down.component, down.severity, down.action, down.vendor) == (
            "nic_link_down",
            "npu2/1",
            "critical",
            "check_link",
            "ascend",
        )
        assert down.attributes | {} == {
            "device": "2",
            "link": "DOWN",
            "owner": OWNER,
            "optical": "present",
            "rx_los": "0x0",
            "net_health": "Success",
            "ip": "29.1.112.213",
        }
        state = {s.rdma_device: (s.state_code, s.rate_gbps) for s in report.nics}
        assert state["npu2"] == (1, 0.0) and state["npu1"] == (4, 200.0)
        assert collector.collect(tpb.Report()) == []  # a steady fault is reported once
        tools.set_link(2, True)
        (up,) = collector.collect(tpb.Report())
        assert (up.kind, up.component) == ("nic_link_up", "npu2/1")

    def test_a_port_down_says_what_its_module_sees(self, tools: AscendTools) -> None:
        collector = ports(tools)
        collector.collect(tpb.Report())
        tools.set_file(1, "optical", fixture("optical.not-present.txt"))
        tools.set_file(1, "net_health", fixture("net_health.fault.txt"))
        tools.set_link(1, False)
        (down,) = collector.collect(tpb.Report())
        assert down.message == "NPU 1 RoCE port (npu1/1) is DOWN, optical module not present"
        assert (down.attributes["optical"], down.attributes["net_health"]) == ("not present", "Fault")
        tools.set_file(2, "optical", fixture("optical.txt").replace("Rx Los Flag          : 0x0", "Rx Los Flag : 0xff"))
        (tools.hccn_dir / "ip.txt").unlink()  # a diagnosis read failing still sends the finding
        tools.set_link(2, False)
        (dark,) = collector.collect(tpb.Report())
        assert dark.message == "NPU 2 RoCE port (npu2/1) is DOWN, no light received (Rx LoS 0xff)"

    def test_a_port_already_down_at_start_is_a_finding(self, tools: AscendTools) -> None:
        tools.set_link(0, False)
        (down,) = ports(tools).collect(tpb.Report())
        assert down.component == "npu0/1"

    def test_one_failing_port_does_not_lose_the_others(self, tools: AscendTools) -> None:
        (tools.hccn_dir / "3" / "link.txt").unlink()  # the fake fails as the real tool does: exit 1
        report = tpb.Report()
        ports(tools).collect(report)
        assert sorted(s.rdma_device for s in report.nics) == ["npu0", "npu1", "npu2"]

    def test_lldp_list_stays_whole_with_the_hosts_neighbours(self, tools: AscendTools) -> None:
        """The controller replaces a node's neighbours with each list: the host's and the NPUs' go together."""
        host = ipb.LldpNeighbor(local_interface="enp67s0f5", chassis_name="mgmt-sw", port_id="ge-0/0/1")
        collector = ports(tools)
        collector.host_neighbours = lambda: [host]
        first = tpb.Report()
        collector.collect(first)
        assert [n.local_interface for n in first.lldp.neighbors] == ["enp67s0f5", *(f"npu{d}-eth{d}" for d in range(4))]
        quiet = tpb.Report()
        collector.collect(quiet)
        assert not quiet.HasField("lldp")  # nothing changed: nothing sent
        tools.set_peer(2, "leaf-b1-r2", "Ethernet4")
        moved = tpb.Report()
        collector.collect(moved)
        assert len(moved.lldp.neighbors) == 5 and moved.lldp.neighbors[0] == host
        assert moved.lldp.neighbors[3].chassis_name == "leaf-b1-r2"
        # The host's LLDP collector set the list this cycle: the NPU ports' are added to it.
        lldpd = tpb.Report()
        lldpd.lldp.neighbors.append(host)
        collector.collect(lldpd)
        assert len(lldpd.lldp.neighbors) == 5

    def test_counters_are_read_on_their_interval(self, tools: AscendTools) -> None:
        now = [0.0]
        collector = HccnPortCollector(
            run_tool, lambda: range(1), counter_interval_s=10, slow_interval_s=30, clock=lambda: now[0]
        )
        collector.collect(tpb.Report())
        tools.set_link_stat(0, ups=3, downs=2)
        now[0] = 5.0
        early = tpb.Report()
        collector.collect(early)
        assert early.nics[0].counters["link_downed"] == 0  # the last values, sent again
        now[0] = 10.0
        due = tpb.Report()
        collector.collect(due)
        assert due.nics[0].counters["link_downed"] == 2


class TestBackendWiring:
    def test_the_ascend_backend_runs_the_ports_after_lldp(self, tools: AscendTools) -> None:
        plan = build_collectors("ascend", None, kmsg_path=None, ethtool=False, lldp=False)
        names = [c.name for c in plan.collectors]
        assert names[0] == "gpu" and names[-1] == "hccn"
        gpu = plan.collectors[0]
        assert isinstance(gpu, AscendNpuCollector) and list(gpu.device_ids()) == [0, 1, 2, 3]

    def test_no_hccn_tool_no_ports(self, tools: AscendTools, monkeypatch: pytest.MonkeyPatch) -> None:
        only_npu_smi = tools.root / "bin"
        only_npu_smi.mkdir()
        (only_npu_smi / "npu-smi").symlink_to(FAKES / "npu-smi")
        monkeypatch.setenv("PATH", f"{only_npu_smi}{os.pathsep}/usr/bin:/bin")
        monkeypatch.setattr("agent.collectors.accel.hccn.DEFAULT_PATH", str(tools.root / "absent"))
        plan = build_collectors("ascend", None, kmsg_path=None, ethtool=False, lldp=False)
        assert "hccn" not in [c.name for c in plan.collectors]
