"""What the prober costs a node: CPU and packets per second at the default budget, over loopback.

Node A (measured, this process) and node B (a child process) each have 8 rail NICs on their
own 127.x addresses; each NIC probes 4 of the other node's NICs over 33 flows (the plan's
shape at 8 spines) at ``packets_per_s_per_nic`` (default 20), and answers the other's probes,
so A sends and answers what a node of a real mesh does. Reported: A's CPU share of one core
over ``--seconds`` (process time / wall time), packets sent and answered per second, loss.

    .venv/bin/python -m bench.probe_cpu [--seconds 60] [--pps 20]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
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


def peer_main(port: int, pps: float, seconds: float) -> None:
    quiet_logging()
    p = Prober(seed=2)
    p.start()
    p.apply(plan_for(1, 0, port, pps, 40000))
    time.sleep(seconds)
    p.stop()


def run(seconds: float, pps: float) -> dict[str, Any]:
    port = free_udp_port()
    child = mp.get_context("spawn").Process(target=peer_main, args=(port, pps, seconds + 10))
    child.start()
    a = Prober(seed=1)
    a.start()
    a.apply(plan_for(0, 1, port, pps, 30000))
    time.sleep(5)  # both sides up, one window in
    a.take_results()
    sent0, answered0 = a.sent_total, a.answered_total
    cpu0, wall0 = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    sent, answered = a.sent_total - sent0, a.answered_total - answered0
    results = a.take_results()
    a.stop()
    child.join()
    total = sum(r.sent for r in results)
    return {
        "nics": NICS,
        "budget_pps_per_nic": pps,
        "sent_pps": round(sent / wall, 1),
        "answered_pps": round(answered / wall, 1),
        "cpu_pct_of_one_core": round(100 * cpu / wall, 3),
        "loss_pct": round(100 * sum(r.lost for r in results) / total, 3) if total else None,
        "results_per_window": round(len(results) / max(1, seconds // 10), 1),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--pps", type=float, default=ProbeConfig().packets_per_s_per_nic)
    args = ap.parse_args(argv)
    quiet_logging()
    figures = run(args.seconds, args.pps)
    print(table("prober cost per node (loopback)", list(figures.items())))
    print(f"wrote {write_result(NAME, vars(args), figures)}")
    return figures


if __name__ == "__main__":
    main()
