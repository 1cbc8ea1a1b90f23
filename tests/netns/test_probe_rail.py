"""Faults on a routed rail data plane (leaf and spine namespaces, ECMP over two spines) are
found by real agents' UDP probes and placed on the fabric by the real controller.

One lab for the module (building it and reaching a steady mesh is most of the time): before
each case every fault is cleared and the fabric is quiet again (no probe condition, no probe
incident). The delay threshold is set from the lab's own measured round trips once steady
(``RailRun.measure_baseline``), so a loaded machine's scheduling noise is not a slow network.
The assertions are about what is blamed (the right component, and no other probe incident),
never about how long it took.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import pytest_asyncio

from tests.netns.harness import sigterm_raises, sweep_stale
from tests.netns.probe_rail import (
    RTT_CEILING_US,
    TEST_LOCALISATION,
    TEST_RESOLVE_HOLD_S,
    RailRun,
    incident_view,
    probe_config,
    start_rail_run,
)
from tests.netns.rail import require_rail_lab

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

WITHIN_S = 45.0  # a bound for a wait, not a detection-time figure (those are the bench's)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def lab(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RailRun]:
    require_rail_lab()
    sweep_stale()  # namespaces a run killed with SIGKILL left behind
    tmp: Path = tmp_path_factory.mktemp("rail")
    with sigterm_raises():
        async with AsyncExitStack() as stack:
            yield await start_rail_run(stack, tmp, probe_config(**TEST_LOCALISATION), TEST_RESOLVE_HOLD_S)


@pytest_asyncio.fixture(loop_scope="module")
async def run(lab: RailRun) -> RailRun:
    await lab.quiet()
    return lab


async def test_a_clean_fabric_opens_no_incident_and_flows_cross_both_spines(run: RailRun) -> None:
    before = run.spine_packets()
    seen: set[tuple[str, str]] = set()
    for _ in range(24):  # 12 s: a dozen localisations over a clean fabric
        seen.update((k, c) for k, c, _ in incident_view(run.ctl))
        await asyncio.sleep(0.5)
    after = run.spine_packets()
    assert seen == set(), run.evidence()
    # ECMP by UDP port: both spines carry probes
    assert all(after[s] - before[s] > 50 for s in after), (before, after)


async def test_loss_on_one_leaf_blames_that_leaf_and_no_node(run: RailRun) -> None:
    _, incidents = await run.detect(lambda r: r.rail.leaf_loss("leaf-b1-r0", 2.0), within_s=WITHIN_S)
    assert incidents == [("switch_fault", "leaf-b1-r0", [])], run.evidence()


async def test_loss_on_one_nic_cable_blames_that_nic(run: RailRun) -> None:
    _, incidents = await run.detect(lambda r: r.rail.nic_loss("node-004/nic-1", 5.0), within_s=WITHIN_S)
    assert [(k, c) for k, c, _ in incidents] == [("nic_fault", "node-004/nic-1")], run.evidence()


async def test_a_slow_host_is_blamed_not_the_network(run: RailRun) -> None:
    run.measure_baseline()  # the machine's load now, not at the module's start
    if run.rtt_threshold_us >= RTT_CEILING_US:
        pytest.skip(f"this machine's round trips are too slow to tell a slow host: {run.evidence()}")
    _, incidents = await run.detect(lambda r: r.rail.host_delay("node-002", r.host_delay_s), within_s=WITHIN_S)
    assert [c for _, c, _ in incidents] == ["node-002"], run.evidence()


async def test_loss_on_one_leaf_spine_cable_blames_that_cable(run: RailRun) -> None:
    """Lossy flows are traced (TTL 2 expires at the spine they took), so the cable is named."""
    traced = sum(a.agent.prober.traced_total for a in run.agents)
    _, incidents = await run.detect(lambda r: r.rail.link_loss("leaf-b0-r1", "spine-1", 5.0), within_s=WITHIN_S)
    cable = run.rail.fabric.link_name("leaf-b0-r1", "spine-1")
    assert [(k, c) for k, c, _ in incidents] == [("link_fault", cable)], run.evidence()
    assert sum(a.agent.prober.traced_total for a in run.agents) > traced
