"""The probe mesh on the rail data plane: a real controller, real agents' probers, real UDP.

``RailRun`` starts the controller in-process (gRPC on loopback), one agent per node of the
fabric with a prober whose sockets live in the node's NIC namespaces (``RailLab.endpoints``),
waits until probes flow, injects one fault and waits for the controller's incidents. The
tests (test_probe_rail.py) and the bench (``python -m bench.probe_rail``) both drive it.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.probe.prober import Prober
from controller.detect.correlate import CorrelationConfig
from controller.detect.pipeline import DetectionConfig
from controller.fabric import Fabric, generate_fabric
from controller.fabric.probeplan import ProbeConfig, nic_addresses
from controller.service import Controller, ControllerConfig
from starpulse.core.clock import SYSTEM_CLOCK
from tests.helpers import free_port, halt_agents, make_sim_agent, wait_for
from tests.netns.rail import ADDRESS_TEMPLATE, RailLab

# A probe crosses its leaf twice (there and back): 2 % on a leaf loses about 4 % of its probes.
RTT_THRESHOLD_US = 50_000.0  # ksoftirqd on a loaded 2-core machine delays veth delivery by tens of ms
HOST_DELAY_S = 0.15


def rail_fabric() -> Fabric:
    """Two blocks of three nodes, two rails, two spines: 4 leaves, 8 leaf-spine cables, 12 NICs."""
    return generate_fabric(6, gpus_per_node=8, rails=2, nodes_per_block=3, spines=2)


def probe_config() -> ProbeConfig:
    return ProbeConfig(
        enabled=True,
        port=_udp_port(),
        window_s=1,
        timeout_ms=1000,  # a starved responder thread on a loaded test machine is not a lost probe
        packets_per_s_per_nic=50.0,
        address_template=ADDRESS_TEMPLATE,
        replan_min_s=0.0,
        rtt_threshold_us=RTT_THRESHOLD_US,
    )


def _udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def incident_view(ctl: Controller) -> list[tuple[str, str, list[str]]]:
    """(kind, root cause, affected nodes) of every open incident that probes raised, sorted.

    Only incidents holding a probe condition: the simulated nodes' host collector reads this
    machine's own memory, and a loaded shared test machine may be short of it (host.memory_low),
    which is no concern of the fabric's."""
    return sorted(
        (i.kind, i.root_cause, sorted(i.affected_nodes))
        for i in ctl.core.open_incidents()
        if any(rule.startswith("probe.") for rule, _ in i.condition_keys)
    )


@dataclass
class RailRun:
    """One controller, six agents and the rail lab, up and probing; ``detect`` times one fault."""

    ctl: Controller
    rail: RailLab
    agents: list[Any]

    def spine_packets(self) -> dict[str, int]:
        """Packets each spine has received from its leaves (ECMP spreads flows over both)."""
        out: dict[str, int] = {}
        for (_, spine), _port in self.rail.uplink.items():
            if spine in out:
                continue
            text = self.rail.lab.ip(spine, "-s", "-o", "link").stdout
            total = 0
            for line in text.splitlines():
                if " d" in line and "RX:" in line:
                    parts = line.split("RX:", 1)[1].split("\\")
                    nums = parts[1].split() if len(parts) > 1 else []
                    if len(nums) >= 2:
                        total += int(nums[1])
            out[spine] = total
        return out

    def evidence(self) -> str:
        """Every open incident's evidence, for an assertion's message."""
        return "\n".join(f"{i.kind} {i.root_cause}: {i.evidence}" for i in self.ctl.core.open_incidents())

    async def detect(
        self, inject: Callable[[RailLab], None], within_s: float
    ) -> tuple[float, list[tuple[str, str, list[str]]]]:
        """Inject, then wait for the first incident: (seconds it took, the incidents then)."""
        t0 = time.monotonic()
        inject(self.rail)
        await wait_for(lambda: bool(incident_view(self.ctl)), timeout=within_s, what="an incident from probes")
        elapsed = time.monotonic() - t0
        await _settle()
        return elapsed, incident_view(self.ctl)


async def _settle() -> None:
    """A moment for a correlated second condition to join the first incident before it is read."""
    import asyncio

    await asyncio.sleep(1.5)


