"""Agent collection cost per cycle on a simulated 8-GPU / 9-NIC node, and a real agent's footprint.

Part 1 (in process): the sim backend's collectors (the same classes that read NVML and
/sys on hardware, pointed at a fake NVML and a fake sysfs tree) run N cycles of
``sim.advance(1.0)`` + ``CollectorSet.collect(seq)``. The simulator's advance is timed
separately: it is the fake hardware moving its counters, a cost a real node does not pay.

Part 2 (subprocess): ``starpulse agent --backend sim --interval-s 1`` (build_agent +
AgentConfig, exactly the production entry point) streams to a controller running in
this process; its CPU and RSS are sampled from outside with psutil.

The simulator costs the agent process CPU a real node does not pay: ``sim.advance`` and
the fake NVML's Python (a real node pays NVML's C calls instead, not measurable here).
Both are measured in process (the fake NVML's methods timed with the thread's CPU clock
in a separate tiered pass) and subtracted for the "without the simulator" figure, which
is the one the agent's < 1 % target is judged on.

With ``--probes`` (issue 29) both parts run again with the probe mesh on, side by side with
the runs without. Part 1: the agent's real ``Prober`` runs on loopback at the default budget
(8 rail NICs, each probing 4 peers over 33 flows, answered by a peer prober in a child
process, ``bench.probe_cpu``'s plan); each cycle takes its results as the agent's loop does,
and one report in ``window_s`` (10 at a 1 s interval) carries a window of real results (the
second window the prober closed: the cycles run faster than real time). The prober thread's
own CPU is read per thread (psutil) over the cycles, and the cycle's core share with probes
adds it. Part 2: the controller declares a two-node fabric (one node per block, 8 rails, rail
addresses on loopback) with the mesh enabled, two ``starpulse agent`` processes get their
plans on their streams and probe each other; the first is measured as without probes.

    .venv/bin/python -m bench.agent_cycle [--quick] [--cycles N] [--agent-seconds S] [--probes]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from bench.common import ProcSampler, free_port, median, percentile, quiet_logging, table, write_result
from starpulse.core.clock import SYSTEM_CLOCK

NAME = "agent_cycle"


def _time_fake_nvml(fake: Any) -> dict[str, float]:
    """Wrap every nvml* method of one FakeNvml instance to add up its thread CPU time.

    The wrapper's own clock reads are calibrated on a no-op and subtracted per call.
    """
    spent = {"s": 0.0, "calls": 0.0}
    clock = time.thread_time

    def wrap(fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                spent["s"] += clock() - t0
                spent["calls"] += 1

        return timed

    noop = wrap(lambda: None)
    n = 20_000
    for _ in range(n):
        noop()
    spent["overhead_per_call_s"] = spent["s"] / n
    spent["s"] = spent["calls"] = 0.0
    for name in dir(type(fake)):
        if name.startswith("nvml") and callable(getattr(fake, name)) and not name.startswith("nvmlEventSetWait"):
            setattr(fake, name, wrap(getattr(fake, name)))
    return spent


class LoopbackProbes:
    """The agent's real prober at the default budget on loopback, answered by a peer process."""

    def __init__(self) -> None:
        from agent.probe.prober import Prober
        from bench.probe_cpu import free_udp_port, peer_main, plan_for
        from controller.fabric.probeplan import ProbeConfig

        self.config = ProbeConfig()
        port = free_udp_port()
        pps = self.config.packets_per_s_per_nic
        self._peer = mp.get_context("spawn").Process(target=peer_main, args=(port, pps, 3600.0), daemon=True)
        self._peer.start()
        self.prober = Prober(seed=1)
        self.prober.start()
        self.prober.apply(plan_for(0, 1, port, pps, 30000))
        self.window: list[Any] = []
        self._cpu0 = self._wall0 = 0.0
        self._sent0 = self._answered0 = 0

    def first_window(self) -> list[Any]:
        """Wait for the prober's second closed window (its results are what a report carries): the
        first overlaps the peer process's start, whose unanswered probes are each reported alone."""
        deadline = time.monotonic() + 3 * self.config.window_s + 10
        windows = 0
        while windows < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
            got = self.prober.take_results()
            if got:
                windows += 1
                self.window = got
        if windows < 2:
            raise RuntimeError("the prober closed no two windows (is loopback UDP blocked?)")
        return self.window

    def _thread_cpu(self) -> float:
        ids = {t.native_id for t in threading.enumerate() if t.name == "prober"}
        return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id in ids)

    def mark(self) -> None:
        self._cpu0, self._wall0 = self._thread_cpu(), time.perf_counter()
        self._sent0, self._answered0 = self.prober.sent_total, self.prober.answered_total

    def since_mark(self) -> dict[str, float]:
        wall = time.perf_counter() - self._wall0
        return {
            "prober_thread_cpu_pct": round(100 * (self._thread_cpu() - self._cpu0) / wall, 3),
            "probes_sent_per_s": round((self.prober.sent_total - self._sent0) / wall, 1),
            "probes_answered_per_s": round((self.prober.answered_total - self._answered0) / wall, 1),
        }

    def close(self) -> None:
        self.prober.stop()
        self._peer.terminate()
        self._peer.join(10)


