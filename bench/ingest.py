"""Controller ingest: reports/s and samples/s one controller process accepts, and paced round-trip latency.

The controller runs as its own process (``python -m starpulse.app.cli controller``, the
production entry point). Load comes from 2 worker processes, each running grpc.aio with
many concurrent agent streams (one channel, i.e. one TCP connection, per stream, as real
agents have). Every stream opens with a Hello carrying a real 8-GPU / 9-NIC inventory and
then sends copies of one real Report (taken from a SimNode collect cycle), seq and
timestamp bumped. Only reports the controller acked (Ack.report_seq) are counted.

* flood: each stream keeps up to --window reports unacked and sends as fast as acks come
  back (capped at 150 msgs/s per stream, under the controller's 200/s per-node limit).
* paced: --nodes streams report every --interval-s (random phase); report->ack round trip.

The load generators pre-encode each message (template bytes + the two changed fields) so
that as much of the 2 cores as possible is left to the controller; the controller still
decodes, validates and records every message in full.

    .venv/bin/python -m bench.ingest [--quick] [--streams 200 1000] [--nodes 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    ProcSampler,
    free_port,
    median,
    open_stream,
    percentile,
    quiet_logging,
    read_acks,
    summed_errors,
    table,
    write_result,
)

NAME = "ingest"
WORKERS = 2
PER_STREAM_CAP_PER_S = 150.0


# -- message encoding ------------------------------------------------------------------------
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode_report(template: bytes, seq: int, ts_ms: int) -> bytes:
    """AgentMessage{report: template + seq (field 1) + timestamp_ms (field 2)} as wire bytes.

    Field order does not matter in protobuf; proto3 left seq/timestamp out of the template
    (they were zero), so prefixing them yields exactly the message a full encode would.
    """
    body = b"\x08" + _varint(seq) + b"\x10" + _varint(ts_ms) + template
    return b"\x12" + _varint(len(body)) + body


def build_templates(workdir: Path) -> tuple[bytes, bytes, int, int]:
    """(report template bytes, inventory bytes, gpu samples, nic samples) from a real sim cycle."""
    from agent.factory import build_collectors
    from agent.runtime import CollectorSet
    from agent.sim.node import SimNode
    from starpulse.v1 import telemetry_pb2 as tpb

    sim = SimNode("node-000", workdir, gpus=8, nics=8)
    plan = build_collectors("sim", sink=lambda f: None, sim=sim)
    cs = CollectorSet(plan.collectors)
    cs.probe()
    inv = cs.describe()
    for hook in plan.inventory_hooks:
        hook(inv)
    report = tpb.Report()
    for seq in (1, 2):
        sim.advance(5.0)
        report = cs.collect(seq).report
    cs.close()
    report.seq = 0
    report.timestamp_ms = 0
    return report.SerializeToString(), inv.SerializeToString(), len(report.gpus), len(report.nics)


# -- load generator (worker process) ---------------------------------------------------------
class StreamStats:
    def __init__(self) -> None:
        self.acked_in_window = 0
        self.latencies: list[float] = []
        self.errors: dict[str, int] = {}


async def _flood(call: Any, template: bytes, window: int, t_start: float, t_end: float, st: StreamStats) -> None:
    import grpc

    acked = 0
    sent = 0
    moved = asyncio.Event()

    async def reader() -> None:
        nonlocal acked
        while True:
            msg = await call.read()
            if msg is grpc.aio.EOF:
                return
            if msg.HasField("ack") and msg.ack.report_seq > acked:
                now = time.time()
                if t_start <= now <= t_end:
                    st.acked_in_window += msg.ack.report_seq - acked
                acked = msg.ack.report_seq
                moved.set()

    rd = asyncio.create_task(reader())
    gap = 1.0 / PER_STREAM_CAP_PER_S
    next_at = time.monotonic()
    try:
        while time.time() < t_end and not rd.done():
            if sent - acked >= window:
                moved.clear()
                await moved.wait()
                continue
            now = time.monotonic()
            if now < next_at:
                await asyncio.sleep(next_at - now)
            next_at = max(next_at + gap, time.monotonic() - 1.0)
            sent += 1
            await call.write(encode_report(template, sent, int(time.time() * 1000)))
        # Let the last acks in.
        deadline = time.monotonic() + 2.0
        while acked < sent and time.monotonic() < deadline and not rd.done():
            moved.clear()
            try:
                await asyncio.wait_for(moved.wait(), timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                break
        if rd.done() and rd.exception() is not None:
            raise rd.exception()  # type: ignore[misc]
    finally:
        rd.cancel()


async def _paced(
    call: Any, template: bytes, interval_s: float, first_at: float, t_start: float, t_end: float, st: StreamStats
) -> None:
    sent_at: dict[int, float] = {}
    rd = asyncio.create_task(read_acks(call, sent_at, t_start, t_end, st))
    seq = 0
    try:
        next_at = first_at  # the warm-up (one interval) takes each node's first report
        while not rd.done():
            await asyncio.sleep(max(0.0, next_at - time.time()))
            if time.time() >= t_end:
                break
            seq += 1
            payload = encode_report(template, seq, int(time.time() * 1000))
            if time.time() >= t_start:
                sent_at[seq] = time.perf_counter()
            await call.write(payload)
            next_at += interval_s
        await asyncio.wait({rd}, timeout=3.0)  # the last acks; the stream stays open until cancelled
    finally:
        rd.cancel()


async def _worker_main(cfg: dict[str, Any], control: Any, results: Any) -> None:
    import grpc

    ids: list[str] = cfg["node_ids"]
    sem = asyncio.Semaphore(64)
    opened: list[tuple[Any, Any]] = []
    hello_rtt: list[float] = []
    errors: dict[str, int] = {}

    async def open_one(node_id: str) -> None:
        async with sem:
            try:
                ch, call, rtt, _ = await open_stream(cfg["port"], node_id, cfg["inventory"], "bench")
            except Exception as exc:
                key = type(exc).__name__
                errors[key] = errors.get(key, 0) + 1
                return
            opened.append((ch, call))
            hello_rtt.append(rtt)

    t0 = time.perf_counter()
    await asyncio.gather(*(open_one(n) for n in ids))
    connect_s = time.perf_counter() - t0
    results.put(("ready", cfg["worker"], {"connect_s": connect_s, "streams": len(opened)}))
    t_launch, t_start, t_end = await asyncio.to_thread(control.get)

    stats = [StreamStats() for _ in opened]
    rng = random.Random(cfg["worker"])

    async def drive(i: int) -> None:
        _, call = opened[i]
        try:
            if cfg["mode"] == "flood":
                await _flood(call, cfg["template"], cfg["window"], t_start, t_end, stats[i])
            else:
                phase = rng.uniform(0, cfg["interval_s"])
                await _paced(call, cfg["template"], cfg["interval_s"], t_launch + phase, t_start, t_end, stats[i])
        except grpc.aio.AioRpcError as exc:
            key = exc.code().name
            stats[i].errors[key] = stats[i].errors.get(key, 0) + 1
        except Exception as exc:
            key = type(exc).__name__
            stats[i].errors[key] = stats[i].errors.get(key, 0) + 1

    await asyncio.gather(*(drive(i) for i in range(len(opened))))
    for _, call in opened:
        call.cancel()
    await asyncio.gather(*(ch.close(grace=None) for ch, _ in opened), return_exceptions=True)
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
                "errors": errors,
            },
        )
    )


def worker(cfg: dict[str, Any], control: Any, results: Any) -> None:
    quiet_logging()
    asyncio.run(_worker_main(cfg, control, results))


# -- controller process ----------------------------------------------------------------------
def start_controller(workdir: Path) -> tuple[subprocess.Popen[bytes], int, Path]:
    port = free_port()
    log_path = workdir / "controller.log"
    cmd = [
        sys.executable, "-m", "starpulse.app.cli", "controller",
        "--listen", f"127.0.0.1:{port}",
        "--http", "127.0.0.1:0",
        "--db", str(workdir / "c.db"),
        "--heartbeat-timeout-s", "600",
    ]  # fmt: skip
    # This bench counts acked reports, so the controller acks every report (it spaces report
    # acks out to one per 10 s by default; bench.scale measures decisions instead).
    config = workdir / "controller.yaml"
    config.write_text("ingest:\n  report_ack_interval_s: 0\n")
    cmd += ["--config", str(config)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"controller exited ({proc.returncode}); see {log_path}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, port, log_path
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("controller did not listen within 30 s")


def stop_controller(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_scenario(
    mode: str,
    streams: int,
    duration_s: float,
    warmup_s: float,
    templates: tuple[bytes, bytes, int, int],
    workdir: Path,
    window: int = 8,
    interval_s: float = 5.0,
) -> dict[str, Any]:
    template, inventory, gpus, nics = templates
    workdir.mkdir(parents=True, exist_ok=True)
    ctl, port, log_path = start_controller(workdir)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    controls = [ctx.Queue() for _ in range(WORKERS)]
    node_ids = [f"node-{i:04d}" for i in range(streams)]
    procs = []
    try:
        ctl_sampler_connect = ProcSampler(ctl.pid).start()
        t_connect = time.monotonic()
        for w in range(WORKERS):
            cfg = {
                "worker": w,
                "port": port,
                "node_ids": node_ids[w::WORKERS],
                "inventory": inventory,
                "template": template,
                "mode": mode,
                "window": window,
                "interval_s": interval_s,
            }
            p = ctx.Process(target=worker, args=(cfg, controls[w], results), daemon=True)
            p.start()
            procs.append(p)
        ready: dict[int, dict[str, Any]] = {}
        while len(ready) < WORKERS:
            kind, w, info = results.get(timeout=180)
            ready[w] = info
        connect_wall = max(r["connect_s"] for r in ready.values())  # inside the workers: no spawn/import
        spawn_and_connect_wall = time.monotonic() - t_connect
        connect_ctl = ctl_sampler_connect.stop()
        connected = sum(r["streams"] for r in ready.values())
        t_start = time.time() + 0.2 + warmup_s
        t_end = t_start + duration_s
        t_launch = time.time() + 0.2
        for q in controls:
            q.put((t_launch, t_start, t_end))
        time.sleep(max(0.0, t_start - time.time()))
        ctl_s = ProcSampler(ctl.pid).start()
        gen_s = [ProcSampler(p.pid).start() for p in procs if p.pid is not None]
        time.sleep(max(0.0, t_end - time.time()))
        ctl_sum = ctl_s.stop()
        gen_sum = [g.stop() for g in gen_s]
        done: dict[int, dict[str, Any]] = {}
        while len(done) < WORKERS:
            kind, w, info = results.get(timeout=60)
            if kind == "done":
                done[w] = info
        for p in procs:
            p.join(10)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        stop_controller(ctl)
    acked = sum(d["acked_in_window"] for d in done.values())
    lat = [x * 1000 for d in done.values() for x in d["latencies"]]
    hello = [x * 1000 for d in done.values() for x in d["hello_rtt"]]
    errors = summed_errors(done.values())
    rate = acked / duration_s
    cpu_frac = ctl_sum["cpu_pct_of_one_core"] / 100
    out: dict[str, Any] = {
        "mode": mode,
        "streams": streams,
        "streams_connected": connected,
        "duration_s": duration_s,
        "connect_wall_s": round(connect_wall, 2),
        "spawn_and_connect_wall_s": round(spawn_and_connect_wall, 2),
        "hellos_per_s": round(connected / connect_wall, 1) if connect_wall else float("nan"),
        "hello_rtt_ms_p50": round(percentile(hello, 50), 2),
        "hello_rtt_ms_p99": round(percentile(hello, 99), 2),
        "controller_cpu_pct_during_connect": connect_ctl["cpu_pct_of_one_core"],
        "reports_acked": acked,
        "reports_per_s": round(rate, 1),
        "samples_per_s": round(rate * (gpus + nics), 1),
        "gpu_samples_per_report": gpus,
        "nic_samples_per_report": nics,
        "report_bytes": len(template) + 12,
        "ingest_mb_per_s": round(rate * (len(template) + 12) / 1e6, 2),
        "controller_cpu_pct": ctl_sum["cpu_pct_of_one_core"],
        "controller_rss_mib_median": ctl_sum["rss_mib_median"],
        "controller_rss_mib_max": ctl_sum["rss_mib_max"],
        "reports_per_controller_cpu_s": round(rate / cpu_frac, 1) if cpu_frac > 0 else float("nan"),
        "controller_cpu_ms_per_report": round(1000 * cpu_frac / rate, 3) if rate else float("nan"),
        "load_generator_cpu_pct": [g["cpu_pct_of_one_core"] for g in gen_sum],
        "errors": errors,
        "controller_log": str(log_path),
    }
    if mode == "flood":
        out["window"] = window
    else:
        out["interval_s"] = interval_s
        out["expected_reports_per_s"] = round(streams / interval_s, 1)
        out["rtt_samples"] = len(lat)
        out["rtt_ms_p50"] = round(percentile(lat, 50), 2)
        out["rtt_ms_p99"] = round(percentile(lat, 99), 2)
        out["rtt_ms_max"] = round(max(lat), 2) if lat else float("nan")
        out["rtt_ms_median"] = round(median(lat), 2)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.ingest", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="200 flood streams, 8 s windows, 500 paced nodes")
    ap.add_argument("--streams", type=int, nargs="*", default=None, help="flood stream counts (200 1000)")
    ap.add_argument("--nodes", type=int, default=None, help="paced nodes (1000; quick 500); 0 skips")
    ap.add_argument("--interval-s", type=float, default=5.0, help="paced report interval")
    ap.add_argument("--duration-s", type=float, default=None, help="flood window (10; quick 8)")
    ap.add_argument("--paced-duration-s", type=float, default=None, help="paced window (20; quick 10)")
    ap.add_argument("--window", type=int, default=8, help="flood: unacked reports per stream")
    args = ap.parse_args(argv)
    streams = args.streams if args.streams is not None else ([200] if args.quick else [200, 1000])
    nodes = args.nodes if args.nodes is not None else (500 if args.quick else 1000)
    duration = args.duration_s or (8.0 if args.quick else 10.0)
    paced_duration = args.paced_duration_s or (10.0 if args.quick else 20.0)
    quiet_logging()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sp-bench-ingest-") as tmp:
        templates = build_templates(Path(tmp) / "sim")
        for m in streams:
            runs.append(run_scenario("flood", m, duration, 2.0, templates, Path(tmp) / f"flood-{m}", args.window))
        if nodes:
            paced_dir = Path(tmp) / "paced"
            warmup = args.interval_s
            runs.append(
                run_scenario("paced", nodes, paced_duration, warmup, templates, paced_dir, interval_s=args.interval_s)
            )
    for r in runs:
        r.pop("controller_log", None)
        title = (
            f"ingest flood: {r['streams']} streams x window {r['window']}, {r['duration_s']:.0f} s"
            if r["mode"] == "flood"
            else f"ingest paced: {r['streams']} nodes every {r['interval_s']:g} s, {r['duration_s']:.0f} s"
        )
        rows: list[tuple[str, Any]] = [
            ("streams connected", r["streams_connected"]),
            ("connect: Hello->Welcome/s (all streams)", r["hellos_per_s"]),
            ("connect: Hello RTT ms p50 / p99", f"{r['hello_rtt_ms_p50']} / {r['hello_rtt_ms_p99']}"),
            ("reports acked/s", r["reports_per_s"]),
            ("samples/s (GPU + NIC)", r["samples_per_s"]),
            ("ingest MB/s (report bytes)", r["ingest_mb_per_s"]),
            ("controller CPU % of one core", r["controller_cpu_pct"]),
            ("controller CPU ms per report", r["controller_cpu_ms_per_report"]),
            ("reports per controller CPU-second", r["reports_per_controller_cpu_s"]),
            ("controller RSS MiB median / max", f"{r['controller_rss_mib_median']} / {r['controller_rss_mib_max']}"),
            ("load generators CPU % (each)", " / ".join(f"{x:.0f}" for x in r["load_generator_cpu_pct"])),
            ("stream errors", r["errors"] or "none"),
        ]
        if r["mode"] == "paced":
            rows.insert(3, ("expected reports/s", r["expected_reports_per_s"]))
            rows.insert(
                4, ("report->ack RTT ms p50 / p99 / max", f"{r['rtt_ms_p50']} / {r['rtt_ms_p99']} / {r['rtt_ms_max']}")
            )
            rows.insert(5, ("RTT samples", r["rtt_samples"]))
        print(table(title, rows))
        print()
    params = {
        "quick": args.quick,
        "flood_streams": streams,
        "paced_nodes": nodes,
        "interval_s": args.interval_s,
        "flood_duration_s": duration,
        "paced_duration_s": paced_duration,
        "window": args.window,
        "load_workers": WORKERS,
        "per_stream_cap_per_s": PER_STREAM_CAP_PER_S,
        "cores": os.cpu_count(),
    }
    path = write_result(NAME, params, {"runs": runs})
    print(f"wrote {path}")
    return {"runs": runs}


if __name__ == "__main__":
    main()
