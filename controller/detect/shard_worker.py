"""A detection shard: the per-node half of detection, in a process of its own.

Why: one Python process decides ~1,400 reports a second at most (bench.scale); a
10,000-node fleet reporting every 5 s sends 2,000. Most of a report's cost is per node and
needs nothing from other nodes: decoding it, validating it, the rule engine's counters,
windows and thresholds, the fail-slow signals. So the controller (controller.detect.shards)
hands each compute node's reports and events, as the bytes that arrived, to one shard
chosen by node id; the shard runs the same ``ConditionEngine`` as an unsharded controller
would and answers with what the controller needs: the report's sequence number (for the
ack), whether it was valid, a handful of fail-slow numbers, the job steps, a changed LLDP
list, the condition changes, and for each batch of events what it opened and when
(``EventsOpened``: the controller's stage trace and grouping windows need both, so that a
sharded fault is traced and grouped exactly as an unsharded one). Correlation, incidents,
healing, presence, switches and the store stay in the controller, which sees one stream of
condition changes as before.

One node's reports and events reach one shard in the order they arrived, so its engine
state is exactly what the controller's own engine would hold.

Protocol (controller.detect.shardwire frames): stdin carries the settings, then batches of
operations; stdout carries ``("ready", pid)``, then one ``(results, changes, opened, cpu)``
per batch or tick: ``results`` as ``ReportResult.to_wire`` tuples, ``cpu`` the shard's CPU
seconds by stage so far (``StageCpu``; sent with each tick, else None). Logs go to stderr.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import pickle
import select
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import structlog
from google.protobuf.message import DecodeError

from controller import gcpolicy
from controller.detect.conditions import ConditionEngine
from controller.detect.failslow import FailSlowConfig, FailSlowDetector
from controller.detect.gpu_jobs import job_gpu_signature
from controller.detect.model import ConditionChange
from controller.detect.probe_sums import ProbeSums, SumsRequest, observations
from controller.detect.rules import load_rules
from controller.fabric.model import Fabric
from controller.fabric.probeplan import ProbeConfig
from controller.ingest.registry import ONLINE, NodeRecord
from controller.ingest.validate import InvalidMessage, validate_event, validate_report
from controller.ingest.verdict import ReportResult
from controller.metrics import StageCpu
from starpulse.core.clock import SYSTEM_CLOCK, Clock
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

# Operations the controller sends (first element names it).
OP_NODE = "node"  # (OP_NODE, node_id, role, stream_token, inventory bytes)
OP_REPORT = "report"  # (OP_REPORT, node_id, stream_token, AgentMessage bytes, validated, submitted)
OP_EVENTS = "events"  # (OP_EVENTS, node_id, [Event bytes])
OP_FORGET = "forget"  # (OP_FORGET, node_id)
# The probe window's questions (controller.detect.probe_sums): each OP_PROBE_SNAPSHOT and
# OP_PROBE_KEYS is answered by one ProbeAnswer frame; a snapshot holds the window until OP_PROBE_RELEASE.
OP_PROBE_SNAPSHOT = "probe_snapshot"  # (OP_PROBE_SNAPSHOT, SumsRequest)
OP_PROBE_KEYS = "probe_keys"  # (OP_PROBE_KEYS, frozenset of components, delay sample's every)
OP_PROBE_RELEASE = "probe_release"  # (OP_PROBE_RELEASE,)
OP_PROBE_FABRIC = "probe_fabric"  # (OP_PROBE_FABRIC, Fabric): the wiring changed
PIPE_BYTES = 1 << 20  # Linux's default /proc/sys/fs/pipe-max-size

Key = tuple[str, str]
Answer = tuple[list[ReportResult], list[ConditionChange], list["EventsOpened"]]


@dataclass
class EventsOpened:
    """One batch of a node's events, as the shard's engine took it: the conditions it opened, and when.

    The controller marks its traced events' ``condition`` stage at ``at`` (wall-clock seconds
    on the shard's clock, the system clock in its process: the stage is when a rule opened the condition, not when
    the answer came back) and gives ``keys`` the event grouping window, as it does for events
    its own engine takes. Sent for every batch, also one that opened nothing, so that the
    controller stops following its events at once.
    """

    node: str
    seqs: list[int]
    keys: list[Key]
    at: float


@dataclass
class ShardSettings:
    rules_path: str | None = None
    failslow: FailSlowConfig = field(default_factory=FailSlowConfig)
    tick_s: float = 1.0
    full_collection_s: float = 600.0  # controller.gcpolicy's schedule
    # The probe mesh (None: off): the shard keeps its nodes' probe window (ProbeSums) on this fabric.
    probes: ProbeConfig | None = None
    fabric: Fabric | None = None


@dataclass
class ProbeAnswer:
    """A shard's answer to one probe question: a ``SumsSnapshot``, or a list of ``KeyRecord`` and
    the delay baseline's sample,
    pickled apart (``payload``; None: no window), so that the controller unpickles a large
    answer (at 10,000 nodes a snapshot holds ~100,000 components) in a worker thread, not on its
    event loop, which reads the frame."""

    payload: bytes | None


class Shard:
    """The per-node detection state of the nodes that hash to this shard."""

    def __init__(self, settings: ShardSettings, clock: Clock) -> None:
        """``clock``: a shard is its own process and keeps real time (``serve`` hands in the system clock)."""
        self.clock = clock
        self.engine = ConditionEngine(load_rules(settings.rules_path), fabric=None, clock=clock)
        self.failslow = FailSlowDetector(settings.failslow, clock=clock)
        self.nodes: dict[str, NodeRecord] = {}
        # The probe window of this shard's nodes' results: summed here, asked for by the controller.
        self.probe_sums: ProbeSums | None = None
        if settings.probes is not None and settings.probes.enabled and settings.fabric is not None:
            self.probe_sums = ProbeSums(settings.fabric, settings.probes)
        self.probe_answers: list[ProbeAnswer] = []  # serve() writes them after the batch's answer
        self._full_seen: set[str] = set()  # nodes whose current stream sent a full report
        # Wall seconds of the reports' phases (decode and validate, rules, fail-slow): serve()
        # splits the CPU of a whole batch by them (three perf_counter reads per report, ~0.2 us).
        self.phase_s = [0.0, 0.0, 0.0]

    def handle(self, ops: list[tuple[Any, ...]]) -> Answer:
        results: list[ReportResult] = []
        changes: list[ConditionChange] = []
        opened: list[EventsOpened] = []
        for op in ops:
            kind = op[0]
            try:
                if kind == OP_REPORT:
                    at_ms = op[6] if len(op) > 6 else 0
                    results.append(self._report(op[1], op[2], op[3], op[4], op[5], changes, at_ms))
                elif kind == OP_EVENTS:
                    opened += self._events(op[1], op[2], changes)
                elif kind == OP_NODE:
                    self._node(op[1], op[2], op[3], op[4])
                elif kind == OP_FORGET:
                    changes += self._forget(op[1])
                elif kind.startswith("probe_"):
                    self._probe(op)
                else:
                    log.error("shard_unknown_op", op=kind)
            except Exception:
                # A bug in a rule must not take the shard (and every node on it) down: the
                # controller logs and goes on in the same case (registry listeners).
                log.exception("shard_op_failed", op=kind, node=op[1] if len(op) > 1 else None)
                if kind == OP_REPORT:
                    results.append(ReportResult(op[1], op[2], op[5]))
        return results, changes, opened

    def tick(self) -> list[ConditionChange]:
        return self.engine.tick()

    def _probe(self, op: tuple[Any, ...]) -> None:
        """One of the localiser's questions about this shard's probe window (a question always
        gets its one answer, an empty one without a window, so the controller never waits forever)."""
        kind, sums = op[0], self.probe_sums
        if kind == OP_PROBE_SNAPSHOT:
            req: SumsRequest = op[1]
            if sums is None:
                self.probe_answers.append(ProbeAnswer(None))
                return
            try:
                # pickled at once, so the running sums themselves go (no copies): later ops change them
                snap = sums.snapshot(req, copy=False)
                self.probe_answers.append(ProbeAnswer(pickle.dumps(snap, pickle.HIGHEST_PROTOCOL)))
            except Exception:
                self.probe_answers.append(ProbeAnswer(None))  # the controller gives this localisation up
                raise
            finally:
                sums.hold()  # the keys' detail, if asked, is of this very window
        elif kind == OP_PROBE_KEYS:
            try:
                answer = (
                    (sums.keys_through(op[1]), sums.delay_sample(op[2]) if op[2] else [])
                    if sums is not None
                    else ([], [])
                )
                self.probe_answers.append(ProbeAnswer(pickle.dumps(answer, pickle.HIGHEST_PROTOCOL)))
            except Exception:
                self.probe_answers.append(ProbeAnswer(None))
                raise
        elif kind == OP_PROBE_RELEASE and sums is not None:
            sums.release()
        elif kind == OP_PROBE_FABRIC and sums is not None:
            sums.forget_paths(op[1])

    def _node(self, node_id: str, role: int, token: int, inventory: bytes) -> None:
        node = self.nodes.get(node_id)
        if node is None:
            node = NodeRecord(node_id=node_id, role=role, state=ONLINE, first_seen_ms=0, last_seen_ms=0)
            self.nodes[node_id] = node
        node.role = role
        node.stream_token = token
        node.inventory.ParseFromString(inventory)
        node.lldp = list(node.inventory.lldp_neighbors)
        self._full_seen.discard(node_id)

    def _report(
        self,
        node_id: str,
        token: int,
        raw: bytes,
        validated: bool,
        submitted: float,
        changes: list[ConditionChange],
        now_ms: int = 0,
    ) -> ReportResult:
        """One report. ``now_ms``: the controller's clock when it handed the report over (the probe
        window's arrival time, on the clock the controller's localiser keeps)."""
        result = ReportResult(node_id, token, submitted)
        node = self.nodes.get(node_id)
        if node is None:
            result.error = f"shard knows no node {node_id!r}"  # the controller always says OP_NODE first
            return result
        started = time.perf_counter()
        try:
            msg = spb.AgentMessage.FromString(raw)
        except DecodeError as exc:
            result.error = f"message is not an AgentMessage: {exc}"
            return result
        if msg.WhichOneof("body") != "report":
            result.error = "expected a report"
            return result
        report = msg.report
        if not validated:
            try:
                validate_report(report)
            except InvalidMessage as exc:
                result.error = str(exc)
                return result
        result.seq = report.seq
        result.timestamp_ms = report.timestamp_ms
        if not report.counters_delta:
            self._full_seen.add(node_id)
        elif node_id not in self._full_seen:
            result.full_report_needed = True
        if report.HasField("lldp"):
            node.lldp = list(report.lldp.neighbors)
            result.lldp = node.lldp  # messages pickle (as their bytes) like the rest of the verdict
        if report.HasField("accelerator_check"):
            result.accelerator_check = report.accelerator_check
        result.gpus = len(report.gpus)
        result.nics = len(report.nics)
        result.switch_ports = len(report.switch_ports)
        decoded = time.perf_counter()
        changes += self.engine.on_report(node, report)
        judged = time.perf_counter()
        result.signals, result.job = self.failslow.extract(node_id, report)
        phase = self.phase_s
        phase[0] += decoded - started
        phase[1] += judged - decoded
        phase[2] += time.perf_counter() - judged
        if report.job_steps:
            result.job_steps = list(report.job_steps)
        result.job_gpus = job_gpu_signature(report)
        if report.probe_results and self.probe_sums is not None:
            # decoded and summed here; the controller asks for the sums when it localises
            self.probe_sums.add(now_ms, observations(report))
            result.probe_count = len(report.probe_results)
        return result

    def _events(self, node_id: str, raw: list[bytes], changes: list[ConditionChange]) -> list[EventsOpened]:
        node = self.nodes.get(node_id)
        if node is None:
            log.error("shard_events_unknown_node", node=node_id)
            return []
        events = [tpb.Event.FromString(b) for b in raw]
        for ev in events:
            validate_event(ev)  # the controller stored them valid; this guards the wire only
        found = self.engine.on_events(node, events)
        at = self.clock.time()
        changes += found
        keys = [ch.condition.key for ch in found if ch.kind == "opened"]
        return [EventsOpened(node_id, [ev.seq for ev in events], keys, at)]

    def _forget(self, node_id: str) -> list[ConditionChange]:
        self.nodes.pop(node_id, None)
        self._full_seen.discard(node_id)
        self.failslow.forget(node_id)
        return self.engine.forget(node_id)


def serve(fd_in: int, fd_out: int, *, clock: Clock) -> None:
    """The shard's life: settings, then batches until the controller closes stdin.

    ``clock``: the shard is its own process, so ``main`` hands in the system clock; its
    ticks and full collections are timed on it too.
    """
    from controller.detect.shardwire import read_frame_fd, write_frame_fd

    for fd in (fd_in, fd_out):
        _widen_pipe(fd)
    settings = read_frame_fd(fd_in)
    if not isinstance(settings, ShardSettings):
        raise SystemExit("a detection shard's first frame must be its settings")
    shard = Shard(settings, clock)
    gcpolicy.tune()  # as the controller: no automatic full collections in the middle of a batch
    write_frame_fd(fd_out, ("ready", os.getpid()))
    next_tick = clock.monotonic() + settings.tick_s
    next_collection = clock.monotonic() + settings.full_collection_s
    cpu = StageCpu()
    decide_wall = 0.0
    while True:
        wait = max(0.0, next_tick - clock.monotonic())
        readable, _, _ = select.select([fd_in], [], [], wait)
        results: list[ReportResult] = []
        changes: list[ConditionChange] = []
        opened: list[EventsOpened] = []
        totals: dict[str, float] | None = None
        at = time.thread_time()
        if readable:
            ops = read_frame_fd(fd_in)
            if ops is None:
                return  # the controller closed our stdin: it is stopping
            at = cpu.since("frame_read", at)
            wall = time.perf_counter()
            results, changes, opened = shard.handle(ops)
            decide_wall += time.perf_counter() - wall
            at = cpu.since("decide", at)
        if clock.monotonic() >= next_tick:
            next_tick = clock.monotonic() + settings.tick_s
            try:
                changes += shard.tick()
            except Exception:
                log.exception("shard_tick_failed")
            if next_tick >= next_collection:
                next_collection = next_tick + settings.full_collection_s
                gc.collect()
            at = cpu.since("tick", at)
            totals = stage_totals(cpu.seconds, shard.phase_s, decide_wall)
        if results or changes or opened or totals:
            write_frame_fd(fd_out, ([r.to_wire() for r in results], changes, opened, totals))
            cpu.since("frame_write", at)
        if shard.probe_answers:  # after the batch's verdicts: the reports before a question came first
            answers, shard.probe_answers = shard.probe_answers, []
            for answer in answers:
                write_frame_fd(fd_out, answer)
            cpu.since("probe_answers", at)


PHASES = ("decode_validate", "rules", "failslow")


def stage_totals(seconds: dict[str, float], phase_wall: list[float], decide_wall: float) -> dict[str, float]:
    """The shard's CPU by stage: its batches' CPU (``decide``) split by the reports' phases' shares
    of the batches' wall time; what is left of it (node and event operations, verdicts) stays ``decide``."""
    out = dict(seconds)
    decide = out.pop("decide", 0.0)
    left = decide
    if decide_wall > 0:
        for name, wall in zip(PHASES, phase_wall, strict=True):
            share = decide * min(1.0, wall / decide_wall)
            out[name] = share
            left -= share
    out["decide_other"] = max(0.0, left)
    return out


def _widen_pipe(fd: int, size: int = PIPE_BYTES) -> None:
    """Give a pipe room for a whole batch (Linux: 64 KiB by default).

    A batch of a hundred reports is ~1 MB; through a 64 KiB pipe the shard would wait for
    the controller's event loop to come round ~15 times to read one batch.
    """
    # Not a pipe, not Linux, or above /proc/sys/fs/pipe-max-size: the default size still works.
    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)


def main() -> None:
    # The controller ends a shard by closing its stdin, after the shard's last answers. A
    # SIGTERM or SIGINT meant for the whole service (systemd stops the unit's cgroup; Ctrl-C
    # reaches the terminal's process group) must not kill it first: that would look like a
    # lost shard and drop those answers.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # stdout is the frame channel: keep it for frames only, and send anything printed to stderr.
    fd_out = os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    from starpulse.core.logs import configure_logging

    configure_logging(stream=sys.stderr)
    serve(sys.stdin.fileno(), fd_out, clock=SYSTEM_CLOCK)  # its own process: real time