def bench_cycles(
    cycles: int, workdir: Path, full_every: int = 1, time_fake_nvml: bool = False, probes: bool = False
) -> dict[str, Any]:
    """Time collection cycles; with full_every N, slow counters are read fully every Nth cycle only.

    That emulates ``AgentConfig.counters_every_s`` at a 1 s interval (N = counters_every_s)
    without waiting real seconds between cycles. ``probes``: the real prober runs beside the
    cycles (LoopbackProbes) and its results ride in the reports as the agent's loop puts them.
    """
    from agent.factory import build_collectors
    from agent.runtime import CollectorSet
    from agent.sim.node import SimNode
    from agent.transport.delta import ReportDelta
    from starpulse.v1 import service_pb2 as spb

    sim = SimNode("node-000", workdir / "sim", gpus=8, nics=8)
    findings: list[Any] = []
    plan = build_collectors("sim", sink=findings.append, sim=sim)
    cs = CollectorSet(plan.collectors)
    cs.probe()
    inventory = cs.describe()
    for hook in plan.inventory_hooks:
        hook(inventory)
    fake_nvml = _time_fake_nvml(sim.nvml) if time_fake_nvml else None
    mesh = LoopbackProbes() if probes else None
    window: list[Any] = mesh.first_window() if mesh is not None else []
    every = mesh.config.window_s if mesh is not None else 0  # a 1 s agent's reports per window
    cpu_probes: list[float] = []
    carrying: list[int] = []
    # this thread's CPU per cycle (collect, results, encode): process time also counts the
    # prober's thread (and any collector's), which the probe figures give on their own
    thread_cycle: list[float] = []

    warmup = 5
    wall_total: list[float] = []
    wall_collect: list[float] = []
    wall_advance: list[float] = []
    cpu_collect: list[float] = []
    cpu_advance: list[float] = []
    per_collector: dict[str, list[float]] = {}
    size = 0
    msg_size = 0
    gpus = nics = 0
    tiered = [c for c in plan.collectors if hasattr(c, "slow_every_s")]
    fake_s = fake_calls = 0.0
    # What the link does with each report on a stream that takes deltas (a full one every 12th).
    encoder = ReportDelta()
    encoder.reset(enabled=True)
    cpu_encode: list[float] = []
    delta_size: list[int] = []
    if mesh is not None:
        mesh.mark()
    for seq in range(1, warmup + cycles + 1):
        for c in tiered:
            c.slow_every_s = 0.0 if seq % full_every == 0 else 1e9
        if fake_nvml is not None and seq == warmup + 1:
            fake_nvml["s"] = fake_nvml["calls"] = 0.0
        c0, w0 = time.process_time(), time.perf_counter()
        sim.advance(1.0)
        c1, w1 = time.process_time(), time.perf_counter()
        t1 = time.thread_time()
        result = cs.collect(seq)
        c2, w2 = time.process_time(), time.perf_counter()
        if mesh is not None:  # what Agent.run does after each cycle
            mesh.prober.take_results()
            if seq % every == 0:
                result.report.probe_results.extend(window)
        c2p = time.process_time()
        out = spb.AgentMessage()
        encoder.encode_into(result.report, out.report)
        c3 = time.process_time()
        t3 = time.thread_time()
        if seq <= warmup:
            continue
        thread_cycle.append(t3 - t1)
        if mesh is not None:
            cpu_probes.append(c2p - c2)
            if seq % every == 0:
                carrying.append(out.ByteSize())
        cpu_encode.append(c3 - c2p)
        delta_size.append(out.ByteSize())
        wall_advance.append(w1 - w0)
        wall_collect.append(w2 - w1)
        wall_total.append(w2 - w0)
        cpu_advance.append(c1 - c0)
        cpu_collect.append(c2 - c1)
        for st in result.report.collectors:
            per_collector.setdefault(st.name, []).append(st.duration_s)
        size = result.report.ByteSize()
        msg_size = spb.AgentMessage(report=result.report).ByteSize()
        gpus, nics = len(result.report.gpus), len(result.report.nics)
    if fake_nvml is not None:
        fake_calls = fake_nvml["calls"] / cycles
        fake_s = (fake_nvml["s"] - fake_nvml["calls"] * fake_nvml["overhead_per_call_s"]) / cycles
    ru = resource.getrusage(resource.RUSAGE_SELF)
    cs.close()
    ms = 1000.0
    cpu_ms = median(cpu_collect) * ms
    probe_figures: dict[str, Any] = {}
    if mesh is not None:
        probe_figures = mesh.since_mark()
        mesh.close()
        probe_figures.update(
            {
                "probe_results_per_window": len(window),
                "probe_results_into_report_cpu_ms_mean": round(sum(cpu_probes) / len(cpu_probes) * ms, 4),
                "agent_message_bytes_carrying_a_window_mean": round(sum(carrying) / max(1, len(carrying))),
                # the cycle (collect, results into the report, delta encode; its own thread) plus the prober's
                "core_share_pct_at_1s_interval_with_prober": round(
                    sum(thread_cycle) / len(thread_cycle) * 100 + probe_figures["prober_thread_cpu_pct"], 2
                ),
            }
        )
    into = cpu_probes or [0.0] * len(cpu_collect)
    cycle_cpu = [a + b + c for a, b, c in zip(cpu_collect, into, cpu_encode, strict=True)]
    return {
        "probes": probe_figures or None,
        "cycle_cpu_ms_mean": round(sum(cycle_cpu) / len(cycle_cpu) * ms, 3),
        "cycle_thread_cpu_ms_mean": round(sum(thread_cycle) / len(thread_cycle) * ms, 3),
        "cycles": cycles,
        "full_counter_read_every_cycles": full_every,
        "gpus": gpus,
        "nics": nics,
        "inventory_bytes": inventory.ByteSize(),
        "report_bytes": size,
        "agent_message_bytes": msg_size,
        "collect_wall_ms_median": round(median(wall_collect) * ms, 3),
        "collect_wall_ms_p50": round(percentile(wall_collect, 50) * ms, 3),
        "collect_wall_ms_p99": round(percentile(wall_collect, 99) * ms, 3),
        "collect_cpu_ms_median": round(cpu_ms, 3),
        "collect_cpu_ms_mean": round(sum(cpu_collect) / len(cpu_collect) * ms, 3),
        "sim_advance_wall_ms_median": round(median(wall_advance) * ms, 3),
        "sim_advance_cpu_ms_median": round(median(cpu_advance) * ms, 3),
        "sim_advance_cpu_ms_mean": round(sum(cpu_advance) / len(cpu_advance) * ms, 3),
        "fake_nvml_calls_per_cycle": round(fake_calls, 1) if fake_nvml is not None else None,
        "fake_nvml_cpu_ms_per_cycle_mean": round(fake_s * ms, 3) if fake_nvml is not None else None,
        "delta_encode_cpu_ms_mean": round(sum(cpu_encode) / len(cpu_encode) * ms, 4),
        "agent_message_bytes_with_deltas_mean": round(sum(delta_size) / len(delta_size)),
        "cycle_wall_ms_median": round(median(wall_total) * ms, 3),
        "cycle_wall_ms_p99": round(percentile(wall_total, 99) * ms, 3),
        "per_collector_ms_median": {k: round(median(v) * ms, 3) for k, v in per_collector.items()},
        "core_share_pct_at_1s_interval": round(cpu_ms / 1000.0 * 100, 2),
        "core_share_pct_at_1s_interval_mean": round(sum(cpu_collect) / len(cpu_collect) / 1.0 * 100, 2),
        "core_share_pct_at_5s_interval": round(cpu_ms / 5000.0 * 100, 2),
        "bench_process_maxrss_mib": round(ru.ru_maxrss / 1024, 1),
        "bench_process_rss_mib": round(psutil.Process().memory_info().rss / 2**20, 1),
    }


