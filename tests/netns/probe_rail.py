"""The probe mesh on the rail data plane: a real controller, real agents' probers, real UDP.

``RailRun`` starts the controller in-process (gRPC on loopback), one agent per node of the
fabric with a prober whose sockets live in the node's NIC namespaces (``RailLab.endpoints``),
waits until probes flow and the mesh is steady, injects one fault and waits for the
controller's incidents. The tests (test_probe_rail.py, one lab for the module) and the
detection bench (``python -m tests.netns.probe_rail``, a fresh lab per case) both drive it.

Steady first: the localiser leaves out the results of a node connected within its window (a
peer that restarted lost probes to its restart, not to the network), so a fault injected
seconds after the agents connect is only seen a window later; detection is timed from a
fault injected once every node has been connected for a full window, as in production.
The delay threshold is the lab's own: set from the round trips it measures once steady, not
a fixed figure that a loaded machine's scheduling noise reaches.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from agent.probe.prober import Prober
from controller.detect.correlate import CorrelationConfig
from controller.detect.pipeline import DetectionConfig
from controller.detect.probes import ProbeLocaliser
from controller.fabric import Fabric, generate_fabric
from controller.fabric.probeplan import ProbeConfig, nic_addresses
from controller.service import Controller, ControllerConfig
from starpulse.core.clock import SYSTEM_CLOCK
from tests.helpers import free_port, halt_agents, make_sim_agent, wait_for
from tests.netns.rail import ADDRESS_TEMPLATE, RailLab

log = structlog.get_logger(__name__)

# A probe crosses its leaf twice (there and back): 2 % on a leaf loses about 4 % of its probes.
# The delay threshold is the lab's own: ``RTT_FLOOR_US`` or ``RTT_OVER_BASELINE`` times the worst
# network p99 round trip measured once the mesh is steady, whichever is larger (a loaded 2-core
# machine's ksoftirqd and GIL delay veth delivery by tens of ms), and a slow host's added delay
# is ``HOST_DELAY_OVER_THRESHOLD`` times that threshold.
RTT_FLOOR_US = 100_000.0
RTT_OVER_BASELINE = 3.0
RTT_CEILING_US = 500_000.0  # past this the machine is too loaded for a delay case: the run says so (a warning)
HOST_DELAY_OVER_THRESHOLD = 2.0
PROBE_TIMEOUT_MS = 3000  # above a slow host's own cross-rail probe (its delay both ways) at the ceiling


def rail_fabric() -> Fabric:
    """Two blocks of three nodes, two rails, two spines: 4 leaves, 8 leaf-spine cables, 12 NICs."""
    return generate_fabric(6, gpus_per_node=8, rails=2, nodes_per_block=3, spines=2)


def probe_config(*, window_s: float = 30.0, every_s: float = 5.0, clear_windows: int = 3) -> ProbeConfig:
    """The lab's settings: agent window 1 s and 50 probes/s per NIC (the lab's reports come every
    0.5 s); localisation as given (the defaults: 30 s every 5 s; the tests: shorter, so one lab
    serves every case). The delay threshold starts at the ceiling and is set from the measured
    baseline once the mesh is steady (``RailRun.measure_baseline``)."""
    return ProbeConfig(
        enabled=True,
        port=_udp_port(),
        window_s=1,
        timeout_ms=PROBE_TIMEOUT_MS,  # a starved responder thread on a loaded test machine is not a lost probe
        packets_per_s_per_nic=50.0,
        address_template=ADDRESS_TEMPLATE,
        replan_min_s=0.0,
        rtt_threshold_us=RTT_CEILING_US,
        localise_window_s=window_s,
        localise_every_s=every_s,
        clear_windows=clear_windows,
    )


# The tests' localisation: a 6 s window every second, 2 in a row to open and 2 clean to resolve,
# and incidents that resolve 2 s after their conditions (not the default 60 s flap damping), so
# one lab serves every case: a fault's evidence ages out in seconds, not minutes.
TEST_LOCALISATION = {"window_s": 6.0, "every_s": 1.0, "clear_windows": 2}
TEST_RESOLVE_HOLD_S = 2.0


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
    rtt_threshold_us: float = RTT_CEILING_US
    baseline_p99_us: float = 0.0

    @property
    def localiser(self) -> ProbeLocaliser:
        loc = self.ctl.core.detection.probes
        assert loc is not None, "the controller runs no probe localiser"
        return loc

    @property
    def host_delay_s(self) -> float:
        """A slow host's added delay: well past the lab's delay threshold, under the probe timeout."""
        return HOST_DELAY_OVER_THRESHOLD * self.rtt_threshold_us / 1e6

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
        """Every open incident's evidence and the lab's delay threshold, for an assertion's message."""
        t, b = self.rtt_threshold_us / 1000, self.baseline_p99_us / 1000
        lines = [f"rtt threshold {t:.1f} ms (baseline p99 {b:.1f} ms)"]
        lines += [f"{i.kind} {i.root_cause}: {i.evidence}" for i in self.ctl.core.open_incidents()]
        return "\n".join(lines)

    async def steady(self) -> None:
        """Wait until every node's results count (connected for longer than one localisation window,
        ``controller.detect.probes``: a peer that just connected may have lost probes to its restart)
        and one localisation has read a full window of them."""
        cfg = self.localiser.config
        await asyncio.sleep(cfg.localise_window_s + cfg.localise_every_s)
        await wait_for(
            lambda: all(
                self.ctl.core.detection._probe_node_ok(n, self.ctl.clock.time_ms() - int(cfg.localise_window_s * 1000))
                for n in self.rail.fabric.nodes()
            ),
            timeout=30,
            what="every node's probe results counting",
        )

    def measure_baseline(self) -> float:
        """The delay threshold from this lab's own round trips: the worst network p99 any probed
        component saw over the last window, times ``RTT_OVER_BASELINE``, no lower than
        ``RTT_FLOOR_US`` (and no higher than ``RTT_CEILING_US``); set on the running localiser."""
        loc = self.localiser
        self.baseline_p99_us = max((h["p99_us"] for h in loc.health.values()), default=0.0)
        self.rtt_threshold_us = min(RTT_CEILING_US, max(RTT_FLOOR_US, RTT_OVER_BASELINE * self.baseline_p99_us))
        loc.set_rtt_threshold(self.rtt_threshold_us)
        if RTT_OVER_BASELINE * self.baseline_p99_us > RTT_CEILING_US:
            log.warning(
                "rail_lab_too_loaded_for_delay",
                baseline_p99_ms=round(self.baseline_p99_us / 1000, 1),
                threshold_ms=self.rtt_threshold_us / 1000,
            )
        return self.rtt_threshold_us

    async def quiet(self, within_s: float = 90.0) -> None:
        """Every fault cleared, and wait until no probe condition or probe incident is open."""
        self.rail.clear()
        await wait_for(
            lambda: not list(self.localiser.open_conditions()) and not incident_view(self.ctl),
            timeout=within_s,
            what="the fabric quiet again (no probe condition, no probe incident)",
        )

    async def detect(
        self, inject: Callable[[RailRun], None], within_s: float
    ) -> tuple[float, list[tuple[str, str, list[str]]]]:
        """Inject, then wait for the first incident: (seconds it took, the incidents then)."""
        t0 = time.monotonic()
        inject(self)
        await wait_for(lambda: bool(incident_view(self.ctl)), timeout=within_s, what="an incident from probes")
        elapsed = time.monotonic() - t0
        await asyncio.sleep(1.5)  # a correlated second condition joins the first incident before it is read
        return elapsed, incident_view(self.ctl)


