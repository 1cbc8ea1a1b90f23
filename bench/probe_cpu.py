"""What the prober costs a node: CPU and packets per second at the default budget, over loopback.

Node A (measured, this process) and node B (a child process) each have 8 rail NICs on their
own 127.x addresses; each NIC probes 4 of the other node's NICs over 33 flows (the plan's
shape at 8 spines) at ``packets_per_s_per_nic`` (default 20), and answers the other's probes,
so A sends and answers what a node of a real mesh does. Reported: A's CPU share of one core
over ``--seconds`` (process time / wall time), split into user (Python) and system (the kernel:
on loopback A's process also pays for delivering every datagram it sends into B's socket),
packets sent and answered per second, loss, and the prober thread's wake-ups per second; and
the kernel floor: what the datagrams A sends and reads cost on loopback by themselves (a bare
``sendto``/``recvmsg_into`` loop of the same size and count), which no prober code removes,
and the same loop's cost for 64-byte datagrams (``loopback_datagram_us_64b``: whether small
probes would be cheaper).
``--idle-s`` then times the ticks alone (A's responders open, nothing sent or arriving): the
fixed cost a wake-up has whatever it does. ``--repeats`` runs it all that many times and
reports each figure's median.

    .venv/bin/python -m bench.probe_cpu [--seconds 60] [--pps 20] [--repeats 3] [--tick-s 0.1] [--idle-s 15]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import socket
import statistics
import time
from typing import Any

from agent.probe.prober import Prober
from bench.common import quiet_logging, table, write_result
from controller.fabric.probeplan import ProbeConfig, flows_for
from starpulse.v1 import service_pb2 as spb

NAME = "probe_cpu"
NICS = 8
TARGETS = 4


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def plan_for(me: int, peer: int, port: int, pps: float, base: int) -> spb.ProbePlan:
    cfg = ProbeConfig()
    plan = spb.ProbePlan(
        version=1,
        port=port,
        dscp=cfg.dscp,
        payload_bytes=cfg.mtu_bytes - 28,
        timeout_ms=cfg.timeout_ms,
        window_s=cfg.window_s,
        slow_us=cfg.rtt_threshold_us,
    )
    flows = flows_for(8, cfg.ecmp_cover_p)
    for r in range(NICS):
        nic = f"n{me}/nic-{r}"
        plan.listen[nic] = f"127.2{me}.{r}.1"
        ports = list(range(base + r * flows, base + (r + 1) * flows))
        for k in range(TARGETS):
            peer_rail = (r + k) % NICS
            plan.targets.add(
                local_nic=nic,
                local_address=f"127.2{me}.{r}.1",
                peer_nic=f"n{peer}/nic-{peer_rail}",
                peer_address=f"127.2{peer}.{peer_rail}.1",
                src_ports=ports,
                packets_per_s=pps / TARGETS,
                purpose="cross",
            )
    return plan


def _prober(seed: int, tick_s: float | None) -> Prober:
    return Prober(seed=seed) if tick_s is None else Prober(seed=seed, tick_s=tick_s)


def peer_main(port: int, pps: float, seconds: float, tick_s: float | None = None) -> None:
    quiet_logging()
    p = _prober(2, tick_s)
    p.start()
    p.apply(plan_for(1, 0, port, pps, 40000))
    time.sleep(seconds)
    p.stop()


def kernel_floor(size: int, n: int = 20_000) -> float:
    """Microseconds of this process's CPU per datagram of ``size`` bytes sent over loopback and
    read back (``sendto`` and ``recvmsg_into`` with the receive stamp, as the prober does): what
    any UDP prober pays per datagram here, whatever its own code costs."""
    tx, rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        tx.bind(("127.0.45.1", 0))
        rx.bind(("127.0.45.2", 0))
        rx.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_TIMESTAMPNS", 35), 1)
        data, buf, dest = bytes(size), [memoryview(bytearray(65536))], rx.getsockname()
        t0 = time.process_time()
        for _ in range(n):
            tx.sendto(data, dest)
            rx.recvmsg_into(buf, 64)
        return (time.process_time() - t0) / n * 1e6
    finally:
        tx.close()
        rx.close()


def idle_ticks(seconds: float, tick_s: float | None) -> dict[str, float]:
    """The ticks' own cost: A's plan with its 8 responders and no targets, nothing arriving."""
    plan = plan_for(0, 1, free_udp_port(), 20.0, 30000)
    del plan.targets[:]
    p = _prober(1, tick_s)
    p.start()
    p.apply(plan)
    time.sleep(1)
    r0, woke0, wall0 = resource.getrusage(resource.RUSAGE_SELF), p.wakeups_total, time.perf_counter()
    time.sleep(seconds)
    r1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - wall0
    woke = p.wakeups_total - woke0
    p.stop()
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {"idle_cpu_pct": round(100 * cpu / wall, 3), "idle_us_per_wakeup": round(cpu / max(1, woke) * 1e6, 1)}


def _next_window(a: Prober, limit_s: float = 60.0) -> list[Any]:
    """The results of the next window to close (waits for it)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        got = a.take_results()
        if got:
            return got
        time.sleep(0.05)
    raise SystemExit("probe_cpu: no window closed within a minute")