class ThreadController:
    """A Controller on its own event loop in a thread of this process."""

    def __init__(self, workdir: Path, fabric: Any = None) -> None:
        """``fabric``: a declared fabric, and the probe mesh on over it (agents get plans)."""
        self.port = free_port()
        self.workdir = workdir
        self.fabric = fabric
        self.controller: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        from controller.detect.pipeline import DetectionConfig
        from controller.fabric.probeplan import ProbeConfig
        from controller.service import Controller, ControllerConfig

        detection = DetectionConfig(probes=ProbeConfig(enabled=self.fabric is not None))

        async def run() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            cfg = ControllerConfig(
                listen=f"127.0.0.1:{self.port}",
                http="127.0.0.1:0",
                db_path=self.workdir / "controller.db",
                heartbeat_timeout_s=600,
                grace_s=0.5,
                fabric=self.fabric,
                detection=detection,
            )
            self.controller = Controller(cfg, clock=SYSTEM_CLOCK)
            await self.controller.start()
            self._started.set()
            try:
                await self._stop.wait()
            finally:
                await self.controller.stop()

        asyncio.run(run())

    def start(self) -> None:
        self._thread.start()
        if not self._started.wait(30):
            raise RuntimeError("controller did not start")

    def reports_from(self, node_id: str) -> int:
        node = self.controller.registry.nodes.get(node_id)
        return int(node.acked_report_seq) if node is not None else 0

    def probe_results_from(self, node_id: str) -> tuple[int, int, int, int]:
        """(report seq, probe results, probes sent, lost) of the node's latest report."""
        node = self.controller.registry.nodes.get(node_id)
        report = node.latest_report if node is not None else None
        if report is None:
            return 0, 0, 0, 0
        results = list(report.probe_results)
        return report.seq, len(results), sum(r.sent for r in results), sum(r.lost for r in results)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(15)


