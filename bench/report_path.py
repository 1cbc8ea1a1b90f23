"""The controller's per-report CPU outside gRPC: decode, validation, registry and detection.

gRPC itself costs ~0.35 ms per report (``bench.null_controller``) and a relay tier takes
most of it away; what is left per report is measured here, in one process, with nothing
else in the way. The controller's pieces are built as ``controller.service`` wires them:
a ``Store`` on a temporary SQLite file, the ``DecisionCore`` (registry, job registry and
the ``Detection`` pipeline: default rules, fail-slow, correlator) with detection as the
report decider, and the ``TelemetryServicer`` as the sink of its verdicts. The
nodes are ``bench.loadgen``'s: a ``SimNode`` through the production collectors (8 GPUs, 9
NIC ports), delta-encoded by the agent's ``ReportDelta`` (a full report every
``--full-every``), ``--fault-pct`` of them faulty (NIC error bursts, Xid 79 events). Each
node says Hello, then every pass sends one report per node as pre-encoded
``AgentMessage`` bytes, and the bench runs what ``TelemetryServicer._read_loop`` runs per
message: the token bucket, decode (``AgentMessage.FromString``, as the gRPC servicer
deserializes), ``validate_report``, ``Detection.decide`` (the rules) and the verdict's
recording (``TelemetryServicer.on_verdict``: registry, listeners, the ingest and report-age
histograms; no stream is open, so no ack).

Time is virtual: node ``i``'s report of pass ``s`` is stamped, and the controller's clock
reads, ``s * interval + i * interval / nodes``, so counter intervals, windows and the
once-a-second work (sweep, presence flush, detection tick, dashboard signature) happen
as they would at that rate, and every run reaches the same verdicts: the digest of every
condition change is printed, so a change that alters a verdict shows.

CPU is ``time.process_time`` (this machine is shared; CPU per report is the figure, not
wall time), per phase over a pass of all nodes. Passes are grouped in rounds of
``--full-every`` (one full-report pass and the rest delta passes, counter reads every
``counter_interval`` included); the figures are the median over ``--rounds`` rounds
after ``--warmup-rounds``.

    .venv/bin/python -m bench.report_path [--quick] [--nodes 1000] [--profile out.prof]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import hashlib
import json
import statistics
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench.common import median, table, write_result
from bench.loadgen import EVENT_TAG, REPORT_TAG, Templates, build_templates, encode
from starpulse.core.clock import FakeClock

NAME = "report_path"


class Harness:
    """The controller's ingest-side pieces, wired as ``controller.service.Controller`` wires them."""

    def __init__(self, db_path: Path, clock: FakeClock) -> None:
        from controller.core import DecisionCore
        from controller.detect.model import ConditionChange
        from controller.ingest.servicer import TelemetryServicer
        from controller.metrics import ControllerMetrics
        from controller.outputs.web.api import DashboardState
        from controller.query.live import LiveQueries
        from controller.settings import ControllerConfig
        from controller.store import Store

        self.clock = clock
        self.metrics = ControllerMetrics()
        self.store = Store(db_path)
        self.core = DecisionCore(
            ControllerConfig(db_path=db_path, heartbeat_timeout_s=600), clock, self.store, self.metrics
        )
        self.registry = self.core.registry
        self.jobs = self.core.jobs
        self.detection = self.core.detection
        self.telemetry = TelemetryServicer(self.registry, self.metrics, self.detection)  # binds the verdict sink
        self.dashboard = DashboardState(
            self.registry, LiveQueries(self.store, self.detection, self.registry, self.jobs)
        )
        # Every condition change detection hands to the correlator, for the verdict digest.
        self.changes: list[ConditionChange] = []
        feed = self.detection.correlator.on_changes

        def record(changes: Iterable[ConditionChange]) -> None:
            changes = list(changes)
            self.changes.extend(changes)
            feed(changes)

        self.detection.correlator.on_changes = record  # type: ignore[method-assign]

    def periodic(self) -> None:
        """What the controller does once a second: sweep, presence flush, detection tick (fail-slow
        when due), dashboard poll."""
        self.core.tick()
        self.dashboard.signature()

    def close(self) -> None:
        self.store.close()


