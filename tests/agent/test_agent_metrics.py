"""The agent's Prometheus exposition, from real collection cycles on simulated hardware.

The exposition builders here are also what the dashboard and rule drift checks in
tests/e2e/test_prometheus.py compare against, so they cover every series family.
"""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import pytest

from agent.collectors.exposition import metric_part
from agent.collectors.gpu import NvmlGpuCollector
from agent.factory import build_agent
from agent.metrics import AgentStatus
from agent.runtime import AgentConfig, CollectorSet
from agent.sim.fake_nvml import FakeNvml
from agent.sim.node import SimNode
from starpulse.core.metrics_http import split_listen
from starpulse.v1 import inventory_pb2 as ipb
from tests.helpers import free_port, wait_for
from tests.support.metrics import (
    Cycle,
    agent_expositions,
    exposition,
    find,
    one,
    promtool_check,
    samples,
    sim_cycle,
    switch_cycle,
)


@pytest.fixture(scope="module")
def compute(tmp_path_factory: pytest.TempPathFactory) -> tuple[Cycle, str]:
    cycle = sim_cycle(
        tmp_path_factory.mktemp("agent-metrics"),
        faults=(("gpu_lost", "gpu-3", {}), ("gpu_nvlink_down", "gpu-2", {"link": 5})),
    )
    status = AgentStatus(events_buffered=7, events_dropped_total=2, reports_sent_total=11, cycles_total=12)
    return cycle, exposition("node-000", cycle.inventory, cycle.report, status)


class TestGpuSeries:
    def test_power_in_watts_with_identity_labels(self, compute: tuple[Cycle, str]) -> None:
        cycle, text = compute
        g0 = cycle.report.gpus[0]
        pci = cycle.inventory.gpus[0].pci_bus_id
        assert pci and g0.uuid
        assert one(text, "starpulse_gpu_power_watts", gpu="0", uuid=g0.uuid, pci=pci, node="node-000") == pytest.approx(
            g0.power_w
        )
        assert one(text, "starpulse_gpu_power_limit_watts", gpu="0") == pytest.approx(g0.power_limit_w)

    def test_units_are_base_units(self, compute: tuple[Cycle, str]) -> None:
        cycle, text = compute
        g0 = cycle.report.gpus[0]
        assert one(text, "starpulse_gpu_utilization_ratio", gpu="0") == pytest.approx(g0.utilization_gpu_pct / 100)
        assert one(text, "starpulse_gpu_sm_clock_hertz", gpu="0") == pytest.approx(g0.sm_clock_mhz * 1e6)
        assert one(text, "starpulse_gpu_temperature_celsius", gpu="0") == pytest.approx(g0.temperature_c)
        assert one(text, "starpulse_gpu_memory_total_bytes", gpu="0") == g0.memory_total_bytes

    def test_states_and_faults(self, compute: tuple[Cycle, str]) -> None:
        _, text = compute
        assert one(text, "starpulse_gpu_lost", gpu="3") == 1
        assert one(text, "starpulse_gpu_lost", gpu="0") == 0
        assert one(text, "starpulse_gpu_nvlink_up", gpu="2", link="5") == 0
        assert one(text, "starpulse_gpu_nvlink_up", gpu="2", link="4") == 1
        assert one(text, "starpulse_gpu_nvlink_errors_total", gpu="0", link="0", type="crc_flit") == 0
        assert one(text, "starpulse_gpu_clock_event_reason", gpu="0", reason="hw_thermal_slowdown") == 0
        assert one(text, "starpulse_gpu_ecc_dbe_volatile_total", gpu="0") == 0
        assert one(text, "starpulse_gpu_remapped_rows", gpu="0", cause="uncorrectable") == 0

    def test_pcie_link_width_and_generation_now_and_at_most(self, tmp_path: Path) -> None:
        """A link trained at x8 Gen4 shows against its x16 Gen5 maximum; the other GPUs at their maximum."""
        cycle = sim_cycle(tmp_path, faults=(("gpu_pcie_degraded", "gpu-1", {"width": 8, "gen": 4}),))
        text = exposition("node-000", cycle.inventory, cycle.report, None)
        assert one(text, "starpulse_gpu_pcie_link_width", gpu="1") == 8
        assert one(text, "starpulse_gpu_pcie_link_width_max", gpu="1") == 16
        assert one(text, "starpulse_gpu_pcie_link_generation", gpu="1") == 4
        assert one(text, "starpulse_gpu_pcie_link_generation_max", gpu="1") == 5
        assert one(text, "starpulse_gpu_pcie_link_width", gpu="0") == 16
        assert one(text, "starpulse_gpu_pcie_link_generation", gpu="0") == 5
        assert len(find(text, "starpulse_gpu_pcie_link_width_max")) == len(cycle.report.gpus)

    def test_pcie_link_unsupported_emits_no_sample(self) -> None:
        """A driver without the current-width call: no width series, the generation still there."""
        nvml = FakeNvml(gpu_count=2, unsupported={"nvmlDeviceGetCurrPcieLinkWidth"})
        cs = CollectorSet([NvmlGpuCollector(nvml)])
        cs.probe()
        inventory = cs.describe()
        report = cs.collect(1).report
        cs.close()
        text = exposition("n", inventory, report, None)
        assert find(text, "starpulse_gpu_pcie_link_width") == []
        assert len(find(text, "starpulse_gpu_pcie_link_generation")) == 2

    def test_unsupported_field_emits_no_sample(self) -> None:
        """NVML says NOT_SUPPORTED for power: no power series at all, never a 0."""
        cs = CollectorSet([NvmlGpuCollector(FakeNvml(gpu_count=2, unsupported={"nvmlDeviceGetPowerUsage"}))])
        cs.probe()
        inventory = cs.describe()
        report = cs.collect(1).report
        cs.close()
        assert not report.gpus[0].HasField("power_w")
        text = exposition("n", inventory, report, None)
        assert find(text, "starpulse_gpu_power_watts") == []
        assert len(find(text, "starpulse_gpu_temperature_celsius")) == 2

    def test_no_report_yet_only_identity(self) -> None:
        text = exposition("n", ipb.Inventory(), None, AgentStatus())
        names = {s.name for s in samples(text)}
        assert "starpulse_agent_build_info" in names
        assert not any(n.startswith("starpulse_gpu_") for n in names)