async def start_rail_run(
    stack: AsyncExitStack, tmp_path: Path, config: ProbeConfig | None = None, resolve_hold_s: float = 60.0
) -> RailRun:
    """Everything up, the plans applied, probes answered across both spines, every node's results
    counting (``RailRun.steady``) and the delay threshold set from the lab's measured round trips."""
    fabric = rail_fabric()
    config = config or probe_config()
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
            detection=DetectionConfig(
                correlation=CorrelationConfig(settle_s=1.0, resolve_hold_s=resolve_hold_s), probes=config
            ),
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
    run = RailRun(ctl, rail, agents)
    await run.steady()
    run.measure_baseline()
    return run


# -- detection time per fault kind: python -m tests.netns.probe_rail ------------------------
CASES: dict[str, tuple[Callable[[RailRun], None], tuple[str, str]]] = {
    "leaf, 1 % silent drop": (lambda r: r.rail.leaf_loss("leaf-b1-r0", 1.0), ("switch_fault", "leaf-b1-r0")),
    "leaf, 2 % silent drop": (lambda r: r.rail.leaf_loss("leaf-b1-r0", 2.0), ("switch_fault", "leaf-b1-r0")),
    "one leaf-spine cable, 2 % loss": (
        lambda r: r.rail.link_loss("leaf-b0-r1", "spine-1", 2.0),
        ("link_fault", "leaf-b0-r1<->spine-1"),
    ),
    "one NIC's cable, 2 % loss": (lambda r: r.rail.nic_loss("node-004/nic-1", 2.0), ("nic_fault", "node-004/nic-1")),
    "one host, 2x the delay threshold": (
        lambda r: r.rail.host_delay("node-002", r.host_delay_s),
        ("host_fault", "node-002"),
    ),
}


