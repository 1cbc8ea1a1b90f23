"""The controller's Prometheus series, on a registry of its own (one per controller instance)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.reports = Counter("starpulse_reports_received", "Reports received from agents.", registry=r)
        self.samples = Counter(
            "starpulse_samples_received",
            "GPU, NIC and switch-port samples received in reports.",
            ["kind"],
            registry=r,
        )
        self.events = Counter("starpulse_events_received", "Events stored, by kind.", ["kind"], registry=r)
        self.duplicate_events = Counter(
            "starpulse_events_duplicate", "Replayed events already stored (ignored).", registry=r
        )
        self.lost_events = Counter(
            "starpulse_events_lost",
            "Events an agent dropped (buffer overflow) before the controller saw them.",
            registry=r,
        )
        self.rejected = Counter(
            "starpulse_messages_rejected", "Agent messages refused, by reason.", ["reason"], registry=r
        )
        self.streams = Gauge("starpulse_agent_streams", "Open agent streams.", registry=r)
        self.nodes = Gauge("starpulse_nodes", "Known nodes by presence state.", ["state"], registry=r)
        self.ingest_seconds = Histogram(
            "starpulse_ingest_seconds",
            "Time to ingest one agent message (validate, store, notify).",
            buckets=(0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
            registry=r,
        )
        self.incidents_open = Gauge(
            "starpulse_incidents_open", "Open incidents by kind.", ["kind"], registry=r
        )
        self.detection_seconds = Histogram(
            "starpulse_detection_latency_seconds",
            "From an incident's first condition to the incident being opened.",
            buckets=(0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120, 300),
            registry=r,
        )
        self.command_queue = Gauge(
            "starpulse_command_queue_depth", "Commands waiting to be sent to agents.", registry=r
        )
