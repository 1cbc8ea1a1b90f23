"""The agent's main loop: collect on an interval, turn findings into durable events, stream.

Collection runs in a worker thread (NVML and sysfs reads block); findings from
event-driven collectors arrive from their own threads through a thread-safe sink.
Every collector is isolated: one that raises is reported in the report's collector
status and the others carry on.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from agent.collectors.base import Collector
from agent.collectors.kmsg import KmsgCollector
from agent.commands import CommandHandler
from agent.jobs import JobCollector, JobGateway
from agent.metrics import AgentMetricsCollector, AgentStatus
from agent.probe.prober import Prober
from agent.transport.buffer import EventBuffer
from agent.transport.link import ControllerLink
from agent.transport.storm import StormSuppressor
from starpulse import __version__
from starpulse.core import sdnotify, vocab
from starpulse.core.findings import Finding
from starpulse.core.metrics_http import serve_collector
from starpulse.core.schema import meta, setting
from starpulse.core.tls import TLSSettings, load_channel_credentials
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)


@dataclass
class CollectorState:
    collector: Collector
    supported: bool = False
    reason: str = ""


@dataclass
class CycleResult:
    report: tpb.Report
    findings: list[Finding] = field(default_factory=list)


class CollectorSet:
    """The agent's collectors with isolation around every call."""

    def __init__(self, collectors: Sequence[Collector]) -> None:
        names = [c.name for c in collectors]
        duplicates = {n for n in names if names.count(n) > 1}
        if duplicates:
            raise ValueError(f"duplicate collector names: {sorted(duplicates)}")
        self.states = [CollectorState(c) for c in collectors]
        self.inventory = ipb.Inventory()
        self._gpu_by_pci: dict[str, int] = {}

    def probe(self) -> None:
        for st in self.states:
            try:
                st.supported = bool(st.collector.supported())
                if not st.supported:
                    st.reason = str(getattr(st.collector, "unavailable_reason", "") or "not supported here")
            except Exception as exc:
                st.supported = False
                st.reason = f"{type(exc).__name__}: {exc}"
            log.info("collector_probe", collector=st.collector.name, supported=st.supported, reason=st.reason)

    def describe(self) -> ipb.Inventory:
        inv = ipb.Inventory()
        for st in self.states:
            if not st.supported:
                continue
            try:
                st.collector.describe(inv)
            except Exception:
                log.exception("collector_describe_failed", collector=st.collector.name)
        self.inventory = inv
        self._gpu_by_pci = {vocab.pci_key(g.pci_bus_id): g.index for g in inv.gpus if g.pci_bus_id}
        return inv

    def collect(self, seq: int) -> CycleResult:
        report = tpb.Report(seq=seq, timestamp_ms=int(time.time() * 1000))
        findings: list[Finding] = []
        for st in self.states:
            status = report.collectors.add(name=st.collector.name, supported=st.supported)
            if not st.supported:
                status.error = st.reason
                continue
            started = time.perf_counter()
            try:
                findings.extend(st.collector.collect(report))
                status.ok = True
            except Exception as exc:
                status.ok = False
                status.error = f"{type(exc).__name__}: {exc}"
                log.warning("collector_failed", collector=st.collector.name, error=status.error)
            status.duration_s = time.perf_counter() - started
        return CycleResult(report, [self.localise(f) for f in findings])

    def localise(self, finding: Finding) -> Finding:
        """Name a GPU the kernel log knows only by PCI address by its index ('gpu-3')."""
        if finding.component.startswith("gpu@") and finding.pci:
            index = self._gpu_by_pci.get(vocab.pci_key(finding.pci))
            if index is not None:
                finding.component = f"gpu-{index}"
        return finding

    def close(self) -> None:
        for st in self.states:
            try:
                st.collector.close()
            except Exception:
                log.exception("collector_close_failed", collector=st.collector.name)


KMSG_CURSOR = "kmsg_cursor"


def read_boot_id(path: str) -> str:
    """The kernel's boot id ('' when unreadable): kernel-log sequence numbers restart per boot."""
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return ""