def two_node_fabric() -> Any:
    """Two nodes, one per block, 8 rails and 8 spines, each rail NIC on its own loopback address:
    the planner gives each NIC a target on another rail of its own node (hostping) and one on the
    same rail of the other node, at the default budget."""
    from controller.fabric import generate_fabric

    fabric = generate_fabric(2, gpus_per_node=8, rails=8, nodes_per_block=1, spines=8)
    for n, node in enumerate(sorted(fabric.nodes())):
        for nic in fabric.nics_of(node):
            fabric.graph.nodes[nic]["address"] = f"127.3{n}.{fabric.rail_of(nic)}.1"
    return fabric


def _agent(ctl: ThreadController, node_id: str, workdir: Path, log_path: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "starpulse.app.cli", "agent",
        "--controller", f"127.0.0.1:{ctl.port}",
        "--node-id", node_id,
        "--backend", "sim",
        "--interval-s", "1",
        "--state-dir", str(workdir / node_id),
        "--log-level", "info",
    ]  # fmt: skip
    with open(log_path, "w") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=os.getcwd())


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def bench_agent_process(seconds: float, workdir: Path, probes: bool = False) -> dict[str, Any]:
    """The real agent's footprint; ``probes``: two agents on a declared fabric probing each other."""
    fabric = two_node_fabric() if probes else None
    ctl = ThreadController(workdir, fabric)
    ctl.start()
    node_id, peer_id = ("node-000", "node-001") if probes else ("node-bench", "")
    log_path = workdir / "agent.log"
    started = time.monotonic()
    peer = _agent(ctl, peer_id, workdir, workdir / "peer.log") if peer_id else None
    proc = _agent(ctl, node_id, workdir, log_path)
    seen: dict[int, tuple[int, int, int]] = {}
    try:
        # Warm-up: imports, probe, describe, connect, first reports (with probes: the first window).
        while ctl.reports_from(node_id) < 3 or (probes and not ctl.probe_results_from(node_id)[1]):
            if proc.poll() is not None:
                raise RuntimeError(f"agent exited early ({proc.returncode}); see {log_path}")
            if time.monotonic() - started > 60:
                raise RuntimeError(f"agent sent no reports (with probe results) within 60 s; see {log_path}")
            time.sleep(0.1)
        startup_s = time.monotonic() - started
        seq0 = ctl.reports_from(node_id)
        sampler = ProcSampler(proc.pid).start()
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            time.sleep(0.25)
            if probes:
                seq, *counts = ctl.probe_results_from(node_id)
                if counts[0]:
                    seen[seq] = (counts[0], counts[1], counts[2])
        s = sampler.stop()
        reports = ctl.reports_from(node_id) - seq0
        threads = psutil.Process(proc.pid).num_threads()
    finally:
        _stop(proc)
        if peer is not None:
            _stop(peer)
        ctl.stop()
    out: dict[str, Any] = {
        "window_s": s["wall_s"],
        "startup_to_third_report_s": round(startup_s, 2),
        "reports_acked_in_window": reports,
        "cpu_s": s["cpu_s"],
        "cpu_pct_of_one_core": s["cpu_pct_of_one_core"],
        "cpu_ms_per_report": round(1000 * s["cpu_s"] / reports, 2) if reports else float("nan"),
        "rss_mib_median": s["rss_mib_median"],
        "rss_mib_max": s["rss_mib_max"],
        "threads": threads,
    }
    if probes:
        sent = sum(v[1] for v in seen.values())
        out["probe_windows_seen"] = len(seen)
        out["probe_results_per_window"] = round(sum(v[0] for v in seen.values()) / max(1, len(seen)), 1)
        from controller.fabric.probeplan import ProbeConfig

        out["probes_sent_per_s"] = round(sent / max(1, len(seen)) / ProbeConfig().window_s, 1)
        out["probe_loss_pct"] = round(100 * sum(v[2] for v in seen.values()) / sent, 3) if sent else None
    return out


