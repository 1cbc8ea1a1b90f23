"""One controller, thousands of simulated agents: sustained ingest, report->decision latency, CPU, RSS.

The controller runs as its own process (``python -m starpulse.app.cli controller``). Load comes
from ``--workers`` processes (``bench.loadgen``), each with many grpc.aio streams, one
channel (TCP connection) per simulated node. Each node has 8 GPUs and 9 NIC ports, sends
real reports whose counters move, every ``--interval-s`` with jitter; ``--fault-pct`` of
them develop NIC error bursts and Xids, so detection opens conditions and incidents.

"Decision": the controller has validated the report, recorded it, and run detection on
it (the condition engine's opened/updated/resolved changes are committed and handed to the
correlator; grouping into incidents waits for the correlator's settle time by design).
Latency is from the report's timestamp to that point, read from the controller's
histogram ``starpulse_report_age_at_decision_seconds``: the load generator stamps each
report as it sends it, so this is arrival -> decision including every queue on the way
(same host, one clock). ``starpulse_ingest_seconds`` (read off the stream -> decision,
any message) is the processing share. Quantiles are interpolated inside histogram buckets.

    .venv/bin/python -m bench.scale [--quick] [--nodes 1000 4000 10000] [--duration-s 30]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import ProcSampler, free_port, percentile, quiet_logging, summed_errors, table, write_result
from bench.loadgen import Templates, build_templates, worker
from bench.relayload import relay_worker

NAME = "scale"


def start_controller(
    workdir: Path, extra: list[str], null: bool = False, cpus: set[int] | None = None
) -> tuple[subprocess.Popen[bytes], int, int, Path]:
    port, http = free_port(), free_port()
    log_path = workdir / "controller.log"
    cmd = [sys.executable, "-m", "bench.null_controller", str(port), *extra] if null else [
        sys.executable, "-m", "starpulse.app.cli", "controller",
        "--listen", f"127.0.0.1:{port}",
        "--http", f"127.0.0.1:{http}",
        "--db", str(workdir / "c.db"),
        "--heartbeat-timeout-s", "600",
        *extra,
    ]  # fmt: skip
    proc = _start_and_wait(cmd, log_path, "controller", lambda: _listens(port), cpus=cpus)
    return proc, port, http, log_path


def _listens(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def pinned_cpus() -> tuple[set[int], set[int]]:
    """--pin: the controller (with its shards) on the first CPU this bench may use, the load on the rest."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin needs at least 2 CPUs: one for the controller, the rest for the load")
    return {cpus[0]}, set(cpus[1:])