async def start_rail_run(stack: AsyncExitStack, tmp_path: Path) -> RailRun:
    """Everything up, the plans applied, and probes answered across both spines."""
    fabric = rail_fabric()
    config = probe_config()
    nics = [n for n in fabric.graph.nodes if fabric.kind(n) == "nic"]
    rail = RailLab(fabric, tmp_path / "lab")
    stack.callback(rail.close)
    rail.build(nic_addresses(fabric, nics, config.address_template))
    port = free_port()
    ctl = Controller(
        ControllerConfig(
            listen=f"127.0.0.1:{port}",
            http="127.0.0.1:0",
            db_path=tmp_path / "controller.db",
            sweep_interval_s=0.2,
            fabric=fabric,
            detection=DetectionConfig(correlation=CorrelationConfig(settle_s=1.0), probes=config),
        ),
        clock=SYSTEM_CLOCK,
    )
    await ctl.start()
    stack.push_async_callback(ctl.stop)
    agents = [
        make_sim_agent(
            node, tmp_path, [f"127.0.0.1:{port}"], interval_s=0.5, seed=i, prober=Prober(endpoints=rail.endpoints)
        )
        for i, node in enumerate(fabric.nodes())
    ]
    stack.push_async_callback(halt_agents, agents)
    for a in agents:
        a.start()
    await wait_for(
        lambda: all(a.agent.prober.plan.targets for a in agents), timeout=30, what="every agent holding its plan"
    )
    await wait_for(lambda: sum(a.agent.prober.answered_total for a in agents) > 600, timeout=30, what="probes answered")
    return RailRun(ctl, rail, agents)


# -- detection time per fault kind: python -m tests.netns.probe_rail ------------------------
CASES: dict[str, tuple[Callable[[RailLab], None], tuple[str, str]]] = {
    "leaf, 1 % silent drop": (lambda r: r.leaf_loss("leaf-b1-r0", 1.0), ("switch_fault", "leaf-b1-r0")),
    "leaf, 2 % silent drop": (lambda r: r.leaf_loss("leaf-b1-r0", 2.0), ("switch_fault", "leaf-b1-r0")),
    "one leaf-spine cable, 2 % loss": (
        lambda r: r.link_loss("leaf-b0-r1", "spine-1", 2.0),
        ("link_fault", "leaf-b0-r1<->spine-1"),
    ),
    "one NIC's cable, 2 % loss": (lambda r: r.nic_loss("node-004/nic-1", 2.0), ("nic_fault", "node-004/nic-1")),
    f"one host, +{HOST_DELAY_S * 1000:g} ms": (
        lambda r: r.host_delay("node-002", HOST_DELAY_S),
        ("host_fault", "node-002"),
    ),
}


async def _one(workdir: Path, case: str, within_s: float) -> tuple[float | None, list[tuple[str, str, list[str]]]]:
    inject, _ = CASES[case]
    async with AsyncExitStack() as stack:
        run = await start_rail_run(stack, workdir)
        try:
            return await run.detect(inject, within_s)
        except AssertionError:
            return None, incident_view(run.ctl)


async def _clean(workdir: Path, seconds: float) -> int:
    """Probe incidents opened over ``seconds`` of a clean fabric."""
    import asyncio

    async with AsyncExitStack() as stack:
        run = await start_rail_run(stack, workdir)
        seen: set[tuple[str, str]] = set()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            seen.update((k, c) for k, c, _ in incident_view(run.ctl))
            await asyncio.sleep(0.5)
        return len(seen)


def main(argv: list[str] | None = None) -> int:
    """Each fault kind ``--repeats`` times on a fresh rail lab: time to the incident and whether
    it names the right component; then ``--clean-s`` seconds of a clean fabric."""
    import argparse
    import asyncio
    import statistics
    import tempfile

    from bench.common import quiet_logging
    from tests.netns.rail import missing_rail_prerequisites

    p = argparse.ArgumentParser(prog="python -m tests.netns.probe_rail", description=main.__doc__)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--clean-s", type=float, default=120.0)
    p.add_argument("--timeout-s", type=float, default=60.0)
    p.add_argument("--only", default="", help="run the cases whose name contains this")
    args = p.parse_args(argv)
    problems = missing_rail_prerequisites()
    if problems:
        print("probe_rail: cannot build the rail lab here: " + ", ".join(problems))
        return 2
    quiet_logging()
    print("| fault (injected on the rail namespaces) | detection, median (each) | localised right |")
    print("|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="probe-rail-") as tmp:
        for i, (case, (_, want)) in enumerate(CASES.items()):
            if args.only not in case:
                continue
            times: list[float] = []
            right = 0
            for r in range(args.repeats):
                took, incidents = asyncio.run(_one(Path(tmp) / f"c{i}r{r}", case, args.timeout_s))
                if took is not None:
                    times.append(took)
                right += [(k, c) for k, c, _ in incidents] == [want]
            med = f"{statistics.median(times):.1f} s" if times else "none"
            each = ", ".join(f"{t:.1f}" for t in times)
            print(f"| {case} | {med} ({each}) | {right}/{args.repeats} `{want[0]} {want[1]}` |", flush=True)
        if args.clean_s > 0:
            n = asyncio.run(_clean(Path(tmp) / "clean", args.clean_s))
            print(f"| clean fabric, {args.clean_s:g} s | {n} probe incidents | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
