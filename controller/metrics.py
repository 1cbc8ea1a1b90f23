"""The controller's Prometheus series, on a registry of its own (one per controller instance).

Ingest rate is the reports counter: ``rate(starpulse_reports_received_total[1m])`` is
reports per second, ``rate(starpulse_samples_received_total[1m])`` samples per second by
kind. Series for work still landing elsewhere (evictions and their breaker for
self-healing, the alert outbox and notifications for alerting) are defined here so
dashboards and rules can rely on them now; the owners update them through the
attributes below (``set_outbox_depth_source`` for a callback-driven depth).
"""

from __future__ import annotations

import functools
import math
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import accumulate

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from starpulse.core.vocab import EVICTABLE_KINDS

BREAKERS = ("eviction",)


class StageCpu:
    """CPU seconds of one thread by stage of the per-report path, so that a regression names itself.

    Measured with ``time.thread_time`` (this thread's CPU, not wall time: other processes on the
    machine do not count) around a whole batch, never around one report: a read costs ~1-2 us,
    which per report would be ~1 % of what the controller spends on it. The stages are named
    by where they are measured (controller.ingest.relayed, controller.detect.shards,
    controller.core's sweep, a detection shard's loop); what the event loop's thread spends
    outside them is asyncio, gRPC's reads into Python and the HTTP endpoints.
    """

    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def since(self, stage: str, started: float) -> float:
        """Charge ``stage`` with this thread's CPU since ``started`` (a ``thread_time()``); returns now."""
        now = time.thread_time()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + (now - started)
        return now


class LoopHistogram(Collector):
    """A histogram without labels whose ``observe`` is one C-level bisect and two additions.

    Why: prometheus_client's ``Histogram.observe`` walks its buckets in Python under a lock,
    3-9 us a call measured, and the controller observes two histograms per report (processing
    and report age): ~5 % of its main process at 10,000 nodes (issue 31). Observed and
    scraped on the controller's event loop only (aiohttp serves /metrics there), so it takes
    no lock. The exposition is the same series (``_bucket{le}``, ``_sum``, ``_count``)
    without ``_created``; a value on a bound falls in that bound's bucket, as there.
    """

    def __init__(self, name: str, documentation: str, buckets: Iterable[float], registry: CollectorRegistry) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = tuple(sorted(float(b) for b in buckets if b != float("inf")))
        self._les = [*map(floatToGoString, self._bounds), "+Inf"]
        self._counts = [0] * (len(self._bounds) + 1)  # the last: above every bound
        self._sum = 0.0
        registry.register(self)

    def observe(self, amount: float) -> None:
        self._counts[bisect_left(self._bounds, amount)] += 1
        self._sum += amount

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._documentation)
        family.add_metric([], buckets=list(zip(self._les, accumulate(self._counts), strict=True)), sum_value=self._sum)
        yield family


