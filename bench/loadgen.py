"""A load generator that plays thousands of agents against one controller.

Realism where the controller can tell, cheapness everywhere else:

* every simulated node opens its own stream on its own channel (one TCP connection, as
  a real agent), says Hello with a real 8-GPU / 9-NIC inventory, and then reports every
  ``interval_s`` (random phase, +-``jitter`` per report);
* the reports are real: a ``SimNode`` with the production collectors is stepped once
  per interval, so traffic counters, power and temperatures move from report to report;
* a ``fault_fraction`` of the nodes are faulty: from a given step on, one NIC's error
  counters rise every report (symbol errors, out-of-sequence, CRC) and one GPU sends an
  Xid 79 event, so the condition engine opens conditions and the correlator incidents;
* every message is pre-encoded: a report is template bytes (the step's report with
  seq/timestamp left at zero) prefixed by the seq and timestamp fields. The controller
  still decodes, validates and runs detection on every message in full.

Run inside worker processes (``worker``), a few processes with many grpc.aio streams
each. Each worker measures report->ack round trip (the controller acks a report only
after detection has run on it, see ``controller.ingest.servicer``), so the RTT bounds the
report-to-decision latency from above, queueing included.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import open_stream, read_acks


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode(field_tag: bytes, template: bytes, seq: int, ts_ms: int) -> bytes:
    """AgentMessage{<field>: template + seq (field 1) + timestamp_ms (field 2)} as wire bytes.

    proto3 leaves zero fields out, so the template carries neither; field order does not
    matter on the wire, so prefixing them yields the message a full encode would give.
    """
    body = b"\x08" + varint(seq) + b"\x10" + varint(ts_ms) + template
    return field_tag + varint(len(body)) + body


def _has_delta_reports() -> bool:
    from starpulse.v1 import telemetry_pb2 as tpb

    return "counters_delta" in tpb.Report.DESCRIPTOR.fields_by_name


DELTA_REPORTS = _has_delta_reports()
REPORT_TAG = b"\x12"  # AgentMessage.report = 2, length-delimited
EVENT_TAG = b"\x1a"  # AgentMessage.event = 3


@dataclass
class Profile:
    """One kind of node: its report template per step and the events it sends at each step."""

    reports: list[bytes]  # full reports
    events: dict[int, list[bytes]] = field(default_factory=dict)
    deltas: list[bytes] = field(default_factory=list)  # as the agent's ReportDelta encodes them


@dataclass
class Templates:
    inventory: bytes
    healthy: Profile
    faulty: list[Profile]  # different fault start steps, so faults do not all start together
    gpus: int
    nics: int
    report_bytes: int  # mean full report
    delta_report_bytes: int  # mean on the wire with delta reports (fulls included)


def _run_sim(
    workdir: Path, steps: int, interval_s: float, fault_at: int | None, seed: int, full_every: int
) -> tuple[Profile, bytes, int, int]:
    from agent.factory import build_collectors
    from agent.runtime import CollectorSet
    from agent.sim.node import SimNode
    from starpulse.core.findings import Finding

    sim = SimNode("node-sim", workdir, gpus=8, nics=8, seed=seed)
    plan = build_collectors("sim", sink=lambda f: None, sim=sim, kmsg_path=None)
    cs = CollectorSet(plan.collectors)
    cs.probe()
    inv = cs.describe()
    for hook in plan.inventory_hooks:
        hook(inv)
    from agent.transport.delta import ReportDelta

    profile = Profile([])
    encoder = ReportDelta(full_every)
    encoder.reset(enabled=True)
    gpus = nics = 0
    try:
        for step in range(steps):
            if fault_at is not None and step >= fault_at:
                sim.sysfs.error_burst(2, 200)  # NIC 2's error counters rise every report
                if step == fault_at or (step - fault_at) % 6 == 0:
                    xid = Finding(
                        kind="xid",
                        component="gpu-5",
                        severity="critical",
                        action="reset_gpu",
                        message="Xid 79: GPU has fallen off the bus (load generator)",
                        source="nvml",
                        xid=79,
                        timestamp_ms=0,
                    )
                    profile.events[step] = [xid.to_event().SerializeToString()]
            sim.advance(interval_s)
            report = cs.collect(1).report
            report.seq = 0
            report.timestamp_ms = 0
            gpus, nics = len(report.gpus), len(report.nics)
            profile.reports.append(report.SerializeToString())
            if DELTA_REPORTS:  # a checkout from before delta reports (bench's before/after runs)
                profile.deltas.append(encoder.encode(report).SerializeToString())
    finally:
        cs.close()
    return profile, inv.SerializeToString(), gpus, nics


def build_templates(
    workdir: Path, steps: int, interval_s: float, full_every: int = 12, fault_starts: tuple[int, ...] = (2, 4, 6)
) -> Templates:
    """Healthy and faulty report sequences from real collect cycles, full and delta-encoded.

    ``steps`` is rounded up to a multiple of ``full_every`` so that a node wrapping around
    the sequence lands on a full report.
    """
    steps = -(-steps // full_every) * full_every
    healthy, inventory, gpus, nics = _run_sim(workdir / "healthy", steps, interval_s, None, 0, full_every)
    faulty = [
        _run_sim(workdir / f"faulty-{f}", steps, interval_s, f, i + 1, full_every)[0]
        for i, f in enumerate(fault_starts)
    ]
    size = sum(len(r) for r in healthy.reports) // steps + 12
    delta_size = sum(len(r) for r in healthy.deltas) // steps + 12 if healthy.deltas else size
    return Templates(inventory, healthy, faulty, gpus, nics, size, delta_size)


def carries(seq: int, interval_s: float, window_s: int) -> bool:
    """Whether report ``seq`` carries a probe window: the agent closes one every ``window_s`` and
    the next report takes it (every other report at the 5 s interval and the 10 s window)."""
    return seq % max(1, round(window_s / interval_s)) == 0


# -- worker process ---------------------------------------------------------------------------
@dataclass
class NodeStats:
    acked_in_window: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    events_sent: int = 0
    sent_in_window: int = 0
    replaced: int = 0  # reports an agent would replace with a newer one before they could go
    probe_windows: int = 0  # reports that carried a window of probe results


async def run_node(
    call: Any,
    profile: Profile,
    delta: bool,
    interval_s: float,
    jitter: float,
    first_at: float,
    t_start: float,
    t_end: float,
    rng: random.Random,
    st: NodeStats,
    probes: list[bytes] | None = None,
    probe_window_s: int = 10,
) -> None:
    """Report every interval (+-jitter) until t_end; record report->ack RTT inside the window.

    ``probes``: this node's probe-result windows (``bench.probeload``), taken in turn by the
    reports that carry a window."""
    sent_at: dict[int, float] = {}
    rd = asyncio.create_task(read_acks(call, sent_at, t_start, t_end, st))
    seq = 0
    event_seq = 0
    steps = len(profile.reports)
    wire = profile.deltas if delta else profile.reports
    try:
        next_at = first_at
        while not rd.done():
            await asyncio.sleep(max(0.0, next_at - time.time()))
            now = time.time()
            if now >= t_end:
                break
            step = seq % steps
            seq += 1
            ts = int(now * 1000)
            for ev in profile.events.get(step, ()):
                event_seq += 1
                st.events_sent += 1
                await call.write(encode(EVENT_TAG, ev, event_seq, ts))
            body = wire[step]
            if probes and carries(seq, interval_s, probe_window_s):
                body += probes[(seq // max(1, round(probe_window_s / interval_s))) % len(probes)]
                st.probe_windows += 1
            payload = encode(REPORT_TAG, body, seq, ts)
            if now >= t_start:
                sent_at[seq] = time.perf_counter()
                st.sent_in_window += 1
            await call.write(payload)
            next_at += interval_s * (1.0 + rng.uniform(-jitter, jitter))
        await asyncio.wait({rd}, timeout=3.0)  # the last acks
    finally:
        rd.cancel()


async def worker_main(cfg: dict[str, Any], control: Any, results: Any) -> None:
    """One load process: open every stream, wait for the start signal, drive, report back."""
    import grpc

    tpl: Templates = cfg["templates"]
    ids: list[str] = cfg["node_ids"]
    faulty: set[str] = set(cfg["faulty"])
    probes: dict[str, list[bytes]] = cfg.get("probes") or {}
    sem = asyncio.Semaphore(cfg.get("connect_parallel", 64))
    opened: list[tuple[str, Any, Any, bool]] = []
    hello_rtt: list[float] = []
    errors: dict[str, int] = {}

    async def open_one(node_id: str) -> None:
        async with sem:
            try:
                ch, call, rtt, accepts_delta = await open_stream(cfg["port"], node_id, tpl.inventory, "loadgen")
            except Exception as exc:
                key = type(exc).__name__
                errors[key] = errors.get(key, 0) + 1
                return
            opened.append((node_id, ch, call, accepts_delta and cfg["delta"]))
            hello_rtt.append(rtt)

    t0 = time.perf_counter()
    await asyncio.gather(*(open_one(n) for n in ids))
    connect_s = time.perf_counter() - t0
    results.put(("ready", cfg["worker"], {"connect_s": connect_s, "streams": len(opened)}))
    t_launch, t_start, t_end = await asyncio.to_thread(control.get)

    rng = random.Random(cfg["worker"])
    stats = [NodeStats() for _ in opened]

    async def drive(i: int) -> None:
        node_id, _, call, delta = opened[i]
        profile = tpl.faulty[i % len(tpl.faulty)] if node_id in faulty else tpl.healthy
        phase = rng.uniform(0, cfg["interval_s"])
        try:
            await run_node(
                call,
                profile,
                delta,
                cfg["interval_s"],
                cfg["jitter"],
                t_launch + phase,
                t_start,
                t_end,
                rng,
                stats[i],
                probes.get(node_id),
                cfg.get("probe_window_s", 10),
            )
        except grpc.aio.AioRpcError as exc:
            key = exc.code().name
            stats[i].errors[key] = stats[i].errors.get(key, 0) + 1
        except Exception as exc:
            key = type(exc).__name__
            stats[i].errors[key] = stats[i].errors.get(key, 0) + 1

    await asyncio.gather(*(drive(i) for i in range(len(opened))))
    for _, _, call, _ in opened:
        call.cancel()
    await asyncio.gather(*(ch.close(grace=None) for _, ch, _, _ in opened), return_exceptions=True)
    for s in stats:
        for k, v in s.errors.items():
            errors[k] = errors.get(k, 0) + v
    results.put(
        (
            "done",
            cfg["worker"],
            {
                "acked_in_window": sum(s.acked_in_window for s in stats),
                "latencies": [x for s in stats for x in s.latencies],
                "hello_rtt": hello_rtt,
                "events_sent": sum(s.events_sent for s in stats),
                "sent_in_window": sum(s.sent_in_window for s in stats),
                "delta_streams": sum(1 for o in opened if o[3]),
                "probe_windows": sum(s.probe_windows for s in stats),
                "errors": errors,
            },
        )
    )


def worker(cfg: dict[str, Any], control: Any, results: Any) -> None:
    from bench.common import quiet_logging

    quiet_logging()
    asyncio.run(worker_main(cfg, control, results))
