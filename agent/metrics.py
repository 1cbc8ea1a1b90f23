"""The agent's Prometheus exposition: the sources' series composed over the latest Report.

The agent already reads everything once per cycle into a Report; this collector only
translates that report when Prometheus asks, so metrics cost nothing per cycle and can
never disagree with what the controller receives. Each source declares its own series
beside its collector (``agent.collectors.*_metrics``, one ``ReportMetrics`` each, listed in
``REPORT_METRICS``); what is declared here is the agent's own (build, stream, buffer, the
collectors' health). Naming and the absent-never-0 rule: ``agent.collectors.exposition``.

Counters and resets: the values are the hardware's raw cumulative counters. Some reset
(volatile ECC counts on driver reload, NIC counters on driver restart); Prometheus's
``rate()``/``increase()`` treat any decrease as a counter reset, which is exactly right,
so they are exposed as counters (``*_total``).

Labels: every series carries ``node`` (the agent's node id; for switch ports, the switch);
each source's module names the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from agent.collectors import gpu_metrics, host_metrics, rdma_metrics, sonic_metrics
from agent.collectors.exposition import Families, ReportMetrics
from starpulse import __version__
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

# Each source's series, in the order they appear in the exposition. A new source adds one line.
REPORT_METRICS: tuple[ReportMetrics, ...] = (
    gpu_metrics.export,  # every accelerator backend's GPUs (NVML fields, and accel.metrics' neutral ones)
    rdma_metrics.export,  # NIC ports: RDMA sysfs, ethtool -S, netdev statistics
    sonic_metrics.export,  # switch ports
    host_metrics.export,  # the host's load, memory, disks
)


@dataclass
class AgentStatus:
    """The agent's view of itself at scrape time (not in the Report: it is about the agent)."""

    events_buffered: int | None = None
    events_dropped_total: int = 0
    events_emitted_total: int = 0
    reports_sent_total: int = 0
    cycles_total: int = 0
    connected: bool = False
    streams_replaced_total: int = 0  # ended by the controller: another stream took this node over
    streams_silent_total: int = 0  # ended here: the controller answered nothing within its limit


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
        fams = Families()
        inventory = self._get_inventory()
        report = self._get_report()
        self._agent(fams, inventory)
        if report is not None:
            self._report_meta(fams, report)
            for source in REPORT_METRICS:
                source(fams, self.node_id, report, inventory)
        yield from fams

    # -- the agent itself ------------------------------------------------------------------

    def _agent(self, f: Families, inventory: ipb.Inventory) -> None:
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
        f.counter(
            "starpulse_agent_streams_replaced_total",
            "Streams the controller ended because another client took this node's stream over (security).",
            labels,
            [node],
            st.streams_replaced_total,
        )
        f.counter(
            "starpulse_agent_streams_silent_total",
            "Streams this agent ended because the controller answered nothing within its silence limit.",
            labels,
            [node],
            st.streams_silent_total,
        )

    def _report_meta(self, f: Families, report: tpb.Report) -> None:
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
