"""The relay's /metrics: is it connected upstream, how many agents, how much it batches.

A collector reads the relay's own counters at scrape time (nothing is updated per
message). Served like the agent's: prometheus_client's threaded server on a registry of
its own, so no process or GC defaults are mixed in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from relay.upstream import Upstream


class RelayCollector(Collector):
    """The relay's figures: its upstream link, and callables for the streams it holds."""

    def __init__(
        self, relay_id: str, upstream: Upstream, agent_streams: Callable[[], int], refused: Callable[[], int]
    ) -> None:
        self.relay_id = relay_id
        self.upstream = upstream
        self.agent_streams = agent_streams
        self.refused = refused

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        up = self.upstream
        rid = [self.relay_id]
        yield _gauge(
            "starpulse_relay_upstream_connected",
            "1 while the controller accepts this relay.",
            rid,
            1.0 if up.ready.is_set() else 0.0,
        )
        yield _gauge(
            "starpulse_relay_agent_streams",
            "Agents' streams open through this relay.",
            rid,
            float(self.agent_streams()),
        )
        yield _gauge(
            "starpulse_relay_pending_up_bytes",
            "Agents' messages waiting to go up to the controller.",
            rid,
            float(up.pending_bytes),
        )
        yield _counter(
            "starpulse_relay_messages_up", "Agents' messages carried to the controller.", rid, float(up.messages_sent)
        )
        yield _counter(
            "starpulse_relay_batches_up",
            "Batches sent to the controller (messages/batches = batching).",
            rid,
            float(up.batches_sent),
        )
        yield _counter(
            "starpulse_relay_upstream_connects", "Times the controller accepted this relay.", rid, float(up.generation)
        )
        yield _counter(
            "starpulse_relay_agents_refused",
            "Agents' streams refused while no controller was reachable.",
            rid,
            float(self.refused()),
        )


def _gauge(name: str, doc: str, relay_id: list[str], value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=["relay"])
    g.add_metric(relay_id, value)
    return g


def _counter(name: str, doc: str, relay_id: list[str], value: float) -> CounterMetricFamily:
    c = CounterMetricFamily(name, doc, labels=["relay"])
    c.add_metric(relay_id, value)
    return c