def _side_by_side(cyc: dict[str, Any], proc: dict[str, Any], cyc_p: dict[str, Any], proc_p: dict[str, Any]) -> str:
    """The cycle's and the agent process's cost without and with the probe mesh, one row each."""
    p = cyc_p["probes"]
    rows: list[tuple[str, str, str]] = [
        # process time: with probes it also counts the prober's thread while the cycle ran
        ("collect CPU ms/cycle (process time)", f"{cyc['collect_cpu_ms_mean']}", f"{cyc_p['collect_cpu_ms_mean']}"),
        ("probe results into the report, CPU ms/cycle", "-", f"{p['probe_results_into_report_cpu_ms_mean']}"),
        (
            "delta encoding CPU ms/report, mean",
            f"{cyc['delta_encode_cpu_ms_mean']}",
            f"{cyc_p['delta_encode_cpu_ms_mean']}",
        ),
        ("cycle CPU ms, mean (all three above)", f"{cyc['cycle_cpu_ms_mean']}", f"{cyc_p['cycle_cpu_ms_mean']}"),
        (
            "cycle CPU ms, mean, the cycle's own thread",
            f"{cyc['cycle_thread_cpu_ms_mean']}",
            f"{cyc_p['cycle_thread_cpu_ms_mean']}",
        ),
        (
            "report bytes on the wire, mean (one in 10 carries a window)",
            f"{cyc['agent_message_bytes_with_deltas_mean']}",
            f"{cyc_p['agent_message_bytes_with_deltas_mean']}",
        ),
        ("report carrying a window, bytes", "-", f"{p['agent_message_bytes_carrying_a_window_mean']}"),
        ("probe results per window", "-", f"{p['probe_results_per_window']}"),
        ("prober thread CPU % of one core", "-", f"{p['prober_thread_cpu_pct']}"),
        ("probes sent / answered per s", "-", f"{p['probes_sent_per_s']} / {p['probes_answered_per_s']}"),
        (
            "core share at 1 s interval, % (cycle's thread + prober thread)",
            f"{round(cyc['cycle_thread_cpu_ms_mean'] / 10, 2)}",
            f"{p['core_share_pct_at_1s_interval_with_prober']}",
        ),
        (
            "agent process: CPU % of one core (with the simulator)",
            f"{proc['cpu_pct_of_one_core']}",
            f"{proc_p['cpu_pct_of_one_core']}",
        ),
        ("agent process: CPU ms per report", f"{proc['cpu_ms_per_report']}", f"{proc_p['cpu_ms_per_report']}"),
        ("agent process: RSS MiB median", f"{proc['rss_mib_median']}", f"{proc_p['rss_mib_median']}"),
        ("agent process: threads", f"{proc['threads']}", f"{proc_p['threads']}"),
        (
            "agent process: probe windows seen / results per window",
            "-",
            f"{proc_p.get('probe_windows_seen')} / {proc_p.get('probe_results_per_window')}",
        ),
        (
            "agent process: probes sent per s / loss %",
            "-",
            f"{proc_p.get('probes_sent_per_s')} / {proc_p.get('probe_loss_pct')}",
        ),
    ]
    width = max(len(r[0]) for r in rows)
    lines = ["agent_cycle: without / with the probe mesh (default budget, 8 rails)", "-" * (width + 36)]
    lines.append(f"  {'':<{width}}  {'without':>14}  {'with probes':>16}")
    lines += [f"  {a:<{width}}  {b:>14}  {c:>16}" for a, b, c in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.agent_cycle", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer cycles, shorter agent run")
    ap.add_argument("--cycles", type=int, default=None, help="timed collection cycles (default 300; quick 100)")
    ap.add_argument("--agent-seconds", type=float, default=None, help="agent subprocess window (20; quick 8)")
    ap.add_argument(
        "--probes",
        action="store_true",
        help="also run both parts with the probe mesh on (the real prober on loopback at the default "
        "budget) and print them beside the runs without",
    )
    args = ap.parse_args(argv)
    cycles = args.cycles or (100 if args.quick else 300)
    seconds = args.agent_seconds or (8.0 if args.quick else 20.0)
    quiet_logging()
    load_before = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="sp-bench-agent-") as tmp:
        cyc = bench_cycles(cycles, Path(tmp) / "cycles")
        tiered = bench_cycles(cycles, Path(tmp) / "tiered", full_every=5)
        # The fake NVML's own share, in a separate pass: its timing wrappers slow the cycle.
        fake = bench_cycles(max(cycles // 3, 50), Path(tmp) / "fake", full_every=5, time_fake_nvml=True)
        proc = bench_agent_process(seconds, Path(tmp) / "proc")
        with_probes: dict[str, Any] = {}
        if args.probes:
            with_probes = {
                "cycles_tiered": bench_cycles(cycles, Path(tmp) / "tiered-probes", full_every=5, probes=True),
                "agent_process": bench_agent_process(seconds, Path(tmp) / "proc-probes", probes=True),
            }
    load_after = [round(x, 2) for x in os.getloadavg()]
    advance_pct = tiered["sim_advance_cpu_ms_mean"] / 10.0  # ms per 1 s cycle -> % of one core
    fake_nvml_pct = fake["fake_nvml_cpu_ms_per_cycle_mean"] / 10.0
    proc["cpu_pct_of_one_core_without_sim_advance"] = round(proc["cpu_pct_of_one_core"] - advance_pct, 2)
    proc["cpu_pct_of_one_core_without_simulator"] = round(proc["cpu_pct_of_one_core"] - advance_pct - fake_nvml_pct, 2)
    rows: list[tuple[str, Any]] = [
        ("GPUs / NIC ports per report", f"{cyc['gpus']} / {cyc['nics']}"),
        ("collect wall ms/cycle, median", cyc["collect_wall_ms_median"]),
        ("collect wall ms/cycle, p99", cyc["collect_wall_ms_p99"]),
        ("collect CPU ms/cycle, median", cyc["collect_cpu_ms_median"]),
        ("sim.advance wall ms/cycle (simulator, not agent)", cyc["sim_advance_wall_ms_median"]),
        ("sim.advance CPU ms/cycle, mean (tiered pass)", tiered["sim_advance_cpu_ms_mean"]),
        ("fake NVML: calls per cycle (tiered)", fake["fake_nvml_calls_per_cycle"]),
        ("fake NVML: its own Python CPU ms/cycle, mean (tiered)", fake["fake_nvml_cpu_ms_per_cycle_mean"]),
    ]
    rows += [(f"  collector {k} ms, median", v) for k, v in cyc["per_collector_ms_median"].items()]
    rows += [
        ("report size, bytes (serialized)", cyc["report_bytes"]),
        ("report with delta reports (1 in 12 full), bytes, mean", cyc["agent_message_bytes_with_deltas_mean"]),
        ("delta encoding (ReportDelta.encode_into) CPU ms/report, mean", cyc["delta_encode_cpu_ms_mean"]),
        ("inventory (Hello) size, bytes", cyc["inventory_bytes"]),
        ("core share at 1 s interval, % (collect CPU / 1 s)", cyc["core_share_pct_at_1s_interval"]),
        ("tiered (full counter read every 5th cycle): collect CPU ms/cycle, mean", tiered["collect_cpu_ms_mean"]),
        ("tiered: core share at 1 s interval, % (mean)", tiered["core_share_pct_at_1s_interval_mean"]),
        ("bench process maxrss MiB (getrusage)", cyc["bench_process_maxrss_mib"]),
        ("bench process RSS MiB (psutil)", cyc["bench_process_rss_mib"]),
        (f"agent subprocess: CPU % of one core ({proc['window_s']:.0f} s, 1 s interval)", proc["cpu_pct_of_one_core"]),
        ("agent subprocess: CPU ms per report", proc["cpu_ms_per_report"]),
        (
            "agent subprocess minus the simulator's advance: CPU % of one core",
            proc["cpu_pct_of_one_core_without_sim_advance"],
        ),
        (
            "agent subprocess minus the simulator (advance + fake NVML): CPU % (the target's figure)",
            proc["cpu_pct_of_one_core_without_simulator"],
        ),
        ("agent subprocess: reports acked in window", proc["reports_acked_in_window"]),
        ("agent subprocess: RSS MiB median / max", f"{proc['rss_mib_median']} / {proc['rss_mib_max']}"),
        ("agent subprocess: threads", proc["threads"]),
        ("load average (1/5/15) before / after", f"{load_before} / {load_after}"),
    ]
    print(table(f"agent_cycle ({cycles} cycles; 8 GPUs, 8 rails + bond, sim backend)", rows))
    if with_probes:
        print()
        print(_side_by_side(tiered, proc, with_probes["cycles_tiered"], with_probes["agent_process"]))
    figures = {
        "cycles": cyc,
        "cycles_tiered": tiered,
        "cycles_tiered_fake_nvml_timed": fake,
        "agent_process": proc,
        "with_probes": with_probes or None,
        "load_average_before": load_before,
        "load_average_after": load_after,
    }
    params = {"cycles": cycles, "agent_seconds": seconds, "quick": args.quick, "probes": args.probes}
    path = write_result(NAME, params, figures)
    print(f"\nwrote {path}")
    return figures


if __name__ == "__main__":
    main()
