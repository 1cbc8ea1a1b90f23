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

    .venv/bin/python -m bench.agent_cycle [--quick] [--cycles N] [--agent-seconds S]
"""

from __future__ import annotations

import argparse
import asyncio
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


def bench_cycles(cycles: int, workdir: Path, full_every: int = 1, time_fake_nvml: bool = False) -> dict[str, Any]:
    """Time collection cycles; with full_every N, slow counters are read fully every Nth cycle only.

    That emulates ``AgentConfig.counters_every_s`` at a 1 s interval (N = counters_every_s)
    without waiting real seconds between cycles.
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
    for seq in range(1, warmup + cycles + 1):
        for c in tiered:
            c.slow_every_s = 0.0 if seq % full_every == 0 else 1e9
        if fake_nvml is not None and seq == warmup + 1:
            fake_nvml["s"] = fake_nvml["calls"] = 0.0
        c0, w0 = time.process_time(), time.perf_counter()
        sim.advance(1.0)
        c1, w1 = time.process_time(), time.perf_counter()
        result = cs.collect(seq)
        c2, w2 = time.process_time(), time.perf_counter()
        out = spb.AgentMessage()
        encoder.encode_into(result.report, out.report)
        c3 = time.process_time()
        if seq <= warmup:
            continue
        cpu_encode.append(c3 - c2)
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
    return {
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

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.controller: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        from controller.service import Controller, ControllerConfig

        async def run() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            cfg = ControllerConfig(
                listen=f"127.0.0.1:{self.port}",
                http="127.0.0.1:0",
                db_path=self.workdir / "controller.db",
                heartbeat_timeout_s=600,
                grace_s=0.5,
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

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(15)


def bench_agent_process(seconds: float, workdir: Path) -> dict[str, Any]:
    ctl = ThreadController(workdir)
    ctl.start()
    node_id = "node-bench"
    log_path = workdir / "agent.log"
    cmd = [
        sys.executable, "-m", "starpulse.app.cli", "agent",
        "--controller", f"127.0.0.1:{ctl.port}",
        "--node-id", node_id,
        "--backend", "sim",
        "--interval-s", "1",
        "--state-dir", str(workdir / "agent"),
        "--log-level", "info",
    ]  # fmt: skip
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=os.getcwd())
    try:
        # Warm-up: imports, probe, describe, connect, first reports.
        while ctl.reports_from(node_id) < 3:
            if proc.poll() is not None:
                raise RuntimeError(f"agent exited early ({proc.returncode}); see {log_path}")
            if time.monotonic() - started > 60:
                raise RuntimeError(f"agent sent no reports within 60 s; see {log_path}")
            time.sleep(0.1)
        startup_s = time.monotonic() - started
        seq0 = ctl.reports_from(node_id)
        sampler = ProcSampler(proc.pid, every_s=0.5).start()
        time.sleep(seconds)
        s = sampler.stop()
        reports = ctl.reports_from(node_id) - seq0
        threads = psutil.Process(proc.pid).num_threads()
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        ctl.stop()
    return {
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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.agent_cycle", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer cycles, shorter agent run")
    ap.add_argument("--cycles", type=int, default=None, help="timed collection cycles (default 300; quick 100)")
    ap.add_argument("--agent-seconds", type=float, default=None, help="agent subprocess window (20; quick 8)")
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
    figures = {
        "cycles": cyc,
        "cycles_tiered": tiered,
        "cycles_tiered_fake_nvml_timed": fake,
        "agent_process": proc,
        "load_average_before": load_before,
        "load_average_after": load_after,
    }
    path = write_result(NAME, {"cycles": cycles, "agent_seconds": seconds, "quick": args.quick}, figures)
    print(f"\nwrote {path}")
    return figures


if __name__ == "__main__":
    main()
