"""The Ascend NPUs' own RoCE ports, through ``hccn_tool``, reported as NIC ports.

On an Ascend 910 server each NPU has a RoCE port inside the chip that the host's
``/sys/class/infiniband`` never shows. This collector asks ``hccn_tool`` about each one and
reports it in the same messages the RDMA collector uses (``NicInfo``, ``NicSample``, LLDP
neighbours), marked ``owner = "ascend-npu"`` and paired with its NPU, so the controller names
it ``node/nic-<npu>``, places it on the fabric from its LLDP peer and judges it with the NIC
rules: the link state as an ACTIVE/DOWN port state, ``-link_stat``'s down count as the
``link_downed`` counter (flaps), the MAC's bad received packets as ``port_rcv_errors``.

Cost: one ``-link -g`` per port every cycle (a port down is news at once); the counters
(``-stat``, ``-link_stat``) every ``counter_interval_s``, the LLDP peer and speed every
``slow_interval_s``; between reads the last values are sent again. A port going down is
also asked its optical module, network health and address, once, for the finding.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from agent.collectors.accel import hccn_parse as parse
from agent.collectors.base import CollectorUnsupported
from starpulse.core import vocab
from starpulse.core.findings import Finding
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

OWNER = "ascend-npu"
SOURCE = "hccn_tool"
TOOL = "hccn_tool"
DEFAULT_PATH = "/usr/local/Ascend/driver/tools/hccn_tool"  # where the Ascend driver installs it
STATE_ACTIVE, STATE_DOWN = 4, 1
PHYS_LINK_UP, PHYS_DISABLED = 5, 3
Run = Callable[[list[str]], str]
NeighbourSource = Callable[[], list[ipb.LldpNeighbor] | None]


def find_hccn_tool() -> str | None:
    """The hccn_tool to run: on PATH, else where the driver installs it; None where there is none."""
    found = shutil.which(TOOL)
    if found is not None:
        return found
    return DEFAULT_PATH if Path(DEFAULT_PATH).is_file() else None


def port_names(device: int) -> tuple[str, str]:
    """(rdma_device, netdev) of NPU ``device``'s port: names no host device has (the NPU calls it ethN)."""
    return f"npu{device}", f"npu{device}-eth{device}"


@dataclass
class _Port:
    """What is kept of one port between cycles."""

    up: bool | None = None
    counters: dict[str, int] = field(default_factory=dict)
    hw_counters: dict[str, int] = field(default_factory=dict)
    counters_at: float | None = None
    rate_gbps: float = 0.0
    peer: ipb.LldpNeighbor | None = None
    slow_at: float | None = None


def _counters(stat: dict[str, int], link: parse.LinkStat) -> dict[str, int]:
    """The NIC rules' counter names from hccn_tool's, where the meaning is the same.

    IB's ``port_*_data`` count 4-byte words, so the MAC's octets are divided by 4; the MAC's
    bad received packets (FCS errors among them) are ``port_rcv_errors``.
    """
    out = {"link_downed": link.downs}
    pairs = (
        ("port_xmit_packets", "mac_tx_total_pkt_num", 1),
        ("port_rcv_packets", "mac_rx_total_pkt_num", 1),
        ("port_xmit_data", "mac_tx_total_oct_num", 4),
        ("port_rcv_data", "mac_rx_total_oct_num", 4),
        ("port_rcv_errors", "mac_rx_bad_pkt_num", 1),
    )
    for ours, theirs, per in pairs:
        if theirs in stat:
            out[ours] = stat[theirs] // per
    return out