class _StageCpuCollector(Collector):
    """``starpulse_stage_cpu_seconds_total{process,stage}`` at scrape time, from the controller's
    own StageCpu and the totals its detection shards last sent."""

    def __init__(self, main: StageCpu, shards: dict[int, dict[str, float]]) -> None:
        self._main = main
        self._shards = shards

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "starpulse_stage_cpu_seconds",
            "CPU seconds by stage of the report path: the controller's event loop thread (process=main) "
            "and each detection shard (process=shard-N); see controller.metrics.StageCpu.",
            labels=["process", "stage"],
        )
        for stage, seconds in sorted(self._main.seconds.items()):
            family.add_metric(["main", stage], seconds)
        for index, stages in sorted(self._shards.items()):
            for stage, seconds in sorted(stages.items()):
                family.add_metric([f"shard-{index}", stage], seconds)
        yield family


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.reports = Counter("starpulse_reports_received", "Reports received from agents.", registry=r)
        # CPU by stage of the report path (StageCpu): the event loop's, and each shard's last totals
        self.stage_cpu = StageCpu()
        self.shard_stage_cpu: dict[int, dict[str, float]] = {}
        r.register(_StageCpuCollector(self.stage_cpu, self.shard_stage_cpu))
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
        self.clock_skewed = Gauge(
            "starpulse_agents_clock_skewed",
            "Nodes whose latest agent timestamp is more than 5 min from the controller's clock.",
            registry=r,
        )
        # Security-relevant: "foreign" is a second claimant of a node's identity (issue 32).
        self.stream_takeovers = Counter(
            "starpulse_agent_stream_takeovers",
            "Agent streams replaced by a newer stream for the same node: reconnect (the agent's own) or foreign.",
            ["kind"],
            registry=r,
        )
        self.lag = Gauge(
            "starpulse_controller_lag_seconds",
            "How late the last heartbeat sweep ran: the controller's own lag (a node is not called down for it).",
            registry=r,
        )
        self.probe_results = Counter(
            "starpulse_probe_results",
            "Probe results (one flow or one target's clean flows, one window) received.",
            registry=r,
        )
        self.probe_loss = Gauge(
            "starpulse_probe_loss_ratio",
            "Loss share through each component the probe localisation names (issue 29), by its kind.",
            ["component", "kind"],
            registry=r,
        )
        self.probe_background_loss = Gauge(
            "starpulse_probe_background_loss_ratio",
            "Loss share over every probe of the localisation window: the fabric's background, which a "
            "component's loss must stand out from before it is blamed (issue 29).",
            registry=r,
        )
        self.probe_mesh_targets = Gauge(
            "starpulse_probe_mesh_targets", "Probe targets in the current mesh plan, all nodes together.", registry=r
        )
        self.relays = Gauge("starpulse_relays_connected", "Relays streaming agents' messages in.", registry=r)
        self.shards_running = Gauge(
            "starpulse_detect_shards", "Detection shard processes running (controller --detect-workers).", registry=r
        )
        self.shard_in_flight = Gauge(
            "starpulse_detect_shard_reports_in_flight",
            "Reports handed to detection shards and not decided yet (near the limit: shards are behind).",
            registry=r,
        )
        self.nodes = Gauge("starpulse_nodes", "Known nodes by presence state.", ["state"], registry=r)
        self.not_judged = Gauge(
            "starpulse_nodes_not_judged",
            "Nodes whose accelerators were not read (tool missing, failing or unparseable; fewer than expected): "
            "never healthy, never a spare.",
            registry=r,
        )
        self.spares = Gauge(
            "starpulse_spares",
            "Hot spares by state: available (free, healthy, in service), allocated (standing in), unavailable.",
            ["state"],
            registry=r,
        )
        self.spare_target = Gauge(
            "starpulse_spare_pool_target",
            "Available spares the policy keeps (repair.spare_share of the fleet, or repair.spare_target).",
            registry=r,
        )
        self.node_lifecycle = Gauge(
            "starpulse_node_lifecycle",
            "Compute nodes by repair lifecycle state (in_service ... spare, retired).",
            ["state"],
            registry=r,
        )
        self.ingest_seconds = LoopHistogram(
            "starpulse_ingest_seconds",
            "Time to ingest one agent message (validate, store, notify).",
            buckets=(0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
            registry=r,
        )
        # A report's decision: validated, recorded, and detection's verdict on it committed
        # (condition changes handed to the correlator); ingest_seconds is the processing
        # share of it. Report acks go out after it (at most every report_ack_interval_s).
        self.report_age_seconds = LoopHistogram(
            "starpulse_report_age_at_decision_seconds",
            "From a report's timestamp (agent clock) to detection's decision on it: the agent's "
            "collection, transit, queueing in the controller and processing. Agent clock skew shifts it.",
            buckets=(
                0.001,
                0.002,
                0.003,
                0.005,
                0.0075,
                0.01,
                0.015,
                0.02,
                0.03,
                0.05,
                0.075,
                0.1,
                0.15,
                0.25,
                0.5,
                1.0,
                2.5,
                5.0,
                10.0,
            ),
            registry=r,
        )
        self.incidents_open = Gauge("starpulse_incidents_open", "Open incidents by kind.", ["kind"], registry=r)
        self.job_hangs_open = Gauge(
            "starpulse_job_hangs_open", "Jobs judged hung now (steps stopped past their bound).", registry=r
        )
        self.job_hangs_total = Counter(
            "starpulse_job_hangs_total",
            "Hangs detected, by shape (stalled: every rank; diverged: some) and source (job_library, gpu_signature).",
            ["shape", "source"],
            registry=r,
        )
        self.job_hang_culprit_seconds = Histogram(
            "starpulse_job_hang_stacks_seconds",
            "Seconds from a hang's incident to its ranks' stacks grouped (who stalled it named, or not).",
            buckets=(0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        # The fleet report's headline figures over the last 30 days (docs/reliability.md), computed at
        # most once a minute at scrape time from SQLite (controller.query.fleet).
        self.fleet_faults = Gauge(
            "starpulse_fleet_fault_rate",
            "Faults per 1,000 GPU-days (the unit Meta and Tencent quote) over the last 30 days, by cause "
            "('all': every cause).",
            ["cause"],
            registry=r,
        )
        self.fleet_gpu_seconds = Gauge(
            "starpulse_fleet_gpu_seconds", "GPU-seconds in service, last 30 days (/86400: GPU-days).", registry=r
        )
        self.fleet_mttr = Gauge(
            "starpulse_fleet_mttr_seconds",
            "Mean time from a fault to the node back in the pool (to=pool) or the job resumed (to=job), 30 days.",
            ["to"],
            registry=r,
        )
        self.fleet_ettr = Gauge(
            "starpulse_fleet_ettr", "GPU-weighted effective training time ratio over the last 30 days.", registry=r
        )
        self.fleet_wrongful = Gauge(
            "starpulse_fleet_wrongful_evictions", "Wrongful evictions over the last 30 days.", registry=r
        )
        self.fleet_lemons = Gauge("starpulse_fleet_lemon_nodes", "Lemon nodes (the report's threshold).", registry=r)
        self.fleet_false_validations = Gauge(
            "starpulse_fleet_false_validations",
            "Nodes returned 'validated' that failed again with the same cause within a day, last 30 days.",
            registry=r,
        )
        self.fleet_false_validation_share = Gauge(
            "starpulse_fleet_false_validation_ratio",
            "Share of validated returns that were false successes, last 30 days (NaN: none judged).",
            registry=r,
        )
        # Periodic work runs on the event loop between reports: while a step runs, reports wait.
        self.periodic_seconds = Histogram(
            "starpulse_periodic_seconds",
            "Time one periodic step held the controller's event loop (sweep, presence flush, detection tick).",
            ["step"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.detection_seconds = Histogram(
            "starpulse_detection_latency_seconds",
            "From an incident's first condition to the incident being opened.",
            buckets=(0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120, 300),
            registry=r,
        )
        # controller.stages: one event's way from the agent's read to the delivered webhook,
        # each stage's share measured from the stage before it (the shares add up).
        self.event_stage_seconds = Histogram(
            "starpulse_event_stage_seconds",
            "Seconds an event spent reaching each stage from the one before it: read (agent) -> "
            "buffered -> sent -> received (controller) -> condition -> incident -> outbox -> delivered. "
            "Stages across the agent and the controller compare their wall clocks.",
            ["stage"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.command_queue = Gauge(
            "starpulse_command_queue_depth", "Commands waiting to be sent to agents.", registry=r
        )
        # Self-healing. kind: the incident kind behind the eviction; reason: "incident"
        # (automatic) or "manual" (operator). Pre-created at 0 so the series exist, and
        # increase() sees the first eviction, before self-healing ever runs.
        self.evictions = Counter(
            "starpulse_evictions",
            "Nodes evicted from scheduling, by incident kind and reason.",
            ["kind", "reason"],
            registry=r,
        )
        for kind in sorted(EVICTABLE_KINDS):
            self.evictions.labels(kind, "incident")
        self.breaker_open = Gauge(
            "starpulse_breaker_open",
            "Circuit breaker state: 0 closed (actions allowed), 1 open (actions suspended).",
            ["breaker"],
            registry=r,
        )
        for name in BREAKERS:
            self.breaker_open.labels(name).set(0)
        # Alerting.
        self.alert_outbox = Gauge(
            "starpulse_alert_outbox_depth", "Alert notifications waiting in the outbox to be delivered.", registry=r
        )
        self.alert_notifications = Counter(
            "starpulse_alert_notifications",
            "Alert notification deliveries, by receiver and outcome (sent, failed, dropped).",
            ["receiver", "outcome"],
            registry=r,
        )

    def set_shard_sources(self, running: Callable[[], float], in_flight: Callable[[], float]) -> None:
        """Read the detection shards' state at scrape time."""
        self.shards_running.set_function(running)
        self.shard_in_flight.set_function(in_flight)

    def set_spare_sources(self, counts: Callable[[], Mapping[str, int]], target: Callable[[], int]) -> None:
        """The spare pool at scrape time: spares by state, and the target the policy keeps (its
        share of the fleet's size, read at scrape time too)."""
        for state in ("available", "allocated", "unavailable"):
            self.spares.labels(state).set_function(functools.partial(_count_of, counts, state))
        self.spare_target.set_function(target)

    def set_lifecycle_source(self, states: Iterable[str], counts: Callable[[], Mapping[str, int]]) -> None:
        """Read the nodes per lifecycle state at scrape time (one small query per state)."""
        for state in states:
            self.node_lifecycle.labels(state).set_function(functools.partial(_count_of, counts, state))

    def set_outbox_depth_source(self, depth: Callable[[], float]) -> None:
        """Read the outbox depth at scrape time (no bookkeeping on every enqueue/dequeue)."""
        self.alert_outbox.set_function(depth)

    def set_fleet_report_source(self, figures: Callable[[], Mapping[str, float]], causes: Iterable[str]) -> None:
        """The fleet report's figures at scrape time, computed at most once a minute (one SQLite read
        of 30 days of incidents and remediations serves every series of a scrape)."""
        cached = _Cached(figures, 60.0)
        self.fleet_faults.labels("all").set_function(functools.partial(cached.get, "faults"))
        for cause in causes:
            self.fleet_faults.labels(cause).set_function(functools.partial(cached.get, f"faults.{cause}"))
        self.fleet_gpu_seconds.set_function(functools.partial(cached.get, "gpu_seconds"))
        self.fleet_mttr.labels("pool").set_function(functools.partial(cached.get, "mttr_pool_s"))
        self.fleet_mttr.labels("job").set_function(functools.partial(cached.get, "mttr_job_s"))
        self.fleet_ettr.set_function(functools.partial(cached.get, "ettr"))
        self.fleet_wrongful.set_function(functools.partial(cached.get, "wrongful"))
        self.fleet_lemons.set_function(functools.partial(cached.get, "lemons"))
        self.fleet_false_validations.set_function(functools.partial(cached.get, "false_validations"))
        self.fleet_false_validation_share.set_function(functools.partial(cached.get, "false_validation_share"))


class _Cached:
    """A mapping computed at most every ``ttl_s`` (monotonic time: scrapes are real-time)."""

    def __init__(self, compute: Callable[[], Mapping[str, float]], ttl_s: float) -> None:
        self._compute = compute
        self._ttl_s = ttl_s
        self._at = -math.inf
        self._value: Mapping[str, float] = {}

    def get(self, key: str) -> float:
        now = time.monotonic()
        if now - self._at >= self._ttl_s:
            self._value, self._at = self._compute(), now
        return float(self._value.get(key, math.nan))


def _count_of(counts: Callable[[], Mapping[str, int]], state: str) -> float:
    return float(counts().get(state, 0))
