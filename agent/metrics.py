"""The agent's Prometheus exposition, built from its latest Report at scrape time.

The agent already reads everything once per cycle into a Report; this collector only
translates that report when Prometheus asks, so metrics cost nothing per cycle and can
never disagree with what the controller receives. Naming follows Prometheus conventions:
base units in the name (``_celsius``, ``_watts``, ``_bytes``, ``_hertz``, ``_seconds``,
``_bytes_per_second`` (link rates too: promtool rejects bits), ``_ratio``), ``_total`` for
counters, 0/1 gauges for states.

A field the report leaves unset (the device or driver does not support it) emits no
sample at all, never 0: an absent series and a healthy zero must stay distinguishable.

Counters and resets: the values are the hardware's raw cumulative counters. Some reset
(volatile ECC counts on driver reload, NIC counters on driver restart); Prometheus's
``rate()``/``increase()`` treat any decrease as a counter reset, which is exactly right,
so they are exposed as counters (``*_total``). Current-state counts that only grow until
repaired (remapped rows, retired pages) are gauges.

Labels: every series carries ``node`` (the agent's node id; for switch ports, the
switch). GPUs add ``gpu`` (index), ``uuid`` and ``pci`` (their ``starpulse_gpu_info`` adds
``vendor`` and ``model``: join on it to select a vendor's chips); NIC ports add ``device``,
``port``, ``netdev``, ``link_layer`` and ``rail`` (the GPU index on the same PCIe switch,
empty when unknown); switch ports add ``port``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from starpulse import __version__
from starpulse.core import vocab
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

GPU_LABELS = ("node", "gpu", "uuid", "pci")
NIC_LABELS = ("node", "device", "port", "netdev", "link_layer", "rail")
SWITCH_LABELS = ("node", "port")

# nvmlClocksEventReason* bits (nvml.h), labelled as nvidia-smi names them.
CLOCK_EVENT_REASONS: dict[str, int] = {r.label: r.bit for r in vocab.CLOCK_EVENT_REASONS["nvidia"]}

# IB PortCounters port_{rcv,xmit}_data count 32-bit words ("octets divided by 4"), and
# mlx5 keeps that unit for RoCE ports too, so bytes = words * 4 on every link layer.
IB_DATA_WORD_BYTES = 4
_WORD_COUNTERS = frozenset({"port_rcv_data", "port_xmit_data"})

NIC_ACTIVE = 4  # ports/<n>/state "4: ACTIVE"
NIC_PHYS_LINK_UP = 5  # ports/<n>/phys_state "5: LinkUp"

_PAUSE_RE = re.compile(r"^(rx|tx)_prio(\d+)_pause(_duration)?$")
_NAME_BAD = re.compile(r"[^a-z0-9_]+")

# SONiC SAI_PORT_STAT_* counters with a better Prometheus name; PFC counters are
# exported per priority (below) instead of one series each.
SAI_RENAMES = {
    "SAI_PORT_STAT_IF_IN_OCTETS": "starpulse_switch_port_receive_bytes_total",
    "SAI_PORT_STAT_IF_OUT_OCTETS": "starpulse_switch_port_transmit_bytes_total",
}
_SAI_PFC_RE = re.compile(r"^SAI_PORT_STAT_PFC_\d+_(RX|TX)_PKTS$")
STORMED = "stormed"


# Hardware counter names that would break Prometheus naming lints (units must be base
# units: a count of corrected bits is not a size in bits).
NAME_RENAMES = {"rx_corrected_bits_phy": "rx_corrected_bit_errors_phy"}
_NON_BASE_TOKENS = {"bits": "bit_count"}


def metric_part(name: str) -> str:
    """A counter/stat name as a snake_case metric name fragment ('VL15_dropped' -> 'vl15_dropped')."""
    part = NAME_RENAMES.get(name, name)
    part = _NAME_BAD.sub("_", part.lower()).strip("_")
    part = "_".join(_NON_BASE_TOKENS.get(t, t) for t in part.split("_") if t)
    part = part.removesuffix("_total")
    return part or "unnamed"


@dataclass
class AgentStatus:
    """The agent's view of itself at scrape time (not in the Report: it is about the agent)."""

    events_buffered: int | None = None
    events_dropped_total: int = 0
    events_emitted_total: int = 0
    reports_sent_total: int = 0
    cycles_total: int = 0
    connected: bool = False