class HccnPortCollector:
    """Collector "hccn": each NPU's RoCE port as a NIC port (one per device id ``devices`` gives)."""

    name = "hccn"

    def __init__(
        self,
        run: Run,
        devices: Callable[[], Sequence[int]],
        *,
        tool: str = TOOL,
        counter_interval_s: float = 10.0,
        slow_interval_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._run = run
        self._devices = devices
        self._tool = tool
        self.counter_interval_s = counter_interval_s
        self.slow_interval_s = slow_interval_s
        self._clock = clock
        self._ports: dict[int, _Port] = {}
        self._sent_peers: list[tuple[str, ...]] | None = None
        # The host's own LLDP neighbours (lldpd), so a report's neighbour list stays whole
        # when only one side changed; the factory wires it to the LLDP collector.
        self.host_neighbours: NeighbourSource | None = None

    def _ask(self, device: int, what: str) -> str:
        return self._run([self._tool, "-i", str(device), f"-{what}", "-g"])

    def supported(self) -> bool:
        devices = list(self._devices())
        if not devices:
            return False
        try:
            return parse.parse_link(self._ask(devices[0], "link")) in ("UP", "DOWN")
        except CollectorUnsupported:
            return False

    def describe(self, inventory: ipb.Inventory) -> None:
        for device in self._devices():
            port = self._refresh_slow(device, force=True)
            rdma, netdev = port_names(device)
            inventory.nics.add(
                rdma_device=rdma,
                port=1,
                netdev=netdev,
                link_layer="Ethernet",
                rate_gbps=port.rate_gbps,
                numa_node=-1,
                paired_gpu_index=device,
                owner=OWNER,
            )
        inventory.lldp_neighbors.extend(self._peers())

    def collect(self, report: tpb.Report) -> list[Finding]:
        out: list[Finding] = []
        for device in self._devices():
            try:
                finding = self._sample(device, report)
            except CollectorUnsupported as exc:  # one port's tool call failing must not lose the others
                log.warning("hccn_port_read_failed", device=device, error=str(exc))
                continue
            if finding is not None:
                out.append(finding)
        self._lldp_update(report)
        return out

    def close(self) -> None:
        """Nothing held open between cycles."""

    def _refresh_slow(self, device: int, *, force: bool = False) -> _Port:
        port = self._ports.setdefault(device, _Port())
        now = self._clock()
        if not force and port.slow_at is not None and now - port.slow_at < self.slow_interval_s:
            return port
        port.slow_at = now
        try:
            speed = parse.parse_speed_mbps(self._ask(device, "speed"))
            peer = parse.parse_lldp(self._ask(device, "lldp"))
        except CollectorUnsupported as exc:
            log.warning("hccn_port_read_failed", device=device, error=str(exc))
            return port
        if speed is not None:
            port.rate_gbps = speed / 1000.0
        port.peer = None
        if peer.known:
            port.peer = ipb.LldpNeighbor(
                local_interface=port_names(device)[1],
                chassis_name=peer.system_name,
                chassis_id=peer.chassis_id,
                port_id=peer.port_id,
                port_description=peer.port_description,
                management_address=peer.management_address,
            )
        return port

    def _sample(self, device: int, report: tpb.Report) -> Finding | None:
        port = self._refresh_slow(device)
        link = parse.parse_link(self._ask(device, "link"))
        now = self._clock()
        if port.counters_at is None or now - port.counters_at >= self.counter_interval_s:
            stat = parse.parse_stat(self._ask(device, "stat"))
            port.counters = _counters(stat, parse.parse_link_stat(self._ask(device, "link_stat")))
            port.hw_counters = stat
            port.counters_at = now
        up = link == "UP"
        rdma, netdev = port_names(device)
        sample = report.nics.add(
            rdma_device=rdma,
            port=1,
            netdev=netdev,
            state_code=STATE_ACTIVE if up else STATE_DOWN,
            state="ACTIVE" if up else "DOWN",
            phys_state_code=PHYS_LINK_UP if up else PHYS_DISABLED,
            phys_state="LinkUp" if up else "Disabled",
            rate_gbps=port.rate_gbps if up else 0.0,
            link_layer="Ethernet",
            netdev_operstate="up" if up else "down",
        )
        sample.counters.update(port.counters)
        sample.hw_counters.update(port.hw_counters)
        return self._transition(device, port, up, link)

    def _transition(self, device: int, port: _Port, up: bool, link: str) -> Finding | None:
        before, port.up = port.up, up
        if before == up or (before is None and up):
            return None
        key = f"{port_names(device)[0]}/1"
        attrs = {"device": str(device), "link": link or "unknown", "owner": OWNER}
        if up:
            log.info("hccn_link_up", port=key)
            kind, severity, action, state = "nic_link_up", "info", vocab.ACTION_NONE, "UP again"
        else:
            attrs |= self._diagnose(device)
            log.warning("hccn_link_down", port=key, **attrs)
            kind, severity, action, state = "nic_link_down", "critical", vocab.ACTION_CHECK_LINK, link or "not reported"
            if attrs.get("optical") == "not present":
                state += ", optical module not present"
            elif attrs.get("rx_los", "0x0") != "0x0":
                state += f", no light received (Rx LoS {attrs['rx_los']})"
        return Finding(
            kind=kind,
            component=key,
            severity=severity,
            action=action,
            message=f"NPU {device} RoCE port ({key}) is {state}",
            source=SOURCE,
            attributes=attrs,
            vendor="ascend",
        )

    def _diagnose(self, device: int) -> dict[str, str]:
        """What an operator asks first about a port gone down, asked once at the change: the optical
        module (seated, light received), the network health word, and the port's address (the
        ``deviceIp`` HCCL's errors name)."""
        texts: dict[str, str] = {}
        for what in ("optical", "net_health", "ip"):
            try:
                texts[what] = self._ask(device, what)
            except CollectorUnsupported as exc:  # the finding still goes out, with what was read
                log.info("hccn_diagnose_failed", device=device, error=str(exc))
        optical = parse.parse_optical(texts.get("optical", ""))
        out = {
            "net_health": parse.parse_net_health(texts.get("net_health", "")),
            "ip": parse.parse_ip(texts.get("ip", ""))[0],
        }
        if optical.present is not None:
            out["optical"] = "present" if optical.present else "not present"
        if optical.rx_los is not None:
            out["rx_los"] = f"{optical.rx_los:#x}"
        return {k: v for k, v in out.items() if v}

    def _peers(self) -> list[ipb.LldpNeighbor]:
        return [p.peer for _, p in sorted(self._ports.items()) if p.peer is not None]

    def _lldp_update(self, report: tpb.Report) -> None:
        """Keep the report's neighbour list whole: the host's (lldpd) and the NPU ports' together.

        The controller replaces a node's neighbours with each list it is sent. When lldpd's
        list changed this cycle the LLDP collector has set it, and the NPU ports' are added;
        when only theirs changed, the host's current list is sent with them.
        """
        peers = self._peers()
        keys: list[tuple[str, ...]] = [(p.local_interface, p.chassis_name, p.chassis_id, p.port_id) for p in peers]
        if report.HasField("lldp"):
            report.lldp.neighbors.extend(peers)
        elif keys != self._sent_peers:
            report.lldp.SetInParent()
            host = self.host_neighbours() if self.host_neighbours is not None else None
            report.lldp.neighbors.extend([*(host or []), *peers])
        self._sent_peers = keys