def pinned(cpus: set[int] | None, target: Callable[..., None], *args: Any) -> None:
    """A load process's entry: on ``cpus`` (before it starts any thread), then the target."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    target(*args)


def _start_and_wait(
    cmd: list[str],
    log_path: Path,
    what: str,
    ready: Callable[[], bool],
    timeout_s: float = 60.0,
    cpus: set[int] | None = None,
) -> subprocess.Popen[bytes]:
    """Start a service process logging to log_path; return once ready() (killed and raised otherwise).

    ``cpus``: the process runs on these CPUs only, set before it starts, so every thread and
    child process it makes (gRPC's, detection shards) inherits it.
    """
    if cpus:
        cmd = ["taskset", "-c", ",".join(map(str, sorted(cpus))), *cmd]  # util-linux: in every Debian
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}); see {log_path}")
        if ready():
            return proc
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{what} was not ready within {timeout_s:g} s; see {log_path}")


def start_relay(
    workdir: Path, controller_port: int, relay_id: str, linger_s: float, cpus: set[int] | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """A real `starpulse relay` process in front of the controller; returns once it holds its upstream."""
    port = free_port()
    log_path = workdir / f"{relay_id}.log"
    cmd = [
        sys.executable,
        "-m",
        "starpulse.app.cli",
        "relay",
        "--controller",
        f"127.0.0.1:{controller_port}",
        "--relay-id",
        relay_id,
        "--listen",
        f"127.0.0.1:{port}",
        "--linger-ms",
        str(linger_s * 1000),
        "--log-level",
        "info",
    ]
    proc = _start_and_wait(
        cmd, log_path, "relay", lambda: "relay_upstream_connected" in log_path.read_text(), cpus=cpus
    )
    return proc, port


def stop_controller(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def scrape(http_port: int) -> dict[str, float]:
    """Prometheus text -> {series: value} (only the lines this bench reads)."""
    out: dict[str, float] = {}
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return out
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(
            (
                "starpulse_ingest_seconds",
                "starpulse_report_age_at_decision_seconds",
                "starpulse_reports_received_total",
                "starpulse_incidents_open",
                "starpulse_periodic_seconds",
                "starpulse_stage_cpu_seconds",
                "starpulse_probe_results",
            )
        ):
            continue
        name, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            out[name] = float(value)
    return out


def time_fabric_view(http_port: int, until: float, every_s: float) -> list[float]:
    """Open the dashboard's fabric view (GET /api/fabric, probe health per cable included) every
    ``every_s`` until ``until``: its wall time, the controller's event loop answering it."""
    took: list[float] = []
    while time.time() + every_s < until:
        time.sleep(every_s)
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/api/fabric", timeout=30) as resp:
                resp.read()
        except OSError:
            continue
        took.append(time.perf_counter() - started)
    return took


def histogram_quantile(before: dict[str, float], after: dict[str, float], base: str, q: float) -> float:
    """q-quantile of the observations between two scrapes, interpolated inside its bucket (as Prometheus does)."""
    buckets: list[tuple[float, float]] = []
    for key, v in after.items():
        if key.startswith(base + "_bucket{"):
            le = key.split('le="', 1)[1].split('"', 1)[0]
            bound = math.inf if le == "+Inf" else float(le)
            buckets.append((bound, v - before.get(key, 0.0)))
    if not buckets:
        return float("nan")
    buckets.sort()
    total = buckets[-1][1]
    if total <= 0:
        return float("nan")
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= q * total:
            if math.isinf(bound) or count == below:
                return lower if math.isinf(bound) else bound
            return lower + (bound - lower) * (q * total - below) / (count - below)
        lower, below = bound, count
    return math.inf


def periodic_steps(before: dict[str, float], after: dict[str, float]) -> dict[str, dict[str, float]]:
    """Per periodic step (starpulse_periodic_seconds{step}): runs, mean ms, the bound its longest run fell under."""
    base = "starpulse_periodic_seconds"
    buckets: dict[str, list[tuple[float, float]]] = {}
    for key, v in after.items():
        if key.startswith(base + "_bucket{"):
            step = key.split('step="', 1)[1].split('"', 1)[0]
            le = key.split('le="', 1)[1].split('"', 1)[0]
            buckets.setdefault(step, []).append((math.inf if le == "+Inf" else float(le), v - before.get(key, 0.0)))
    out: dict[str, dict[str, float]] = {}
    for step, rows in buckets.items():
        rows.sort()
        labels = f'{{step="{step}"}}'
        runs = after.get(f"{base}_count{labels}", 0.0) - before.get(f"{base}_count{labels}", 0.0)
        spent = after.get(f"{base}_sum{labels}", 0.0) - before.get(f"{base}_sum{labels}", 0.0)
        longest = next((bound for bound, count in rows if count >= runs), math.inf) if runs else 0.0
        out[step] = {
            "runs": runs,
            "mean_ms": round(1000 * spent / runs, 2) if runs else float("nan"),
            "longest_under_ms": 1000 * longest,
        }
    return out


def cpu_split(
    before: dict[str, float], after: dict[str, float], ctl: dict[str, Any], reports: float
) -> dict[str, float]:
    """The controller's CPU per report, in microseconds, by where it went.

    From outside: the main process's event-loop thread and its other threads (gRPC's own:
    reading sockets, HTTP/2; SQLite's checkpoint), and each detection shard process. From the
    controller's ``starpulse_stage_cpu_seconds_total{process,stage}`` (controller.metrics.StageCpu):
    the loop's stages (a relay batch's hand-over, the shard frames out, the shards' verdicts
    applied (fail-slow fold, registry, histograms, acks), condition changes, the periodic
    sweep and fail-slow steps) and what each shard says of itself (its frames read and written,
    a report's decode and validation, the rules, fail-slow extraction, its tick). What the
    loop's thread spends outside its stages is asyncio, gRPC's reads into Python and HTTP.
    """
    if not reports:
        return {}
    us = 1e6 / reports
    out: dict[str, float] = {}
    loop = ctl.get("main_thread_cpu_s", 0.0)
    out["main: gRPC and other threads"] = (ctl.get("own_cpu_s", 0.0) - loop) * us
    staged = 0.0
    shards: dict[str, float] = {}
    prefix = "starpulse_stage_cpu_seconds_total{"
    for key, value in sorted(after.items()):
        if not key.startswith(prefix):
            continue
        process = key.split('process="', 1)[1].split('"', 1)[0]
        stage = key.split('stage="', 1)[1].split('"', 1)[0]
        spent = (value - before.get(key, 0.0)) * us
        if process == "main":
            out[f"main loop: {stage}"] = spent
            staged += spent
        else:
            shards[stage] = shards.get(stage, 0.0) + spent
    out["main loop: other (asyncio, gRPC reads, HTTP)"] = loop * us - staged
    out["shards, all (processes)"] = sum(ctl.get("children_cpu_s", {}).values()) * us
    for stage, spent in shards.items():
        out[f"shards: {stage}"] = spent
    if shards:
        out["shards: other (select, GC)"] = out["shards, all (processes)"] - sum(shards.values())
    return {k: round(v, 1) for k, v in out.items()}


def run_size(
    nodes: int,
    tpl: Templates,
    workdir: Path,
    workers: int,
    interval_s: float,
    jitter: float,
    duration_s: float,
    fault_pct: float,
    controller_args: list[str],
    delta: bool,
    null: bool = False,
    warmup_s: float | None = None,
    relays: int = 0,
    linger_s: float = 0.02,
    real_relays: bool = False,
    pin: bool = False,
    probe_results: bool = False,
    per_block: int = 32,
) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    ctl_cpus, load_cpus = pinned_cpus() if pin else (None, None)
    node_ids = [f"node-{i:05d}" for i in range(nodes)]
    probes: dict[str, list[bytes]] = {}
    probe_info: dict[str, Any] = {}
    if probe_results:
        from bench import probeload
        from controller.fabric.probeplan import ProbeConfig

        t0 = time.perf_counter()
        fabric = probeload.fabric_for(nodes, per_block)
        node_ids = sorted(fabric.nodes())
        controller_args = [*controller_args, *probeload.controller_args(workdir, fabric)]
        probes = probeload.payloads(fabric, node_ids)
        window_bytes = [len(v) for vs in probes.values() for v in vs]
        probe_info = {
            "fabric": fabric.summary(),
            "nodes_per_block": per_block,
            "probe_window_s": ProbeConfig().window_s,
            "probe_window_bytes_mean": round(sum(window_bytes) / max(1, len(window_bytes))),
            "probe_results_prepared_s": round(time.perf_counter() - t0, 1),
        }
    ctl, port, http, _log_path = start_controller(workdir, controller_args, null, ctl_cpus)
    relay_procs: list[subprocess.Popen[bytes]] = []
    relay_ports: list[int] = []
    if relays and real_relays:
        for r in range(relays):
            proc, rport = start_relay(workdir, port, f"bench-r{r}", linger_s, load_cpus)
            relay_procs.append(proc)
            relay_ports.append(rport)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    controls = [ctx.Queue() for _ in range(workers)]
    n_faulty = round(nodes * fault_pct / 100)
    faulty = set(node_ids[:: max(1, nodes // n_faulty)][:n_faulty]) if n_faulty else set()
    procs = []
    done: dict[int, dict[str, Any]] = {}
    try:
        base_rss = ProcSampler(ctl.pid).start().stop()["rss_mib_max"]
        connect_sampler = ProcSampler(ctl.pid).start()
        for w in range(workers):
            cfg = {
                "worker": w,
                "port": relay_ports[w % len(relay_ports)] if relay_ports else port,
                "relays": -(-relays // workers),
                "linger_s": linger_s,
                "node_ids": node_ids[w::workers],
                "faulty": sorted(faulty & set(node_ids[w::workers])),
                "templates": tpl,
                "interval_s": interval_s,
                "jitter": jitter,
                "delta": delta,
                "probes": {n: probes[n] for n in node_ids[w::workers] if n in probes},
                "probe_window_s": probe_info.get("probe_window_s", 10),
            }
            target = relay_worker if relays and not real_relays else worker
            p = ctx.Process(target=pinned, args=(load_cpus, target, cfg, controls[w], results), daemon=True)
            p.start()
            procs.append(p)
        ready: dict[int, dict[str, Any]] = {}
        while len(ready) < workers:
            _, w, info = results.get(timeout=900)
            ready[w] = info
        connect = connect_sampler.stop()
        connect_wall = max(r["connect_s"] for r in ready.values())
        connected = sum(r["streams"] for r in ready.values())
        # every node's first report (counters' first sight) falls before the window; a longer
        # warm-up lets the controller drain the herd of first reports and measures steady state
        warmup = warmup_s if warmup_s is not None else interval_s + 2.0
        t_launch = time.time() + 0.5
        t_start = t_launch + warmup
        t_end = t_start + duration_s
        for q in controls:
            q.put((t_launch, t_start, t_end))
        time.sleep(max(0.0, t_start - time.time()))
        m0 = scrape(http)
        ctl_s = ProcSampler(ctl.pid).start()
        gen_s = [ProcSampler(p.pid).start() for p in procs if p.pid is not None]
        relay_s = [ProcSampler(p.pid).start() for p in relay_procs]
        view_s = time_fabric_view(http, t_end, 5.0) if probe_results else []
        time.sleep(max(0.0, t_end - time.time()))
        ctl_sum = ctl_s.stop()
        gen_sum = [g.stop() for g in gen_s]
        relay_sum = [r.stop() for r in relay_s]
        m1 = scrape(http)
        while len(done) < workers:
            kind, w, info = results.get(timeout=120)
            if kind == "done":
                done[w] = info
        for p in procs:
            p.join(15)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for rp in relay_procs:
            stop_controller(rp)
        stop_controller(ctl)
    acked = sum(d["acked_in_window"] for d in done.values())
    hello = [x * 1000 for d in done.values() for x in d["hello_rtt"]]
    rtt = [x * 1000 for d in done.values() for x in d["latencies"]]
    errors = summed_errors(done.values())
    dec = "starpulse_ingest_seconds"
    age = "starpulse_report_age_at_decision_seconds"
    decided = m1.get(f"{dec}_count", 0.0) - m0.get(f"{dec}_count", 0.0)
    sent = sum(d["sent_in_window"] for d in done.values())
    if not decided and not null:  # a controller without the decision histogram: count acks
        decided = acked
    rate = (sent if null else decided) / duration_s
    cpu_frac = ctl_sum["cpu_pct_of_one_core"] / 100
    incidents = sum(v for k, v in m1.items() if k.startswith("starpulse_incidents_open"))
    if probe_results:
        got = m1.get("starpulse_probe_results_total", 0.0) - m0.get("starpulse_probe_results_total", 0.0)
        probe_info["probe_windows_sent"] = sum(d.get("probe_windows", 0) for d in done.values())
        probe_info["probe_results_decided_per_s"] = round(got / duration_s, 1)
        probe_info["fabric_view_s"] = [round(x, 3) for x in view_s]
    return {
        "nodes": nodes,
        "controller": "null (protocol only)" if null else "starpulse",
        "reports_sent_per_s": round(sent / duration_s, 1),
        "streams_connected": connected,
        "faulty_nodes": len(faulty),
        "interval_s": interval_s,
        "jitter": jitter,
        "duration_s": duration_s,
        "warmup_s": warmup,
        "workers": workers,
        "expected_reports_per_s": round(nodes / interval_s, 1),
        "reports_per_s": round(rate, 1),
        "samples_per_s": round(rate * (tpl.gpus + tpl.nics), 1),
        "delta_reports": delta and sum(d.get("delta_streams", 0) for d in done.values()) > 0,
        "report_bytes_mean": tpl.delta_report_bytes
        if delta and sum(d.get("delta_streams", 0) for d in done.values())
        else tpl.report_bytes,
        # report timestamp (set by the load generator as it sends) -> decision committed
        "latency_ms_p50": round(1000 * histogram_quantile(m0, m1, age, 0.50), 2),
        "latency_ms_p99": round(1000 * histogram_quantile(m0, m1, age, 0.99), 2),
        "latency_ms_p999": round(1000 * histogram_quantile(m0, m1, age, 0.999), 2),
        # the controller's periodic steps, each holding its event loop while it runs
        "periodic": periodic_steps(m0, m1),
        # read off the stream -> decision committed (processing only, no queueing)
        "processing_ms_p50": round(1000 * histogram_quantile(m0, m1, dec, 0.50), 3),
        "processing_ms_p99": round(1000 * histogram_quantile(m0, m1, dec, 0.99), 3),
        "decisions_in_window": m1.get(f"{dec}_count", 0.0) - m0.get(f"{dec}_count", 0.0),
        "acked_reports_in_window": acked,
        # report -> ack round trip at the load generator: meaningful only for a controller
        # that acks every report (before report acks were spaced out; see README)
        "ack_rtt_ms_p50": round(percentile(rtt, 50), 2),
        "ack_rtt_ms_p99": round(percentile(rtt, 99), 2),
        "incidents_open_at_end": incidents,
        "controller_cpus": sorted(ctl_cpus) if ctl_cpus else "any",
        "controller_cpu_pct": ctl_sum["cpu_pct_of_one_core"],
        "controller_cpu_ms_per_report": round(1000 * cpu_frac / rate, 3) if rate else float("nan"),
        # the controller's own process; the rest of controller_cpu_pct is its detection shards
        "controller_main_cpu_pct": ctl_sum["own_cpu_pct_of_one_core"],
        # microseconds per decided report by where they went (cpu_split)
        "cpu_split_us_per_report": cpu_split(m0, m1, ctl_sum, decided),
        "controller_rss_mib_idle": base_rss,
        "controller_rss_mib_median": ctl_sum["rss_mib_median"],
        "controller_rss_mib_max": ctl_sum["rss_mib_max"],
        "load_generator_cpu_pct": [g["cpu_pct_of_one_core"] for g in gen_sum],
        # relays: 0 = every node its own stream to the controller; simulated relays are the
        # load processes speaking Relay.Connect; real relays are `starpulse relay` processes
        "relays": relays,
        "relays_real": bool(relay_procs),
        "relay_linger_ms": round(linger_s * 1000, 1) if relays else None,
        "relay_cpu_pct": [r["cpu_pct_of_one_core"] for r in relay_sum],
        "relay_cpu_ms_per_report": [
            round(10 * r["cpu_pct_of_one_core"] / (rate / len(relay_sum)), 3) for r in relay_sum
        ]
        if relay_sum and rate
        else [],
        "relay_rss_mib_max": [r["rss_mib_max"] for r in relay_sum],
        "load_generator_rss_mib_max": [g["rss_mib_max"] for g in gen_sum],
        "connect_wall_s": round(connect_wall, 2),
        "hellos_per_s": round(connected / connect_wall, 1) if connect_wall else float("nan"),
        "hello_rtt_ms_p99": round(percentile(hello, 99), 2),
        "controller_cpu_pct_during_connect": connect["cpu_pct_of_one_core"],
        "events_sent": sum(d["events_sent"] for d in done.values()),
        "reports_replaced": sum(d.get("reports_replaced", 0) for d in done.values()),
        "errors": errors,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "probes": probe_info or None,
    }


def _probe_rows(p: dict[str, Any] | None) -> list[tuple[str, Any]]:
    """The probe mesh's rows of a run's table (--probe-results)."""
    if not p:
        return []
    view = p.get("fabric_view_s") or []
    fab = p["fabric"]
    decided = f"{p['probe_windows_sent']} / {p['probe_results_decided_per_s']}"
    return [
        ("probes: fabric (nodes / leaves / spines)", f"{fab.get('node')} / {fab.get('leaf')} / {fab.get('spine')}"),
        ("probes: windows sent / results decided per s", decided),
        ("probes: one window's results, bytes (mean)", p["probe_window_bytes_mean"]),
        ("probes: fabric view (GET /api/fabric) s, each", view or "-"),
    ]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="500 nodes, 10 s window")
    ap.add_argument("--nodes", type=int, nargs="*", default=None, help="cluster sizes (1000 4000 10000)")
    ap.add_argument("--interval-s", type=float, default=5.0)
    ap.add_argument("--jitter", type=float, default=0.05, help="per-report interval jitter (fraction)")
    ap.add_argument("--duration-s", type=float, default=None, help="measurement window (30; quick 10)")
    ap.add_argument("--workers", type=int, default=2, help="load generator processes")
    ap.add_argument("--fault-pct", type=float, default=1.0, help="percent of nodes that develop faults")
    ap.add_argument("--controller-arg", action="append", default=[], help="extra controller CLI argument")
    ap.add_argument("--tag", default="", help="suffix for the result file (scale-<tag>.json)")
    ap.add_argument("--warmup-s", type=float, default=None, help="seconds before the window (interval + 2)")
    ap.add_argument("--no-delta", action="store_true", help="send full reports only (as agents before delta reports)")
    ap.add_argument("--full-every", type=int, default=12, help="delta reports: a full report every N")
    ap.add_argument(
        "--null-controller", action="store_true", help="load a protocol-only server (bench.null_controller)"
    )
    ap.add_argument(
        "--relays",
        type=int,
        default=0,
        help="carry the nodes through this many relays (Relay.Connect, batched); 0: direct streams",
    )
    ap.add_argument("--linger-ms", type=float, default=20.0, help="relays: a batch gathers this long")
    ap.add_argument(
        "--real-relays",
        action="store_true",
        help="with --relays: run real `starpulse relay` processes (their CPU is measured too) "
        "instead of load processes that speak the relay protocol themselves",
    )
    ap.add_argument(
        "--pin",
        action="store_true",
        help="the controller (threads and detection shards too) on one CPU, the load processes "
        "on the others: 'on one core' literally, and no load process competes with it",
    )
    ap.add_argument(
        "--detect-workers",
        type=int,
        default=0,
        help="run the controller with this many detection shards (controller --detect-workers)",
    )
    ap.add_argument(
        "--probe-results",
        action="store_true",
        help="every node's reports carry its probe plan's results (issue 29): the controller gets a "
        "declared 8-rail, 8-spine fabric with the probe mesh enabled, and the nodes are the fabric's",
    )
    ap.add_argument(
        "--per-block", type=int, default=32, help="with --probe-results: nodes per block (NICs under each leaf)"
    )
    args = ap.parse_args(argv)
    if args.per_block < 1:
        ap.error(f"--per-block must be >= 1, got {args.per_block}")
    if args.probe_results and args.null_controller:
        ap.error("--probe-results needs the real controller (not --null-controller)")
    if args.detect_workers:
        args.controller_arg = [*args.controller_arg, f"--detect-workers={args.detect_workers}"]
    sizes = args.nodes or ([500] if args.quick else [1000, 4000, 10000])
    duration = args.duration_s or (10.0 if args.quick else 30.0)
    quiet_logging()
    steps = int((duration + args.interval_s + 10) / (args.interval_s * (1 - args.jitter))) + 3
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sp-bench-scale-") as tmp:
        t0 = time.perf_counter()
        tpl = build_templates(Path(tmp) / "sim", steps, args.interval_s, args.full_every)
        took = time.perf_counter() - t0
        print(f"templates: {len(tpl.healthy.reports)} steps x {1 + len(tpl.faulty)} profiles in {took:.1f} s")
        for n in sizes:
            r = run_size(
                n,
                tpl,
                Path(tmp) / f"n{n}",
                args.workers,
                args.interval_s,
                args.jitter,
                duration,
                args.fault_pct,
                args.controller_arg,
                not args.no_delta,
                args.null_controller,
                args.warmup_s,
                args.relays,
                args.linger_ms / 1000,
                args.real_relays,
                args.pin,
                args.probe_results,
                args.per_block,
            )
            runs.append(r)
            rows: list[tuple[str, Any]] = [
                ("streams connected (faulty)", f"{r['streams_connected']} ({r['faulty_nodes']})"),
                ("reports decided/s (expected)", f"{r['reports_per_s']} ({r['expected_reports_per_s']})"),
                ("samples/s (GPU + NIC)", r["samples_per_s"]),
                ("report bytes, mean (delta reports)", f"{r['report_bytes_mean']} ({r['delta_reports']})"),
                (
                    "report->decision latency ms p50 / p99 / p99.9",
                    f"{r['latency_ms_p50']} / {r['latency_ms_p99']} / {r['latency_ms_p999']}",
                ),
                ("  of it processing ms p50 / p99", f"{r['processing_ms_p50']} / {r['processing_ms_p99']}"),
                ("report->ack RTT ms p50 / p99 (acks may be spaced)", f"{r['ack_rtt_ms_p50']} / {r['ack_rtt_ms_p99']}"),
                ("controller CPUs (--pin)", r["controller_cpus"]),
                ("controller CPU % of one core", r["controller_cpu_pct"]),
                ("controller CPU ms per report", r["controller_cpu_ms_per_report"]),
                ("  of it the main process, % of one core", r["controller_main_cpu_pct"]),
                *((f"  us per report, {where}", spent) for where, spent in r["cpu_split_us_per_report"].items()),
                (
                    "periodic steps: mean / longest under, ms",
                    ", ".join(f"{k} {v['mean_ms']} / {v['longest_under_ms']:g}" for k, v in r["periodic"].items()),
                ),
                (
                    "controller RSS MiB idle / median / max",
                    f"{r['controller_rss_mib_idle']} / {r['controller_rss_mib_median']}"
                    f" / {r['controller_rss_mib_max']}",
                ),
                ("load generators CPU % (each)", " / ".join(f"{x:.0f}" for x in r["load_generator_cpu_pct"])),
                ("connect: s for all streams (Hello/s)", f"{r['connect_wall_s']} ({r['hellos_per_s']})"),
                ("incidents open at end / events sent", f"{r['incidents_open_at_end']:.0f} / {r['events_sent']}"),
                ("relays (real) / linger ms", f"{r['relays']} ({r['relays_real']}) / {r['relay_linger_ms']}"),
                ("relays CPU % (each) / ms per report", f"{r['relay_cpu_pct']} / {r['relay_cpu_ms_per_report']}"),
                ("stream errors", r["errors"] or "none"),
                *_probe_rows(r["probes"]),
                ("load average (1/5/15)", r["load_average"]),
            ]
            print(
                table(
                    f"scale ({r['controller']}): {n} nodes every {args.interval_s:g} s, {duration:.0f} s window", rows
                )
            )
            print()
    params = {
        "quick": args.quick,
        "nodes": sizes,
        "interval_s": args.interval_s,
        "jitter": args.jitter,
        "duration_s": duration,
        "workers": args.workers,
        "fault_pct": args.fault_pct,
        "controller_args": args.controller_arg,
        "delta_reports": not args.no_delta,
        "full_every": args.full_every,
        "null_controller": args.null_controller,
        "warmup_s": args.warmup_s,
        "relays": args.relays,
        "linger_ms": args.linger_ms,
        "real_relays": args.real_relays,
        "pin": args.pin,
        "probe_results": args.probe_results,
        "per_block": args.per_block if args.probe_results else None,
    }
    path = write_result(NAME + (f"-{args.tag}" if args.tag else ""), params, {"runs": runs})
    print(f"wrote {path}")
    return {"runs": runs}


if __name__ == "__main__":
    main()