BASELINES: list[tuple[float, float]] = []  # each run's (baseline p99, threshold), in us


async def _one(workdir: Path, case: str, within_s: float) -> tuple[float | None, list[tuple[str, str, list[str]]]]:
    inject, _ = CASES[case]
    async with AsyncExitStack() as stack:
        run = await start_rail_run(stack, workdir)
        BASELINES.append((run.baseline_p99_us, run.rtt_threshold_us))
        try:
            return await run.detect(inject, within_s)
        except AssertionError:
            return None, incident_view(run.ctl)


async def _clean(workdir: Path, seconds: float) -> int:
    """Probe incidents opened over ``seconds`` of a clean fabric."""
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
    print("load average (1, 5, 15 min) at the start: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print("| fault (injected on the rail namespaces) | detection, median (each) | localised right |")
    print("|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="probe-rail-") as tmp:
        for i, (case, (_, want)) in enumerate(CASES.items()):
            if args.only not in case:
                continue
            times: list[float] = []
            right = 0
            wrong: list[str] = []
            for r in range(args.repeats):
                took, incidents = asyncio.run(_one(Path(tmp) / f"c{i}r{r}", case, args.timeout_s))
                if took is not None:
                    times.append(took)
                seen = [(k, c) for k, c, _ in incidents]
                right += seen == [want]
                if seen != [want]:
                    wrong.append("; ".join(f"{k} {c}" for k, c in seen) or "none")
            med = f"{statistics.median(times):.1f} s" if times else "none"
            each = ", ".join(f"{t:.1f}" for t in times)
            got = f" (got: {' / '.join(wrong)})" if wrong else ""
            print(f"| {case} | {med} ({each}) | {right}/{args.repeats} `{want[0]} {want[1]}`{got} |", flush=True)
        if args.clean_s > 0:
            n = asyncio.run(_clean(Path(tmp) / "clean", args.clean_s))
            print(f"| clean fabric, {args.clean_s:g} s | {n} probe incidents | |")
    ms = ", ".join(f"{b / 1000:.1f}/{t / 1000:.0f}" for b, t in BASELINES)
    print(f"\nbaseline p99 / delay threshold per run, ms: {ms}")
    print("load average (1, 5, 15 min) at the end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
