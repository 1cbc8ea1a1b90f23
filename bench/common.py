"""Shared helpers for the benchmarks: machine facts, percentiles, tables, JSON results, process sampling."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import platform
import socket
import statistics
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import psutil

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def quiet_logging() -> None:
    """Warnings and up only: benchmarks must not pay for (or print) per-message info logs."""
    from starpulse.core.logs import configure_logging

    configure_logging("warning")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit() -> str:
    """HEAD of the checkout being measured, with '+dirty' when tracked files differ from it."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=False
        )
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=root, capture_output=True, check=False)
    except OSError:
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.returncode else "")


def machine() -> dict[str, Any]:
    vm = psutil.virtual_memory()
    return {
        "git_commit": git_commit(),
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": round(vm.total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def median(values: Iterable[float]) -> float:
    vals = list(values)
    return statistics.median(vals) if vals else float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def table(title: str, rows: Sequence[tuple[str, Any]]) -> str:
    """A two-column table: figure, value."""
    width = max((len(r[0]) for r in rows), default=10)
    lines = [title, "-" * len(title)]
    for name, value in rows:
        lines.append(f"  {name:<{width}}  {fmt(value)}")
    return "\n".join(lines)


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def write_result(name: str, params: dict[str, Any], figures: dict[str, Any], **extra: Any) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    doc = {"benchmark": name, "machine": machine(), "params": params, "figures": figures, **extra}
    path.write_text(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")
    return path


class ProcSampler:
    """Samples another process's CPU and RSS from outside (psutil) over a window.

    CPU% is (user+system CPU time used in the window) / (wall time of the window) x 100,
    i.e. percent of one core. RSS is sampled every `every_s`; median and max are kept.
    Children are included (a service that forks helpers pays for them too).
    """

    def __init__(self, pid: int, every_s: float = 0.5) -> None:
        self.proc = psutil.Process(pid)
        self.every_s = every_s
        self.rss: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cpu0 = 0.0
        self._t0 = 0.0
        self.cpu_s = 0.0
        self.own_cpu_s = 0.0
        self._own_cpu = self._own_cpu0 = 0.0
        self.wall_s = 0.0
        # the process's first thread (an asyncio service's event loop) and each child, apart
        self._main_thread = self._main_thread0 = 0.0
        self._children: dict[int, float] = {}
        self._children0: dict[int, float] = {}
        self.main_thread_cpu_s = 0.0
        self.children_cpu_s: dict[int, float] = {}

    def _cpu(self) -> float:
        total = 0.0
        own = 0.0
        children: dict[int, float] = {}
        for p in [self.proc, *self.proc.children(recursive=True)]:
            try:
                t = p.cpu_times()
                total += t.user + t.system
                if p.pid == self.proc.pid:
                    own = t.user + t.system
                    self._main_thread = next(
                        (th.user_time + th.system_time for th in p.threads() if th.id == p.pid), 0.0
                    )
                else:
                    children[p.pid] = t.user + t.system
            except psutil.Error:
                pass
        self._own_cpu = own
        self._children = children
        return total

    def _rss(self) -> int:
        """The process's RSS plus its children's (a controller's detection shards are part of it)."""
        total = self.proc.memory_info().rss
        for child in self.proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):  # it ended meanwhile
                total += child.memory_info().rss
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.rss.append(self._rss())
            except psutil.Error:
                return

    def start(self) -> ProcSampler:
        self._cpu0 = self._cpu()
        self._own_cpu0 = self._own_cpu
        self._main_thread0 = self._main_thread
        self._children0 = dict(self._children)
        self._t0 = time.monotonic()
        self.rss.append(self._rss())
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        self.cpu_s = self._cpu() - self._cpu0
        self.own_cpu_s = self._own_cpu - self._own_cpu0
        self.main_thread_cpu_s = self._main_thread - self._main_thread0
        self.children_cpu_s = {pid: cpu - self._children0.get(pid, 0.0) for pid, cpu in self._children.items()}
        self.wall_s = time.monotonic() - self._t0
        self.rss.append(self._rss())
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.summary()

    def summary(self) -> dict[str, float]:
        return {
            "cpu_s": round(self.cpu_s, 3),
            "wall_s": round(self.wall_s, 3),
            "cpu_pct_of_one_core": round(100 * self.cpu_s / self.wall_s, 2) if self.wall_s else float("nan"),
            # the process alone, without its children (a controller's detection shards)
            "own_cpu_pct_of_one_core": round(100 * self.own_cpu_s / self.wall_s, 2) if self.wall_s else float("nan"),
            "own_cpu_s": round(self.own_cpu_s, 3),
            # of it the first thread (an asyncio service's event loop); the rest is its other threads
            "main_thread_cpu_s": round(self.main_thread_cpu_s, 3),
            # each child process (a controller's detection shards), by pid
            "children_cpu_s": {str(pid): round(cpu, 3) for pid, cpu in sorted(self.children_cpu_s.items())},
            "rss_mib_median": round(median(self.rss) / 2**20, 1),
            "rss_mib_max": round(max(self.rss) / 2**20, 1),
        }


async def read_acks(call: Any, sent_at: dict[int, float], t_start: float, t_end: float, tally: Any) -> None:
    """Read a Connect stream to its end, turning report acks into round trips.

    ``sent_at`` maps report seq -> perf_counter() at send (only reports sent inside the
    window are in it); ``tally`` gets ``acked_in_window`` and ``latencies`` updated.
    """
    import grpc

    acked = 0
    while True:
        msg = await call.read()
        if msg is grpc.aio.EOF:
            return
        if msg.HasField("ack") and msg.ack.report_seq > acked:
            now = time.perf_counter()
            if t_start <= time.time() <= t_end:
                tally.acked_in_window += msg.ack.report_seq - acked
            for seq in range(acked + 1, msg.ack.report_seq + 1):
                t = sent_at.pop(seq, None)
                if t is not None:
                    tally.latencies.append(now - t)
            acked = msg.ack.report_seq


def summed_errors(done: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Error counts by exception name, summed over the load workers' results."""
    errors: dict[str, int] = {}
    for d in done:
        for k, v in d["errors"].items():
            errors[k] = errors.get(k, 0) + v
    return errors


CONNECT_METHOD = "/starpulse.v1.Telemetry/Connect"


async def open_stream(port: int, node_id: str, inventory: bytes, who: str) -> tuple[Any, Any, float, bool]:
    """One simulated agent's Connect stream (bytes out, decoded in) after its Hello: (channel, call,
    Hello->Welcome seconds, whether the controller accepts delta reports)."""
    import grpc

    from starpulse.core.grpc_client import CLIENT_CHANNEL_OPTIONS
    from starpulse.v1 import inventory_pb2 as ipb
    from starpulse.v1 import service_pb2 as spb

    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=CLIENT_CHANNEL_OPTIONS)
    decode = spb.ControllerMessage.FromString
    call = channel.stream_stream(CONNECT_METHOD, request_serializer=None, response_deserializer=decode)()
    hello = spb.Hello(
        node_id=node_id,
        role=ipb.NODE_ROLE_COMPUTE,
        inventory=ipb.Inventory.FromString(inventory),
        agent_version=who,
        buffer_epoch=f"{who}-{node_id}",
        next_event_seq=1,
    )
    t0 = time.perf_counter()
    await call.write(spb.AgentMessage(hello=hello).SerializeToString())
    first = await call.read()
    if first is grpc.aio.EOF or not first.HasField("welcome"):
        raise ConnectionError(f"{node_id}: no Welcome")
    accepts = getattr(first.welcome, "accepts_delta_reports", False)  # False: a controller from before them
    return channel, call, time.perf_counter() - t0, bool(accepts)