@dataclass
class AgentConfig:
    """Agent settings; units in names. The settings file places them in sections (starpulse.app.config)."""

    node_id: str = field(
        metadata=meta(
            "This node's id as the controller and the fabric know it (letters, digits, . _ -)", example="gpu-node-001"
        )
    )
    controllers: list[str] = field(
        metadata=meta(
            "Controller (or relay) addresses, tried in order: the agent fails over between them",
            address=True,
            nonempty=True,
            example=["controller.example.internal:50051"],
        )
    )
    role: int = ipb.NODE_ROLE_COMPUTE
    interval_s: float = setting(5.0, "Seconds between collection cycles and reports", gt=0)
    buffer_path: str = "/var/lib/starpulse/agent-buffer.db"
    buffer_max_events: int = setting(
        100_000, "Events kept on disk while the controller is away; the oldest go first beyond it", ge=1
    )
    storm_window_s: float = setting(60.0, "Seconds: the window of event-storm suppression", gt=0)
    storm_burst: int = setting(5, "Identical events per window before the rest are suppressed (and counted)", ge=1)
    boot_id_path: str = setting(
        "/proc/sys/kernel/random/boot_id", "File of the kernel's boot id: a new boot restarts kernel-log seqs"
    )
    flush_timeout_s: float = setting(
        2.0, "Seconds to wait on shutdown for the controller to ack what is buffered (the rest stays on disk)", ge=0
    )
    metrics_listen: str | None = setting(None, "Serve Prometheus /metrics at this address; null: off", address=True)
    job_socket: str | None = setting(None, "Unix socket for training jobs (starpulse.job); null: off")
    allowed_commands: dict[str, list[str]] = setting(
        {},
        "Commands the controller may run here, no shell: gpu_reset, reboot, run_diagnostic, and named "
        "validation diagnostics diagnostic.NAME (the policy's repair.validation) -> argv ({gpu} becomes a GPU index)",
        example={"gpu_reset": ["/usr/bin/nvidia-smi", "-r", "-i", "{gpu}"]},
    )
    tls: TLSSettings | None = None  # mutual TLS to the controller (None: plaintext)
    counters_every_s: float = setting(
        5.0,
        "Seconds: full reads of slow-moving counters (NIC and NVLink error counters) at most this often; "
        "link state and traffic counters every cycle; 0: every cycle",
        ge=0,
    )


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        collectors: Sequence[Collector],
        before_collect: Callable[[float], None] | None = None,
        starters: Sequence[Callable[[], object]] = (),
        kmsg: KmsgCollector | None = None,
        inventory_hooks: Sequence[Callable[[ipb.Inventory], None]] = (),
        prober: Prober | None = None,
    ) -> None:
        """``prober``: the probe mesh's sender and responder (agent.probe); None: the real UDP one,
        started when the controller first pushes a plan (a simulator hands one over its fake fabric)."""
        self.config = config
        self.jobs = JobGateway(config.job_socket) if config.job_socket else None
        if self.jobs is not None:
            collectors = [*collectors, JobCollector(self.jobs)]
        self.collectors = CollectorSet(collectors)
        for c in collectors:
            if hasattr(c, "slow_every_s"):
                c.slow_every_s = config.counters_every_s
        self.buffer = EventBuffer(config.buffer_path, max_events=config.buffer_max_events)
        self.storms = StormSuppressor(window_s=config.storm_window_s, burst=config.storm_burst)
        # (finding, when the collector handed it over): the event's read_us stage stamp.
        self._findings: queue.SimpleQueue[tuple[Finding, float]] = queue.SimpleQueue()
        self._before_collect = before_collect
        self._starters = starters
        self._kmsg = kmsg
        self._inventory_hooks = inventory_hooks
        self.boot_id = read_boot_id(config.boot_id_path)
        # A hung job without the job library is found by its GPU processes (agent.collectors.gpu_procs).
        pids_of = next((c.pids_of for c in collectors if hasattr(c, "pids_of")), None)
        self.commands = CommandHandler(self.jobs, config.allowed_commands, job_pids=pids_of)
        credentials = load_channel_credentials(config.tls) if config.tls is not None else None
        self.prober = prober if prober is not None else Prober()
        self._prober_started = False
        self.link = ControllerLink(
            config.controllers,
            self._hello,
            self.buffer,
            on_command=self.commands,
            credentials=credentials,
            on_probe_plan=self._probe_plan,
        )
        self._report_seq = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self.cycles = 0
        self.events_emitted = 0
        self._last_cycle = time.monotonic()
        self.latest_report: tpb.Report | None = None  # the last cycle's report, for /metrics
        self.metrics_port = 0  # bound /metrics port once serving (config.metrics_listen)

    # Thread-safe: event-driven collectors call this from their own threads.
    def sink(self, finding: Finding) -> None:
        self._findings.put((finding, time.time()))
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._wake.set)

    def _probe_plan(self, plan: spb.ProbePlan) -> None:
        """A plan from the controller: the prober takes it (its thread starts with the first one)."""
        self.prober.apply(plan)
        if not self._prober_started:
            self._prober_started = True
            self.prober.start()

    def _hello(self) -> spb.Hello:
        return spb.Hello(
            node_id=self.config.node_id,
            role=self.config.role,  # type: ignore[arg-type]
            inventory=self.collectors.inventory,
            agent_version=__version__,
            boot_id=self.boot_id,  # a changed one after a reboot is how the controller confirms it
        )

    def emit(self, finding: Finding, read_s: float | None = None) -> None:
        """Suppress storms, number durably, and tell the link.

        ``read_s``: when the collector read it (wall clock; None: now), the event's first stage stamp.
        """
        admitted = self.storms.admit(self.collectors.localise(finding))
        if admitted is None:
            return
        meta = None
        if admitted.source == "kmsg" and "kmsg_seq" in admitted.attributes:
            meta = {KMSG_CURSOR: f"{self.boot_id}:{admitted.attributes['kmsg_seq']}"}
        wire = admitted.to_event()
        wire.read_us = int((time.time() if read_s is None else read_s) * 1e6)
        event = self.buffer.append(wire, meta=meta)
        self.link.note_buffered(event.seq)
        self.events_emitted += 1
        log.info(
            "event",
            seq=event.seq,
            kind=admitted.kind,
            component=admitted.component,
            severity=admitted.severity,
            action=admitted.action,
            message=admitted.message,
            read_to_buffered_ms=round(time.time() * 1000 - wire.read_us / 1000, 2),
        )

    def _drain_findings(self) -> None:
        while True:
            try:
                finding, read_s = self._findings.get_nowait()
            except queue.Empty:
                break
            self.emit(finding, read_s)
        for summary in self.storms.flush():
            event = self.buffer.append(summary.to_event())
            self.events_emitted += 1
            log.info("event_storm_summary", seq=event.seq, kind=summary.kind, component=summary.component)
            self.link.wake()

    def _cycle(self) -> CycleResult:
        now = time.monotonic()
        if self._before_collect is not None:
            self._before_collect(now - self._last_cycle)
        self._last_cycle = now
        self._report_seq += 1
        return self.collectors.collect(self._report_seq)

    def start_collectors(self) -> None:
        # The kernel-log cursor must be set before describe(), which starts the tail.
        if self._kmsg is not None:
            cursor = self.buffer.get_meta(KMSG_CURSOR)
            if cursor is not None:
                boot, _, seq = cursor.rpartition(":")
                if boot == self.boot_id and seq.isdigit():
                    self._kmsg.resume_after(int(seq))
                else:
                    self._kmsg.resume_after(-1)  # a new boot: everything in the ring is new
        self.collectors.probe()
        inventory = self.collectors.describe()
        for hook in self._inventory_hooks:
            try:
                hook(inventory)
            except Exception:
                log.exception("inventory_hook_failed")
        for start in self._starters:
            try:
                start()
            except Exception:
                log.exception("collector_start_failed", starter=getattr(start, "__qualname__", repr(start)))

    def status(self) -> AgentStatus:
        """What the agent knows about itself; tolerant of a buffer closed under a late scrape."""
        try:
            buffered: int | None = self.buffer.depth()
        except Exception:
            buffered = None
        return AgentStatus(
            events_buffered=buffered,
            events_dropped_total=self.buffer.dropped_total,
            events_emitted_total=self.events_emitted,
            reports_sent_total=self.link.reports_sent,
            cycles_total=self.cycles,
            connected=self.link.connected.is_set(),
            streams_replaced_total=self.link.replaced,
            streams_silent_total=self.link.silent_streams,
        )

    def metrics_collector(self) -> AgentMetricsCollector:
        """The /metrics translation of this agent's latest report and status, read at scrape time."""
        return AgentMetricsCollector(
            self.config.node_id, lambda: self.collectors.inventory, lambda: self.latest_report, self.status
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Collect and stream until stop is set; unsent events stay buffered on disk."""
        self._loop = asyncio.get_running_loop()
        await asyncio.to_thread(self.start_collectors)
        metrics_server = None
        if self.config.metrics_listen:
            metrics_server = serve_collector(self.metrics_collector(), self.config.metrics_listen, "metrics.listen")
            self.metrics_port = metrics_server.port
        if self.jobs is not None:
            try:
                await self.jobs.start()
            except OSError:  # the agent still monitors the node without it
                log.exception("job_gateway_failed", socket=self.config.job_socket)
        link_task = asyncio.create_task(self.link.run())
        log.info(
            "agent_started",
            node=self.config.node_id,
            controllers=self.config.controllers,
            interval_s=self.config.interval_s,
            buffered=self.buffer.depth(),
        )
        sdnotify.ready(f"collecting every {self.config.interval_s:g}s")
        stop_watch = asyncio.create_task(self._wake_on(stop))
        loop = self._loop
        try:
            next_at = time.monotonic()
            while not stop.is_set():
                result = await asyncio.to_thread(self._cycle)
                result.report.probe_results.extend(self.prober.take_results())
                self.cycles += 1
                self.latest_report = result.report
                for finding in result.findings:
                    self.emit(finding)
                self._drain_findings()
                self.link.offer_report(result.report)
                sdnotify.watchdog()  # a completed cycle vouches for liveness (WatchdogSec= > 2 x interval)
                next_at += self.interval_s
                while not stop.is_set():
                    remaining = next_at - time.monotonic()
                    if remaining <= 0:
                        break
                    # One timer handle per wait, no tasks: a finding (sink), the timer and stop
                    # (stop_watch) all set _wake.
                    self._wake.clear()
                    timer = loop.call_later(remaining, self._wake.set)
                    try:
                        await self._wake.wait()
                    finally:
                        timer.cancel()
                    self._drain_findings()
                if time.monotonic() - next_at > self.interval_s:
                    next_at = time.monotonic()  # fell behind: do not burst to catch up
        finally:
            stop_watch.cancel()
            sdnotify.stopping("flushing buffered events")
            if metrics_server is not None:
                await asyncio.to_thread(metrics_server.close)
            if self.jobs is not None:
                await self.jobs.close()
            self._drain_findings()
            await self._flush(self.config.flush_timeout_s)
            await self.link.stop()
            link_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await link_task
            if self._prober_started:
                await asyncio.to_thread(self.prober.stop)
            await asyncio.to_thread(self.collectors.close)
            self.buffer.close()
            log.info("agent_stopped", node=self.config.node_id)

    async def _wake_on(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._wake.set()

    async def _flush(self, timeout_s: float) -> None:
        """On shutdown, give buffered events a moment to be acked (they stay on disk if not)."""
        deadline = time.monotonic() + timeout_s
        while self.link.connected.is_set() and self.link.acked_event_seq < self.buffer.next_seq - 1:
            if time.monotonic() >= deadline:
                log.info("agent_shutdown_unacked", buffered=self.buffer.depth())
                return
            self.link.wake()
            await asyncio.sleep(0.05)

    @property
    def interval_s(self) -> float:
        hint = self.link.report_interval_hint_s
        return hint if hint > 0 else self.config.interval_s