class TestNicSeries:
    def test_port_labels_state_and_rail(self, compute: tuple[Cycle, str]) -> None:
        cycle, text = compute
        nic = cycle.report.nics[0]
        info = next(n for n in cycle.inventory.nics if n.rdma_device == nic.rdma_device)
        assert info.HasField("paired_gpu_index")
        labels = {"device": nic.rdma_device, "port": str(nic.port), "netdev": nic.netdev}
        assert one(text, "starpulse_nic_up", rail=str(info.paired_gpu_index), link_layer=nic.link_layer, **labels) == 1
        assert one(text, "starpulse_nic_phys_link_up", **labels) == 1
        assert one(text, "starpulse_nic_rate_bytes_per_second", **labels) == pytest.approx(nic.rate_gbps * 1e9 / 8)

    def test_counters_raw_and_data_words_as_bytes(self, compute: tuple[Cycle, str]) -> None:
        cycle, text = compute
        nic = cycle.report.nics[0]
        dev = {"device": nic.rdma_device}
        assert one(text, "starpulse_nic_port_rcv_data_total", **dev) == nic.counters["port_rcv_data"]
        assert one(text, "starpulse_nic_receive_bytes_total", **dev) == nic.counters["port_rcv_data"] * 4
        assert one(text, "starpulse_nic_transmit_bytes_total", **dev) == nic.counters["port_xmit_data"] * 4
        assert one(text, "starpulse_nic_vl15_dropped_total", **dev) == nic.counters["VL15_dropped"]
        assert one(text, "starpulse_nic_out_of_sequence_total", **dev) == nic.hw_counters["out_of_sequence"]
        assert one(text, "starpulse_nic_netdev_rx_bytes_total", **dev) == nic.netdev_stats["rx_bytes"]

    def test_pause_frames_per_priority(self, compute: tuple[Cycle, str]) -> None:
        cycle, text = compute
        nic = cycle.report.nics[0]
        dev = {"device": nic.rdma_device}
        assert (
            one(text, "starpulse_nic_pause_frames_total", direction="rx", priority="3", **dev)
            == (nic.ethtool_stats["rx_prio3_pause"])
        )
        assert one(text, "starpulse_nic_pause_duration_seconds_total", direction="tx", priority="3", **dev) == (
            pytest.approx(nic.ethtool_stats["tx_prio3_pause_duration"] / 1e6)
        )
        assert len(find(text, "starpulse_nic_pause_frames_total", **dev)) == 16
        assert find(text, "starpulse_nic_ethtool_rx_prio3_pause_total") == []
        assert (
            one(text, "starpulse_nic_ethtool_rx_corrected_bit_errors_phy_total", **dev)
            == (nic.ethtool_stats["rx_corrected_bits_phy"])
        )


class TestHostAndSelf:
    def test_host(self, compute: tuple[Cycle, str]) -> None:
        cycle, text = compute
        host = cycle.report.host
        assert one(text, "starpulse_host_cpu_utilization_ratio") == pytest.approx(host.cpu_percent / 100)
        assert one(text, "starpulse_host_memory_total_bytes") == host.memory_total_bytes
        assert one(text, "starpulse_host_load15") == pytest.approx(host.load15)
        assert one(text, "starpulse_host_disk_total_bytes", mount=host.disks[0].mount) == host.disks[0].total_bytes

    def test_agent_self(self, compute: tuple[Cycle, str]) -> None:
        _, text = compute
        assert one(text, "starpulse_agent_events_buffered") == 7
        assert one(text, "starpulse_agent_events_dropped_total") == 2
        assert one(text, "starpulse_agent_reports_sent_total") == 11
        assert one(text, "starpulse_agent_connected") == 0
        assert one(text, "starpulse_agent_collector_ok", collector="gpu") == 1
        assert one(text, "starpulse_agent_collector_duration_seconds", collector="nic") >= 0


