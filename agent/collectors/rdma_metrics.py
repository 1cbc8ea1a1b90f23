"""The series of a NIC port's sample, beside the RDMA collector (``rdma``) that reads it.

A port's sample joins the RDMA sysfs counters (``counters/``, ``hw_counters/``), ``ethtool
-S`` (``ethtool``) and the netdev's statistics; each is exported raw as a counter named for
its key, PFC pause counters per direction and priority. Labels: ``node``, ``device``,
``port``, ``netdev``, ``link_layer`` and ``rail`` (the GPU index on the same PCIe switch,
empty when unknown).
"""

from __future__ import annotations

import re

from agent.collectors.exposition import Families, metric_part
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

NIC_LABELS = ("node", "device", "port", "netdev", "link_layer", "rail")

# IB PortCounters port_{rcv,xmit}_data count 32-bit words ("octets divided by 4"), and
# mlx5 keeps that unit for RoCE ports too, so bytes = words * 4 on every link layer.
IB_DATA_WORD_BYTES = 4
_WORD_COUNTERS = frozenset({"port_rcv_data", "port_xmit_data"})

NIC_ACTIVE = 4  # ports/<n>/state "4: ACTIVE"
NIC_PHYS_LINK_UP = 5  # ports/<n>/phys_state "5: LinkUp"

_PAUSE_RE = re.compile(r"^(rx|tx)_prio(\d+)_pause(_duration)?$")


def export(f: Families, node: str, report: tpb.Report, inventory: ipb.Inventory) -> None:
    """Every NIC port of ``report``, named from ``inventory``."""
    nic_info = {(n.rdma_device, n.port): n for n in inventory.nics}
    for nic in report.nics:
        _nic(f, node, nic, nic_info.get((nic.rdma_device, nic.port)))


# Complexity over 15 on purpose: one guarded block per optional NIC field: absent fields emit no series.
def _nic(f: Families, node: str, s: tpb.NicSample, info: ipb.NicInfo | None) -> None:  # noqa: C901
    rail = ""
    if info is not None and info.HasField("paired_gpu_index"):
        rail = str(info.paired_gpu_index)
    link_layer = s.link_layer or (info.link_layer if info else "")
    lv = [node, s.rdma_device, str(s.port), s.netdev, link_layer, rail]
    L = NIC_LABELS
    if info is not None:
        f.info(
            "starpulse_nic",
            "NIC port identity from the inventory (value 1).",
            {
                **dict(zip(L, lv, strict=True)),
                "node_guid": info.node_guid,
                "pci": info.pci_address,
                "hca_type": info.hca_type,
                "fw_version": info.fw_version,
                "board_id": info.board_id,
            },
        )
    if s.state:
        f.gauge(
            "starpulse_nic_up",
            "1 when the port's logical state is ACTIVE.",
            L,
            lv,
            1 if s.state_code == NIC_ACTIVE else 0,
        )
    if s.phys_state:
        f.gauge(
            "starpulse_nic_phys_link_up",
            "1 when the port's physical state is LinkUp.",
            L,
            lv,
            1 if s.phys_state_code == NIC_PHYS_LINK_UP else 0,
        )
    if s.netdev_operstate:
        f.gauge(
            "starpulse_nic_netdev_up",
            "1 when the port's netdev operstate is up.",
            L,
            lv,
            1 if s.netdev_operstate == "up" else 0,
        )
    if s.rate_gbps:
        f.gauge("starpulse_nic_rate_bytes_per_second", "Negotiated link rate.", L, lv, s.rate_gbps * 1e9 / 8)
    seen: set[str] = set()
    for key, value in sorted(s.counters.items()):
        name = f"starpulse_nic_{metric_part(key)}_total"
        seen.add(name)
        unit = " (32-bit words; see the *_bytes_total series)" if key in _WORD_COUNTERS else " (raw)"
        f.counter(name, f"RDMA port counter counters/{key}{unit}.", L, lv, value)
    for key, value in sorted(s.hw_counters.items()):
        name = f"starpulse_nic_{metric_part(key)}_total"
        if name in seen:  # same name in both folders: keep both, the hw one prefixed
            name = f"starpulse_nic_hw_{metric_part(key)}_total"
        f.counter(name, f"RDMA port counter hw_counters/{key} (raw).", L, lv, value)
    if "port_rcv_data" in s.counters:
        f.counter(
            "starpulse_nic_receive_bytes_total",
            "Bytes received on the RDMA port (port_rcv_data * 4).",
            L,
            lv,
            s.counters["port_rcv_data"] * IB_DATA_WORD_BYTES,
        )
    if "port_xmit_data" in s.counters:
        f.counter(
            "starpulse_nic_transmit_bytes_total",
            "Bytes sent on the RDMA port (port_xmit_data * 4).",
            L,
            lv,
            s.counters["port_xmit_data"] * IB_DATA_WORD_BYTES,
        )
    for key, value in sorted(s.ethtool_stats.items()):
        m = _PAUSE_RE.match(key)
        if m is None:
            f.counter(
                f"starpulse_nic_ethtool_{metric_part(key)}_total", f"ethtool -S counter {key} (raw).", L, lv, value
            )
        elif m.group(3):
            f.counter(
                "starpulse_nic_pause_duration_seconds_total",
                "Time the port was paused by PFC, by direction and priority (ethtool *_pause_duration).",
                (*L, "direction", "priority"),
                [*lv, m.group(1), m.group(2)],
                value / 1e6,
            )
        else:
            f.counter(
                "starpulse_nic_pause_frames_total",
                "PFC pause frames, by direction and priority.",
                (*L, "direction", "priority"),
                [*lv, m.group(1), m.group(2)],
                value,
            )
    for key, value in sorted(s.netdev_stats.items()):
        f.counter(
            f"starpulse_nic_netdev_{metric_part(key)}_total",
            f"Netdev statistics/{key} of the port's interface.",
            L,
            lv,
            value,
        )