def _warm_up(a: Prober) -> None:
    """Until B answers (its process takes seconds to start) and the window open meanwhile has
    closed: the probes B missed while starting are not the loss measured."""
    deadline = time.monotonic() + 60
    while a.answered_total == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    a.take_results()
    _next_window(a)


def run(seconds: float, pps: float, tick_s: float | None = None) -> dict[str, Any]:
    port = free_udp_port()
    child = mp.get_context("spawn").Process(target=peer_main, args=(port, pps, seconds + 10, tick_s))
    child.start()
    a = _prober(1, tick_s)
    a.start()
    a.apply(plan_for(0, 1, port, pps, 30000))
    _warm_up(a)
    sent0, answered0 = a.sent_total, a.answered_total
    woke0 = getattr(a, "wakeups_total", 0)
    t0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    time.sleep(seconds)
    t1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - wall0
    user, system = t1.ru_utime - t0.ru_utime, t1.ru_stime - t0.ru_stime
    sent, answered = a.sent_total - sent0, a.answered_total - answered0
    woke = getattr(a, "wakeups_total", 0) - woke0
    results = a.take_results() + _next_window(a)
    a.stop()
    child.join()
    total = sum(r.sent for r in results)
    per_datagram_us = kernel_floor(ProbeConfig().mtu_bytes - 28)
    small_datagram_us = kernel_floor(64)  # what small probes would pay instead (per call, not per byte)
    return {
        "nics": NICS,
        "budget_pps_per_nic": pps,
        "sent_pps": round(sent / wall, 1),
        "answered_pps": round(answered / wall, 1),
        "cpu_pct_of_one_core": round(100 * (user + system) / wall, 3),
        "user_pct": round(100 * user / wall, 3),
        "system_pct": round(100 * system / wall, 3),
        # A sends its probes and its replies (each delivered into B's socket in A's own time on
        # loopback) and reads as many: that many loopback datagrams at the measured cost each
        "loopback_datagram_us": round(per_datagram_us, 2),
        "loopback_datagram_us_64b": round(small_datagram_us, 2),
        "kernel_floor_pct": round((sent + answered) / wall * per_datagram_us / 1e4, 3),
        "wakeups_per_s": round(woke / wall, 1) if woke else None,
        "loss_pct": round(100 * sum(r.lost for r in results) / total, 3) if total else None,
        "results_per_window": round(len(results) / max(1, seconds // 10), 1),
    }


def _median(values: list[Any]) -> Any:
    numbers = [v for v in values if isinstance(v, int | float)]
    return statistics.median(numbers) if len(numbers) == len(values) else values[0]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--pps", type=float, default=ProbeConfig().packets_per_s_per_nic)
    ap.add_argument("--tick-s", type=float, default=None, help="the prober's tick (default: its own)")
    ap.add_argument("--idle-s", type=float, default=0.0, help="then time the ticks alone (no probes) this long")
    ap.add_argument("--repeats", type=int, default=1, help="runs; each figure is their median")
    args = ap.parse_args(argv)
    quiet_logging()
    runs = []
    for _ in range(max(1, args.repeats)):
        runs.append(run(args.seconds, args.pps, args.tick_s))
        if args.idle_s > 0:
            runs[-1].update(idle_ticks(args.idle_s, args.tick_s))
    figures = {k: _median([r[k] for r in runs]) for k in runs[0]}
    if len(runs) > 1:
        figures["cpu_pct_each_run"] = " / ".join(str(r["cpu_pct_of_one_core"]) for r in runs)
    print(table("prober cost per node (loopback)", list(figures.items())))
    print(f"wrote {write_result(NAME, vars(args), figures)}")
    return figures


if __name__ == "__main__":
    main()