class _Families:
    """Metric families created on first use, in first-use order, so only families with samples appear."""

    def __init__(self) -> None:
        self._families: dict[str, Metric] = {}

    def gauge(self, name: str, doc: str, labels: Iterable[str], values: Iterable[str], value: float) -> None:
        fam = self._families.get(name)
        if fam is None:
            fam = self._families[name] = GaugeMetricFamily(name, doc, labels=list(labels))
        assert isinstance(fam, GaugeMetricFamily)
        fam.add_metric(list(values), float(value))

    def counter(self, name: str, doc: str, labels: Iterable[str], values: Iterable[str], value: float) -> None:
        fam = self._families.get(name)
        if fam is None:
            fam = self._families[name] = CounterMetricFamily(name, doc, labels=list(labels))
        assert isinstance(fam, CounterMetricFamily)
        fam.add_metric(list(values), float(value))

    def info(self, name: str, doc: str, labels: dict[str, str]) -> None:
        fam = self._families.get(name)
        if fam is None:
            fam = self._families[name] = InfoMetricFamily(name, doc, labels=[])
        assert isinstance(fam, InfoMetricFamily)
        fam.add_metric([], labels)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families.values())


class AgentMetricsCollector(Collector):
    """A prometheus_client custom collector over the agent's latest report and inventory."""

    def __init__(
        self,
        node_id: str,
        get_inventory: Callable[[], ipb.Inventory],
        get_report: Callable[[], tpb.Report | None],
        get_status: Callable[[], AgentStatus] | None = None,
    ) -> None:
        self.node_id = node_id
        self._get_inventory = get_inventory
        self._get_report = get_report
        self._get_status = get_status

    def describe(self) -> list[Metric]:
        # Families depend on the hardware present; an empty describe() tells the registry
        # not to call collect() at registration time.
        return []

    def collect(self) -> Iterator[Metric]:
        fams = _Families()
        inventory = self._get_inventory()
        report = self._get_report()
        self._agent(fams, inventory)
        if report is not None:
            self._report_meta(fams, report)
            if report.HasField("accelerator_check"):
                self._accelerators(fams, report.accelerator_check)
            gpu_info = {g.index: g for g in inventory.gpus}
            for gpu in report.gpus:
                self._gpu(fams, gpu, gpu_info.get(gpu.index))
            nic_info = {(n.rdma_device, n.port): n for n in inventory.nics}
            for nic in report.nics:
                self._nic(fams, nic, nic_info.get((nic.rdma_device, nic.port)))
            for sp in report.switch_ports:
                self._switch_port(fams, sp)
            if report.HasField("host"):
                self._host(fams, report.host)
        yield from fams

    # -- the agent itself ------------------------------------------------------------------

    def _accelerators(self, f: _Families, check: tpb.AcceleratorCheck) -> None:
        """Issue 30: whether this cycle read the accelerators (a node not judged is never healthy)."""
        labels, values = ("node", "backend", "tool"), [self.node_id, check.backend, check.tool]
        f.gauge(
            "starpulse_agent_accelerators_judged",
            "1 when the accelerator backend read every expected chip this cycle; 0: not judged (tool missing, "
            "failing or unparseable; fewer chips than expected)",
            labels,
            values,
            1 if check.judged else 0,
        )
        f.gauge(
            "starpulse_agent_accelerators_found",
            "Accelerators the backend's tool answered for.",
            labels,
            values,
            check.found,
        )
        if check.HasField("expected"):
            f.gauge(
                "starpulse_agent_accelerators_expected",
                "Accelerators this node is expected to have (settings, or learned at first sight).",
                labels,
                values,
                check.expected,
            )

    def _agent(self, f: _Families, inventory: ipb.Inventory) -> None:
        node = self.node_id
        f.info(
            "starpulse_agent_build",
            "Agent version and host facts (value 1).",
            {
                "node": node,
                "version": __version__,
                "kernel": inventory.host.kernel,
                "driver_version": inventory.host.driver_version,
            },
        )
        if self._get_status is None:
            return
        st = self._get_status()
        labels = ("node",)
        f.gauge(
            "starpulse_agent_connected",
            "1 while the agent has a stream open to a controller.",
            labels,
            [node],
            1 if st.connected else 0,
        )
        if st.events_buffered is not None:
            f.gauge(
                "starpulse_agent_events_buffered",
                "Events in the on-disk buffer not yet acknowledged.",
                labels,
                [node],
                st.events_buffered,
            )
        f.counter(
            "starpulse_agent_events_dropped_total",
            "Events dropped because the on-disk buffer was full (lost to the controller).",
            labels,
            [node],
            st.events_dropped_total,
        )
        f.counter(
            "starpulse_agent_events_emitted_total",
            "Events the agent produced since it started.",
            labels,
            [node],
            st.events_emitted_total,
        )
        f.counter(
            "starpulse_agent_reports_sent_total",
            "Reports written to a controller stream since start.",
            labels,
            [node],
            st.reports_sent_total,
        )
        f.counter(
            "starpulse_agent_cycles_total", "Collection cycles completed since start.", labels, [node], st.cycles_total
        )

    def _report_meta(self, f: _Families, report: tpb.Report) -> None:
        node = self.node_id
        f.gauge(
            "starpulse_agent_last_report_timestamp_seconds",
            "Wall-clock time of the latest collection cycle (unix seconds).",
            ("node",),
            [node],
            report.timestamp_ms / 1000,
        )
        for c in report.collectors:
            labels = ("node", "collector")
            values = [node, c.name]
            f.gauge(
                "starpulse_agent_collector_supported",
                "1 when the collector can run on this node (hardware and driver present).",
                labels,
                values,
                1 if c.supported else 0,
            )
            if not c.supported:
                continue
            f.gauge(
                "starpulse_agent_collector_ok",
                "1 when the collector's latest cycle succeeded.",
                labels,
                values,
                1 if c.ok else 0,
            )
            f.gauge(
                "starpulse_agent_collector_duration_seconds",
                "Time the collector's latest cycle took.",
                labels,
                values,
                c.duration_s,
            )

    # -- GPUs ------------------------------------------------------------------------------

    def _gpu(self, f: _Families, s: tpb.GpuSample, info: ipb.GpuInfo | None) -> None:
        lv = [self.node_id, str(s.index), s.uuid or (info.uuid if info else ""), info.pci_bus_id if info else ""]
        L = GPU_LABELS

        def opt(field: str, name: str, doc: str, scale: float = 1.0) -> None:
            if s.HasField(field):
                f.gauge(name, doc, L, lv, float(getattr(s, field)) * scale)

        def opt_counter(field: str, name: str, doc: str) -> None:
            if s.HasField(field):
                f.counter(name, doc, L, lv, float(getattr(s, field)))

        if info is not None:
            f.info(
                "starpulse_gpu",
                "GPU identity from the inventory (value 1).",
                {
                    "node": lv[0],
                    "gpu": lv[1],
                    "uuid": lv[2],
                    "pci": lv[3],
                    "vendor": info.vendor or "nvidia",  # agents before issue 21 describe NVIDIA GPUs only
                    "model": info.model,
                    "serial": info.serial,
                    "vbios_version": info.vbios_version,
                },
            )
        opt("temperature_c", "starpulse_gpu_temperature_celsius", "GPU core temperature.")
        opt("memory_temperature_c", "starpulse_gpu_memory_temperature_celsius", "GPU memory (HBM) temperature.")
        opt("power_w", "starpulse_gpu_power_watts", "GPU power draw.")
        opt("power_limit_w", "starpulse_gpu_power_limit_watts", "GPU enforced power limit.")
        opt(
            "utilization_gpu_pct",
            "starpulse_gpu_utilization_ratio",
            "Fraction of the last sample period a kernel was running (0-1).",
            0.01,
        )
        opt(
            "utilization_memory_pct",
            "starpulse_gpu_memory_utilization_ratio",
            "Fraction of the last sample period device memory was read or written (0-1).",
            0.01,
        )
        opt("memory_used_bytes", "starpulse_gpu_memory_used_bytes", "Device memory in use.")
        opt("memory_total_bytes", "starpulse_gpu_memory_total_bytes", "Device memory installed.")
        opt("sm_clock_mhz", "starpulse_gpu_sm_clock_hertz", "Current SM clock.", 1e6)
        opt("memory_clock_mhz", "starpulse_gpu_memory_clock_hertz", "Current memory clock.", 1e6)
        opt("performance_state", "starpulse_gpu_performance_state", "Current P-state (0 = maximum performance).")
        if s.HasField("clock_event_reasons"):
            for reason, bit in CLOCK_EVENT_REASONS.items():
                f.gauge(
                    "starpulse_gpu_clock_event_reason",
                    "1 while NVML reports this clocks-event (throttle) reason active.",
                    (*L, "reason"),
                    [*lv, reason],
                    1 if s.clock_event_reasons & bit else 0,
                )
        # ECC counts: volatile resets on driver reload, aggregate persists in the InfoROM;
        # both are counters (rate()/increase() handle the reload reset).
        self._gpu_neutral(f, s, lv)
        opt_counter(
            "ecc_sbe_volatile",
            "starpulse_gpu_ecc_sbe_volatile_total",
            "Corrected (single-bit) ECC errors since the driver loaded.",
        )
        opt_counter(
            "ecc_dbe_volatile",
            "starpulse_gpu_ecc_dbe_volatile_total",
            "Uncorrected (double-bit) ECC errors since the driver loaded.",
        )
        opt_counter(
            "ecc_sbe_aggregate",
            "starpulse_gpu_ecc_sbe_aggregate_total",
            "Corrected (single-bit) ECC errors over the GPU's lifetime.",
        )
        opt_counter(
            "ecc_dbe_aggregate",
            "starpulse_gpu_ecc_dbe_aggregate_total",
            "Uncorrected (double-bit) ECC errors over the GPU's lifetime.",
        )
        for field, kind in (
            ("remapped_rows_correctable", "correctable"),
            ("remapped_rows_uncorrectable", "uncorrectable"),
        ):
            if s.HasField(field):
                f.gauge(
                    "starpulse_gpu_remapped_rows",
                    "Memory rows remapped, by the error class that caused it.",
                    (*L, "cause"),
                    [*lv, kind],
                    getattr(s, field),
                )
        opt("remap_pending", "starpulse_gpu_row_remap_pending", "1 when a row remap waits for a GPU reset.")
        opt("remap_failure", "starpulse_gpu_row_remap_failure", "1 when a row remap failed (GPU needs service).")
        for field, kind in (("retired_pages_sbe", "sbe"), ("retired_pages_dbe", "dbe")):
            if s.HasField(field):
                f.gauge(
                    "starpulse_gpu_retired_pages",
                    "Memory pages retired (pre-Ampere page retirement), by cause.",
                    (*L, "cause"),
                    [*lv, kind],
                    getattr(s, field),
                )
        opt(
            "retired_pages_pending", "starpulse_gpu_retired_pages_pending", "1 when page retirement waits for a reboot."
        )
        opt_counter("pcie_replay_count", "starpulse_gpu_pcie_replay_total", "PCIe replays (link-level retransmits).")
        for link in s.nvlinks:
            llv = [*lv, str(link.link)]
            f.gauge(
                "starpulse_gpu_nvlink_up", "1 when the NVLink link is active.", (*L, "link"), llv, 1 if link.up else 0
            )
            for field in vocab.NVLINK_ERROR_COUNTERS:
                if link.HasField(field):
                    f.counter(
                        "starpulse_gpu_nvlink_errors_total",
                        "NVLink error counters, by link and type.",
                        (*L, "link", "type"),
                        [*llv, field.removesuffix("_errors")],
                        getattr(link, field),
                    )
        opt(
            "recovery_action",
            "starpulse_gpu_recovery_action",
            "NVML recommended recovery action (0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset).",
        )
        f.gauge(
            "starpulse_gpu_lost", "1 when NVML says the GPU is lost (fallen off the bus).", L, lv, 1 if s.lost else 0
        )
        f.gauge(
            "starpulse_gpu_reset_required",
            "1 when NVML says the GPU requires a reset.",
            L,
            lv,
            1 if s.reset_required else 0,
        )

    # -- NIC ports -------------------------------------------------------------------------

    # Complexity over 15 on purpose: one guarded block per optional NIC field: absent fields emit no series.
    def _gpu_neutral(self, f: _Families, s: tpb.GpuSample, lv: list[str]) -> None:
        """Any vendor's memory errors, interconnect links and thermal flag (issue 21's neutral fields)."""
        L = GPU_LABELS
        if s.HasField("memory_errors_correctable"):
            f.counter(
                "starpulse_gpu_memory_errors_correctable_total",
                "Corrected memory errors, any vendor (AMD: RAS total).",
                L,
                lv,
                float(s.memory_errors_correctable),
            )
        if s.HasField("memory_errors_uncorrectable"):
            f.counter(
                "starpulse_gpu_memory_errors_uncorrectable_total",
                "Uncorrectable memory errors, any vendor (AMD: RAS total).",
                L,
                lv,
                float(s.memory_errors_uncorrectable),
            )
        if s.HasField("links_down"):
            doc = "Interconnect links down (AMD XGMI, Ascend HCCS)."
            f.gauge("starpulse_gpu_interconnect_links_down", doc, L, lv, float(s.links_down))
        if s.HasField("thermal_slowdown"):
            doc = "1 while the chip slows itself for heat (any vendor)."
            f.gauge("starpulse_gpu_thermal_slowdown", doc, L, lv, float(s.thermal_slowdown))
        for block in s.ras_blocks:
            f.counter(
                "starpulse_gpu_ras_uncorrectable_errors_total",
                "Uncorrectable errors per RAS block (AMD: UMC is the HBM, XGMI_WAFL the links).",
                (*L, "block"),
                (*lv, block.block),
                float(block.uncorrectable),
            )

    def _nic(self, f: _Families, s: tpb.NicSample, info: ipb.NicInfo | None) -> None:  # noqa: C901
        rail = ""
        if info is not None and info.HasField("paired_gpu_index"):
            rail = str(info.paired_gpu_index)
        link_layer = s.link_layer or (info.link_layer if info else "")
        lv = [self.node_id, s.rdma_device, str(s.port), s.netdev, link_layer, rail]
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

    # -- switch ports ----------------------------------------------------------------------

    def _switch_port(self, f: _Families, s: tpb.SwitchPortSample) -> None:
        lv = [self.node_id, s.port]
        L = SWITCH_LABELS
        if s.oper_status:
            f.gauge(
                "starpulse_switch_port_oper_up",
                "1 when the port's oper status is up.",
                L,
                lv,
                1 if s.oper_status == "up" else 0,
            )
        if s.admin_status:
            f.gauge(
                "starpulse_switch_port_admin_up",
                "1 when the port is admin up.",
                L,
                lv,
                1 if s.admin_status == "up" else 0,
            )
        if s.speed_mbps:
            f.gauge(
                "starpulse_switch_port_speed_bytes_per_second", "Configured port speed.", L, lv, s.speed_mbps * 1e6 / 8
            )
        for key, value in sorted(s.counters.items()):
            if _SAI_PFC_RE.match(key):
                continue
            name = (
                SAI_RENAMES.get(key) or f"starpulse_switch_port_{metric_part(key.removeprefix('SAI_PORT_STAT_'))}_total"
            )
            f.counter(name, f"SONiC port counter {key} (raw).", L, lv, value)
        for direction, values in (("rx", s.pfc_rx), ("tx", s.pfc_tx)):
            for prio, value in enumerate(values):
                f.counter(
                    "starpulse_switch_port_pfc_frames_total",
                    "PFC frames, by direction and priority.",
                    (*L, "direction", "priority"),
                    [*lv, direction, str(prio)],
                    value,
                )
        if s.pfc_wd_status:
            f.gauge(
                "starpulse_switch_port_pfc_watchdog_stormed_queues",
                "Queues the PFC watchdog currently reports as stormed.",
                L,
                lv,
                sum(1 for st in s.pfc_wd_status if st == STORMED),
            )
            f.counter(
                "starpulse_switch_port_pfc_watchdog_deadlocks_total",
                "PFC watchdog deadlocks detected, summed over the port's queues.",
                L,
                lv,
                s.pfc_wd_deadlocks,
            )
        f.counter(
            "starpulse_switch_port_queue_dropped_packets_total",
            "Packets dropped, summed over the port's queues.",
            L,
            lv,
            s.queue_drops,
        )
        f.counter(
            "starpulse_switch_port_ecn_marked_packets_total",
            "Packets ECN-marked by WRED, summed over the port's queues.",
            L,
            lv,
            s.ecn_marked,
        )
        if s.HasField("optic_temperature_c"):
            f.gauge(
                "starpulse_switch_port_optic_temperature_celsius",
                "Transceiver temperature (DOM).",
                L,
                lv,
                s.optic_temperature_c,
            )
        # Lanes are numbered from 1 as SONiC's rx1power..rx8power are.
        for direction, powers in (("rx", s.optic_rx_power_dbm), ("tx", s.optic_tx_power_dbm)):
            for lane, power in enumerate(powers, start=1):
                f.gauge(
                    f"starpulse_switch_port_optic_{direction}_power_dbm",
                    f"Transceiver {direction.upper()} optical power per lane (DOM), in dBm.",
                    (*L, "lane"),
                    [*lv, str(lane)],
                    power,
                )
        for field, name, doc in (
            (
                "optic_temp_high_alarm_c",
                "starpulse_switch_port_optic_temperature_high_alarm_celsius",
                "Transceiver high-temperature alarm threshold.",
            ),
            (
                "optic_temp_low_alarm_c",
                "starpulse_switch_port_optic_temperature_low_alarm_celsius",
                "Transceiver low-temperature alarm threshold.",
            ),
            (
                "optic_rx_power_high_alarm_dbm",
                "starpulse_switch_port_optic_rx_power_high_alarm_dbm",
                "Transceiver RX power high alarm threshold, in dBm.",
            ),
            (
                "optic_rx_power_low_alarm_dbm",
                "starpulse_switch_port_optic_rx_power_low_alarm_dbm",
                "Transceiver RX power low alarm threshold, in dBm.",
            ),
            (
                "optic_tx_power_high_alarm_dbm",
                "starpulse_switch_port_optic_tx_power_high_alarm_dbm",
                "Transceiver TX power high alarm threshold, in dBm.",
            ),
            (
                "optic_tx_power_low_alarm_dbm",
                "starpulse_switch_port_optic_tx_power_low_alarm_dbm",
                "Transceiver TX power low alarm threshold, in dBm.",
            ),
        ):
            if s.HasField(field):
                f.gauge(name, doc, L, lv, getattr(s, field))

    # -- host ------------------------------------------------------------------------------

    def _host(self, f: _Families, h: tpb.HostSample) -> None:
        L = ("node",)
        lv = [self.node_id]
        f.gauge(
            "starpulse_host_cpu_utilization_ratio",
            "CPU busy fraction over the last cycle (0-1).",
            L,
            lv,
            h.cpu_percent / 100,
        )
        f.gauge("starpulse_host_memory_total_bytes", "Physical memory installed.", L, lv, h.memory_total_bytes)
        f.gauge(
            "starpulse_host_memory_available_bytes", "Memory available for new work.", L, lv, h.memory_available_bytes
        )
        f.gauge("starpulse_host_load1", "1-minute load average.", L, lv, h.load1)
        f.gauge("starpulse_host_load5", "5-minute load average.", L, lv, h.load5)
        f.gauge("starpulse_host_load15", "15-minute load average.", L, lv, h.load15)
        f.gauge("starpulse_host_uptime_seconds", "Time since boot.", L, lv, h.uptime_s)
        for d in h.disks:
            f.gauge(
                "starpulse_host_disk_total_bytes",
                "Size of the filesystem at the mount.",
                (*L, "mount"),
                [*lv, d.mount],
                d.total_bytes,
            )
            f.gauge(
                "starpulse_host_disk_used_bytes",
                "Bytes used on the filesystem at the mount.",
                (*L, "mount"),
                [*lv, d.mount],
                d.used_bytes,
            )
