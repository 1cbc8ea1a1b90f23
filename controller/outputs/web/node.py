"""One node's page as JSON: what it is (vendor, model), where it stands (presence, lifecycle) and its latest readings.

``GET /api/node/{name}`` reads the registry's latest report for that node: per GPU its
temperatures, power, ECC counters and NVLink state; per NIC port its state, rate and byte
counters. A field the agent did not report (unsupported on that hardware) is ``null``, never
0. A name in the fabric that never reported gets its lifecycle and ``state: unknown``; a name
the controller does not know at all is a 404. Recent events are not repeated here: the page
reads them from ``/api/events?node=``.
"""

from __future__ import annotations

from typing import Any

from controller.ingest.registry import NodeRecord
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

GPU_FIELDS = (
    "temperature_c",
    "memory_temperature_c",
    "power_w",
    "power_limit_w",
    "utilization_gpu_pct",
    "ecc_sbe_volatile",
    "ecc_dbe_volatile",
    "ecc_sbe_aggregate",
    "ecc_dbe_aggregate",
    "remapped_rows_uncorrectable",
    "pcie_replay_count",
)
NIC_BYTE_COUNTERS = ("rx_bytes", "tx_bytes")


def _present(msg: Any, name: str) -> Any:
    """The optional field's value, or None when the agent left it out (unsupported)."""
    return getattr(msg, name) if msg.HasField(name) else None


def gpu_json(info: ipb.GpuInfo | None, sample: tpb.GpuSample | None, index: int) -> dict[str, Any]:
    """One GPU: inventory facts beside the latest sample's readings."""
    out: dict[str, Any] = {
        "index": index,
        "vendor": (info.vendor or "nvidia") if info is not None else "",
        "model": info.model if info is not None else "",
        "uuid": (info.uuid if info is not None else "") or (sample.uuid if sample is not None else ""),
        "pci_bus_id": info.pci_bus_id if info is not None else "",
    }
    for name in GPU_FIELDS:
        out[name] = _present(sample, name) if sample is not None else None
    links = list(sample.nvlinks) if sample is not None else []
    out["nvlink_up"] = sum(1 for link in links if link.up)
    out["nvlink_total"] = len(links) or (info.link_count or info.nvlink_count if info is not None else 0)
    out["nvlink_down"] = sorted(link.link for link in links if not link.up)
    out["lost"] = bool(sample.lost) if sample is not None else False
    return out


def nic_json(sample: tpb.NicSample) -> dict[str, Any]:
    """One NIC port: link state, negotiated rate, byte counters (cumulative, as sysfs counts them)."""
    stats = dict(sample.netdev_stats)
    return {
        "device": f"{sample.rdma_device}/{sample.port}",
        "netdev": sample.netdev,
        "link_layer": sample.link_layer,
        "state": sample.state,
        "phys_state": sample.phys_state,
        "rate_gbps": sample.rate_gbps,
        **{name: stats.get(name) for name in NIC_BYTE_COUNTERS},
    }


def node_json(
    name: str,
    rec: NodeRecord | None,
    life: dict[str, Any],
    spare: bool,
    now_ms: int,
) -> dict[str, Any]:
    """The node page's data; ``life`` is :func:`controller.outputs.web.api.lifecycle_json`'s."""
    out: dict[str, Any] = {"name": name, "spare": spare, "now_ms": now_ms, **life}
    if rec is None:
        return {
            **out,
            "state": "unknown",
            "last_seen_ms": None,
            "hostname": "",
            "agent_version": "",
            "gpus": [],
            "nics": [],
        }
    report = rec.latest_report
    infos = {g.index: g for g in rec.inventory.gpus}
    samples = {g.index: g for g in report.gpus} if report is not None else {}
    nics = [nic_json(n) for n in report.nics] if report is not None else []
    return {
        **out,
        "state": rec.state,
        "last_seen_ms": rec.last_seen_ms,
        "hostname": rec.hostname,
        "agent_version": rec.agent_version,
        "report_ms": report.timestamp_ms if report is not None else None,
        # The agent's clock minus ours when past the registry's limit (None: in step).
        "clock_skew_s": round(rec.clock_skew_ms / 1000, 1) if rec.clock_skew_ms else None,
        # Streams for this node replaced by another claimant (not its own reconnects): an imposter.
        "stream_takeovers": rec.takeovers,
        "gpus": [gpu_json(infos.get(i), samples.get(i), i) for i in sorted(set(infos) | set(samples))],
        "nics": nics,
    }
