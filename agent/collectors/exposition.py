"""What every source's Prometheus translation shares: metric families built at scrape time.

Each source declares its series beside its collector (``gpu_metrics``, ``accel/metrics``,
``rdma_metrics``, ``sonic_metrics``, ``host_metrics``), as one ``ReportMetrics`` function
over its part of the latest report; ``agent.metrics`` only composes them. A family is
created on first use, so a series the hardware does not have never appears, and one name
used as two types is caught at scrape time (an assertion, not a silent overwrite).

Naming follows Prometheus conventions: base units in the name (``_celsius``, ``_watts``,
``_bytes``, ``_hertz``, ``_seconds``, ``_bytes_per_second`` (link rates too: promtool rejects
bits), ``_ratio``), ``_total`` for counters, 0/1 gauges for states. A field the report leaves
unset (the device or driver does not support it) emits no sample at all, never 0.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric

from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

_NAME_BAD = re.compile(r"[^a-z0-9_]+")

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


class Families:
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


class ReportMetrics(Protocol):
    """One source's series: its part of ``report`` (and ``inventory`` for identity) into ``f``.

    ``node`` is the agent's node id, the ``node`` label of every series (a switch agent's
    is the switch). Called at scrape time with the latest report; it reads, never collects.
    """

    def __call__(self, f: Families, node: str, report: tpb.Report, inventory: ipb.Inventory) -> None: ...