def verdict_digest(changes: list[Any]) -> str:
    """sha256 over every condition change: kind, rule, component, severity, action, count, message, evidence."""
    h = hashlib.sha256()
    for ch in changes:
        c = ch.condition
        row = [ch.kind, c.rule, c.component, c.severity, c.action, c.count, c.message, c.first_seen_ms, c.resolved_ms]
        h.update(json.dumps(row, default=str).encode())
        h.update(json.dumps(c.evidence, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def run(
    tpl: Templates,
    nodes: int,
    fault_pct: float,
    interval_s: float,
    full_every: int,
    warmup_rounds: int,
    rounds: int,
    workdir: Path,
    profile: cProfile.Profile | None = None,
) -> dict[str, Any]:
    from controller.gcpolicy import tune
    from controller.ingest.ratelimit import TokenBucket
    from controller.ingest.registry import NodeRecord
    from controller.ingest.validate import validate_event, validate_report
    from starpulse.v1 import inventory_pb2 as ipb
    from starpulse.v1 import service_pb2 as spb
    from starpulse.v1 import telemetry_pb2 as tpb

    interval_ms = int(interval_s * 1000)
    start_ms = 1_800_000_000_000
    clock = FakeClock(start_ms)  # the controller's and the agents' clock, set by the bench
    h = Harness(workdir / "c.db", clock)
    registry, decide = h.registry, h.detection.decide
    inventory = ipb.Inventory.FromString(tpl.inventory)
    ids = [f"node-{i:05d}" for i in range(nodes)]
    n_faulty = round(nodes * fault_pct / 100)
    faulty = set(ids[:: max(1, nodes // n_faulty)][:n_faulty]) if n_faulty else set()
    records: list[NodeRecord] = []
    for node_id in ids:
        hello = spb.Hello(
            node_id=node_id,
            role=ipb.NODE_ROLE_COMPUTE,
            inventory=inventory,
            agent_version="bench",
            buffer_epoch=f"bench-{node_id}",
            next_event_seq=1,
        )
        records.append(registry.register(hello))
    profiles = [tpl.faulty[i % len(tpl.faulty)] if node_id in faulty else tpl.healthy for i, node_id in enumerate(ids)]
    buckets = [TokenBucket(200.0, 5000.0) for _ in ids]
    event_seq = [0] * nodes
    decode = spb.AgentMessage.FromString
    tune()  # as serve_forever: start-up state frozen, full collections on a schedule

    passes = (warmup_rounds + rounds) * full_every
    per_pass: list[dict[str, float]] = []
    next_tick_ms = start_ms + 1000
    steps = len(tpl.healthy.deltas)
    is_full = [not tpb.Report.FromString(d).counters_delta for d in tpl.healthy.deltas]
    for step in range(passes):
        # Untimed: this pass's wire bytes (template + seq + timestamp, as the load generator sends).
        base_ms = start_ms + step * interval_ms
        stamps = [base_ms + i * interval_ms // nodes for i in range(nodes)]
        wires: list[tuple[list[bytes], bytes]] = []
        for i in range(nodes):
            prof = profiles[i]
            events = []
            for ev in prof.events.get(step % steps, ()):
                event_seq[i] += 1
                events.append(encode(EVENT_TAG, ev, event_seq[i], stamps[i]))
            wires.append((events, encode(REPORT_TAG, prof.deltas[step % steps], step + 1, stamps[i])))
        cpu = {"decode": 0.0, "validate": 0.0, "record": 0.0, "events": 0.0, "periodic": 0.0}
        pt = time.process_time
        if profile is not None and step >= warmup_rounds * full_every:
            profile.enable()
        gc0 = gc.get_stats()[0]["collections"]
        for i in range(nodes):
            now = stamps[i]
            while next_tick_ms <= now:  # the sweep loop's once-a-second work
                clock.set_ms(next_tick_ms)
                t0 = pt()
                h.periodic()
                cpu["periodic"] += pt() - t0
                next_tick_ms += 1000
            clock.set_ms(now)
            node = records[i]
            events, report_wire = wires[i]
            if events:
                t0 = pt()
                for wire in events:
                    buckets[i].take()
                    msg = decode(wire)
                    msg.WhichOneof("body")
                    validate_event(msg.event)
                    registry.record_events(node, [msg.event])
                cpu["events"] += pt() - t0
            # One report, as TelemetryServicer._read_messages handles it.
            t0 = pt()
            buckets[i].take()
            msg = decode(report_wire)
            t1 = pt()
            started = time.perf_counter()
            msg.WhichOneof("body")
            report = msg.report
            validate_report(report)
            t2 = pt()
            decide(node, msg, started)
            t3 = pt()
            cpu["decode"] += t1 - t0
            cpu["validate"] += t2 - t1
            cpu["record"] += t3 - t2
        if profile is not None:
            profile.disable()
        full = is_full[step % steps]
        per_pass.append(
            {
                **{k: v * 1000 / nodes for k, v in cpu.items()},  # ms per report
                "full": float(full),
                "gen0_collections": gc.get_stats()[0]["collections"] - gc0,
            }
        )
    h.close()

    measured = per_pass[warmup_rounds * full_every :]
    round_figs = []
    for r in range(rounds):
        chunk = measured[r * full_every : (r + 1) * full_every]
        deltas = [p for p in chunk if not p["full"]]
        fulls = [p for p in chunk if p["full"]]
        round_figs.append(
            {
                "delta_decode_ms": statistics.fmean(p["decode"] for p in deltas),
                "delta_validate_ms": statistics.fmean(p["validate"] for p in deltas),
                "delta_record_detect_ms": statistics.fmean(p["record"] for p in deltas),
                "delta_after_decode_ms": statistics.fmean(p["validate"] + p["record"] for p in deltas),
                "full_decode_ms": statistics.fmean(p["decode"] for p in fulls) if fulls else float("nan"),
                "full_after_decode_ms": statistics.fmean(p["validate"] + p["record"] for p in fulls)
                if fulls
                else float("nan"),
                "all_after_decode_ms": statistics.fmean(p["validate"] + p["record"] for p in chunk),
                "events_ms_per_report": statistics.fmean(p["events"] for p in chunk),
                "periodic_ms_per_report": statistics.fmean(p["periodic"] for p in chunk),
            }
        )
    figures: dict[str, Any] = {k: round(median(r[k] for r in round_figs), 4) for k in round_figs[0]}
    figures["delta_total_ms"] = round(figures["delta_decode_ms"] + figures["delta_after_decode_ms"], 4)
    figures["rounds"] = round_figs
    figures["conditions_changes"] = len(h.changes)
    figures["conditions_active"] = len(h.detection.engine.active())
    figures["incidents_open"] = len(h.detection.correlator.incidents(active_only=True, limit=100_000))
    figures["verdict_digest"] = verdict_digest(h.changes)
    figures["reports"] = passes * nodes
    figures["per_pass"] = per_pass
    return figures


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.report_path", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="200 nodes, 1 warm-up round, 2 rounds")
    ap.add_argument("--nodes", type=int, default=None, help="simulated nodes (1000; quick 200)")
    ap.add_argument("--interval-s", type=float, default=5.0)
    ap.add_argument("--fault-pct", type=float, default=1.0)
    ap.add_argument("--full-every", type=int, default=12, help="a full report every N (as the agent)")
    ap.add_argument("--warmup-rounds", type=int, default=None, help="rounds of --full-every passes (1)")
    ap.add_argument("--rounds", type=int, default=None, help="measured rounds (3; quick 2)")
    ap.add_argument("--profile", type=Path, default=None, help="write a cProfile of the measured passes here")
    ap.add_argument("--tag", default="", help="suffix for the result file (report_path-<tag>.json)")
    args = ap.parse_args(argv)
    nodes = args.nodes or (200 if args.quick else 1000)
    warmup = args.warmup_rounds if args.warmup_rounds is not None else 1
    rounds = args.rounds or (2 if args.quick else 3)
    from starpulse.core.logs import configure_logging

    configure_logging("error")  # incidents log at warning; the figures are the output

    with tempfile.TemporaryDirectory(prefix="sp-report-path-") as tmp:
        t0 = time.perf_counter()
        steps = (warmup + rounds) * args.full_every
        tpl = build_templates(Path(tmp) / "sim", steps, args.interval_s, args.full_every)
        print(
            f"templates: {len(tpl.healthy.deltas)} steps x {1 + len(tpl.faulty)} profiles in "
            f"{time.perf_counter() - t0:.1f} s; mean delta report {tpl.delta_report_bytes:,} B"
        )
        prof = cProfile.Profile() if args.profile is not None else None
        t0 = time.perf_counter()
        figs = run(tpl, nodes, args.fault_pct, args.interval_s, args.full_every, warmup, rounds, Path(tmp), prof)
        wall = time.perf_counter() - t0
    if prof is not None and args.profile is not None:
        prof.dump_stats(str(args.profile))
    load = _loadavg()
    rows: list[tuple[str, Any]] = [
        ("nodes (8 GPUs + 9 NIC ports each)", nodes),
        ("reports fed (warm-up included)", figs["reports"]),
        ("delta report: decode ms", figs["delta_decode_ms"]),
        ("delta report: validate ms", figs["delta_validate_ms"]),
        ("delta report: record + detect + histograms ms", figs["delta_record_detect_ms"]),
        ("delta report: everything after decode ms", figs["delta_after_decode_ms"]),
        ("full report: decode ms", figs["full_decode_ms"]),
        ("full report: everything after decode ms", figs["full_after_decode_ms"]),
        ("all reports (1 in N full): after decode ms", figs["all_after_decode_ms"]),
        ("events (Xids of faulty nodes), ms per report", figs["events_ms_per_report"]),
        ("once-a-second work, ms per report", figs["periodic_ms_per_report"]),
        (
            "condition changes / active / incidents",
            f"{figs['conditions_changes']} / {figs['conditions_active']} / {figs['incidents_open']}",
        ),
        ("verdict digest", figs["verdict_digest"]),
        ("load average (1/5/15 min) at the end", " ".join(f"{x:.2f}" for x in load)),
        ("wall s", round(wall, 1)),
    ]
    print(
        table(
            f"per-report CPU outside gRPC (process_time, median of {rounds} rounds of {args.full_every} passes)", rows
        )
    )
    params = {
        "nodes": nodes,
        "interval_s": args.interval_s,
        "fault_pct": args.fault_pct,
        "full_every": args.full_every,
        "warmup_rounds": warmup,
        "rounds": rounds,
        "loadavg": load,
    }
    path = write_result(NAME + (f"-{args.tag}" if args.tag else ""), params, figs)
    print(f"wrote {path}")
    return figs


def _loadavg() -> tuple[float, float, float]:
    import os

    return os.getloadavg()


if __name__ == "__main__":
    main()
