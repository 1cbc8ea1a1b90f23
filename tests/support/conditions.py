"""A compute node, its healthy report and a condition engine on a fake clock, to break one thing in."""

from __future__ import annotations

from collections.abc import Callable

from controller.detect.conditions import ConditionEngine
from controller.detect.model import ConditionChange
from controller.detect.rules import load_rules
from controller.ingest.registry import NodeRecord
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

NODE = "node-003"
RULES = load_rules()
NIC_COUNTERS = (
    "symbol_error",
    "port_rcv_errors",
    "local_link_integrity_errors",
    "link_error_recovery",
    "excessive_buffer_overrun_errors",
    "link_downed",
)
HW_COUNTERS = (
    "out_of_sequence",
    "packet_seq_err",
    "local_ack_timeout_err",
    "rx_icrc_encapsulated",
    "req_transport_retries_exceeded",
)
ETHTOOL = ("rx_prio3_pause", "tx_prio3_pause", "tx_pause_storm_warning_events", "tx_pause_storm_error_events")


def compute_node(node_id: str = NODE, gpus: int = 8) -> NodeRecord:
    return NodeRecord(
        node_id=node_id,
        role=ipb.NODE_ROLE_COMPUTE,
        state="online",
        first_seen_ms=0,
        last_seen_ms=0,
        inventory=inventory(gpus),
    )


def good_report(ts: int, gpus: int = 8, nics: int = 8, links: int = 2) -> tpb.Report:
    """A healthy compute report, counters at zero, ``links`` NVLinks per GPU."""
    r = tpb.Report(seq=1, timestamp_ms=ts)
    r.collectors.add(name="gpu", supported=True, ok=True)
    for i in range(gpus):
        g = r.gpus.add(
            index=i,
            uuid=f"GPU-{i}",
            temperature_c=60,
            remap_pending=False,
            remap_failure=False,
            recovery_action=0,
            clock_event_reasons=0x1 | 0x4,  # idle + SW power cap: normal
        )
        for link in range(links):
            g.nvlinks.add(
                link=link,
                up=True,
                replay_errors=0,
                recovery_errors=0,
                crc_flit_errors=0,
                crc_data_errors=0,
                ecc_data_errors=0,
            )
    for i in range(nics):
        n = r.nics.add(
            rdma_device=f"mlx5_{i}",
            port=1,
            netdev=f"ibp{i}",
            state_code=4,
            state="ACTIVE",
            phys_state_code=5,
            phys_state="LinkUp",
            rate_gbps=400,
            netdev_operstate="up",
        )
        for c in NIC_COUNTERS:
            n.counters[c] = 0
        for c in HW_COUNTERS:
            n.hw_counters[c] = 0
        for c in ETHTOOL:
            n.ethtool_stats[c] = 0
    r.host.memory_total_bytes = 1000
    r.host.memory_available_bytes = 500
    r.host.disks.add(mount="/", total_bytes=1000, used_bytes=100)
    return r


def make_engine(fabric=None) -> tuple[ConditionEngine, FakeClock]:
    clock = FakeClock(1_000_000)
    return ConditionEngine(RULES, fabric=fabric, clock=clock), clock


def opened(changes: list[ConditionChange]) -> list[tuple[str, str]]:
    return [c.condition.key for c in changes if c.kind == "opened"]


def resolved(changes: list[ConditionChange]) -> list[tuple[str, str]]:
    return [c.condition.key for c in changes if c.kind == "resolved"]


def pcie_link(width: int = 16, gen: int = 5, util: float = 95.0) -> Callable[[tpb.Report], None]:
    """Every GPU busy on an x16 Gen5 link (H100 SXM) but GPU 5, which runs at ``width``/``gen``/``util``."""

    def mutate(r: tpb.Report) -> None:
        for g in r.gpus:
            w, n, u = (width, gen, util) if g.index == 5 else (16, 5, 95.0)
            g.pcie_link_width, g.pcie_link_width_max, g.pcie_link_gen, g.pcie_link_gen_max = w, 16, n, 5
            g.utilization_gpu_pct = u

    return mutate


def inventory(gpus: int = 8, nics: int = 8) -> ipb.Inventory:
    inv = ipb.Inventory()
    for i in range(gpus):
        inv.gpus.add(index=i, uuid=f"GPU-{i}", pci_bus_id=f"00000000:{0x17 + i:02X}:00.0", nvlink_count=2)
    for i in range(nics):
        inv.nics.add(
            rdma_device=f"mlx5_{i}",
            port=1,
            netdev=f"ibp{i}",
            rate_gbps=400,
            paired_gpu_index=i,
            pci_address=f"0000:{0x80 + i:02x}:00.0",
        )
    return inv