class TestSwitchSeries:
    def test_switch_ports(self) -> None:
        fake, cycle = switch_cycle()
        text = exposition("leaf-b0-r0", cycle.inventory, cycle.report, None)
        sw = {"node": "leaf-b0-r0"}
        assert one(text, "starpulse_switch_port_oper_up", port="Ethernet0", **sw) == 0
        assert one(text, "starpulse_switch_port_admin_up", port="Ethernet0", **sw) == 1
        assert one(text, "starpulse_switch_port_oper_up", port="Ethernet4", **sw) == 1
        assert one(text, "starpulse_switch_port_speed_bytes_per_second", port="Ethernet4") == fake.speed_mbps * 1e6 / 8
        assert one(text, "starpulse_switch_port_pfc_watchdog_stormed_queues", port="Ethernet4") == 1
        assert one(text, "starpulse_switch_port_pfc_watchdog_stormed_queues", port="Ethernet12") == 0
        assert len(find(text, "starpulse_switch_port_pfc_frames_total", port="Ethernet4")) == 16
        rx = one(text, "starpulse_switch_port_optic_rx_power_dbm", port="Ethernet8", lane="1")
        low = one(text, "starpulse_switch_port_optic_rx_power_low_alarm_dbm", port="Ethernet8")
        assert rx < low
        assert one(text, "starpulse_switch_port_optic_rx_power_dbm", port="Ethernet12", lane="1") > low
        ports = {p.port: p for p in cycle.report.switch_ports}
        assert (
            one(text, "starpulse_switch_port_receive_bytes_total", port="Ethernet12")
            == (ports["Ethernet12"].counters["SAI_PORT_STAT_IF_IN_OCTETS"])
        )
        assert (
            one(text, "starpulse_switch_port_if_in_errors_total", port="Ethernet12")
            == (ports["Ethernet12"].counters["SAI_PORT_STAT_IF_IN_ERRORS"])
        )
        assert find(text, "starpulse_switch_port_pfc_0_rx_pkts_total") == []


class TestPromtool:
    def test_agent_exposition_passes_promtool(self, tmp_path: Path) -> None:
        for text in agent_expositions(tmp_path):
            promtool_check(text)


def test_metric_part() -> None:
    assert metric_part("VL15_dropped") == "vl15_dropped"
    assert metric_part("rx_corrected_bits_phy") == "rx_corrected_bit_errors_phy"
    assert metric_part("weird-name.total") == "weird_name"
    assert split_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert split_listen(":9464") == ("0.0.0.0", 9464)
    with pytest.raises(ValueError):
        split_listen("nope")


async def test_agent_serves_metrics_while_running(tmp_path: Path) -> None:
    """Agent.run with metrics_listen serves the latest cycle over HTTP and closes it on stop."""
    port = free_port()
    sim = SimNode("node-009", tmp_path / "hw", seed=1)
    agent = build_agent(
        AgentConfig(
            node_id="node-009",
            controllers=[f"127.0.0.1:{free_port()}"],  # nothing listens: the agent stays disconnected
            interval_s=0.2,
            buffer_path=str(tmp_path / "buffer.db"),
            metrics_listen=f"127.0.0.1:{port}",
        ),
        "sim",
        sim=sim,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    url = f"http://127.0.0.1:{port}/metrics"

    def fetch() -> str:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return str(resp.read().decode())

    try:
        await wait_for(lambda: agent.latest_report is not None and agent.metrics_port == port, what="first cycle")
        text = await asyncio.to_thread(fetch)
        assert len(find(text, "starpulse_gpu_power_watts", node="node-009")) == 8
        assert one(text, "starpulse_agent_connected", node="node-009") == 0
        assert one(text, "starpulse_agent_cycles_total") >= 1
        assert not any(s.name.startswith("python_") for s in samples(text))  # its own registry
    finally:
        stop.set()
        await task
    with pytest.raises(OSError):
        await asyncio.to_thread(fetch)


class TestAcceleratorCheck:
    """Issue 30: the agent's own /metrics say whether this cycle read the accelerators."""

    @pytest.mark.parametrize(("found", "judged"), [(8, 1), (7, 0), (0, 0)])
    def test_judged_found_and_expected(self, found: int, judged: int) -> None:
        from agent.collectors.accel.check import AcceleratorChecker, Expected, check_report
        from starpulse.v1 import telemetry_pb2 as tpb

        report = tpb.Report(seq=1)
        report.collectors.add(name="gpu", supported=True, ok=True)
        for i in range(found):
            report.gpus.add(index=i)
        check_report(AcceleratorChecker("ascend", "ascend", "npu-smi", Expected(8)), report)
        text = exposition("node-000", ipb.Inventory(), report, None)
        labels = {"backend": "ascend", "tool": "npu-smi"}
        assert one(text, "starpulse_agent_accelerators_judged", **labels) == judged
        assert one(text, "starpulse_agent_accelerators_found", **labels) == found
        assert one(text, "starpulse_agent_accelerators_expected", **labels) == 8
        promtool_check(text)
