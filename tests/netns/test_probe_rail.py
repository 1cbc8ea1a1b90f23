"""Faults on a routed rail data plane (leaf and spine namespaces, ECMP over two spines) are
found by real agents' UDP probes and placed on the fabric by the real controller."""

from __future__ import annotations

import asyncio
import os
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from tests.netns.harness import sweep_stale
from tests.netns.probe_rail import HOST_DELAY_S, incident_view, start_rail_run
from tests.netns.rail import require_rail_lab

pytestmark = [
    pytest.mark.netns,
    pytest.mark.slow,
    # Opt-in: on a loaded 2-core CI worker the lab's loopback round trips reach ~70 ms and its
    # delay threshold (50 ms) opens spurious slow-probe incidents beside the fault under test.
    pytest.mark.skipif(os.environ.get("STARPULSE_RAIL_LAB") != "1", reason="set STARPULSE_RAIL_LAB=1 (root, quiet)"),
]


@pytest.fixture(autouse=True)
def _rail_lab() -> None:
    require_rail_lab()
    sweep_stale()  # namespaces a run killed with SIGKILL left behind


async def test_a_clean_fabric_opens_no_incident_and_flows_cross_both_spines(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        run = await start_rail_run(stack, tmp_path)
        before = run.spine_packets()
        await asyncio.sleep(12)  # several localisations over a clean fabric
        after = run.spine_packets()
        assert incident_view(run.ctl) == []
        # ECMP by UDP port: both spines carry probes
        assert all(after[s] - before[s] > 50 for s in after), (before, after)


async def test_loss_on_one_leaf_blames_that_leaf_and_no_node(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        run = await start_rail_run(stack, tmp_path)
        _, incidents = await run.detect(lambda r: r.leaf_loss("leaf-b1-r0", 2.0), within_s=60)
        assert incidents == [("switch_fault", "leaf-b1-r0", [])], run.evidence()


async def test_loss_on_one_nic_cable_blames_that_nic(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        run = await start_rail_run(stack, tmp_path)
        _, incidents = await run.detect(lambda r: r.nic_loss("node-004/nic-1", 5.0), within_s=60)
        assert [(k, c) for k, c, _ in incidents] == [("nic_fault", "node-004/nic-1")], run.evidence()


async def test_a_slow_host_is_blamed_not_the_network(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        run = await start_rail_run(stack, tmp_path)
        _, incidents = await run.detect(lambda r: r.host_delay("node-002", HOST_DELAY_S), within_s=60)
        assert [c for _, c, _ in incidents] == ["node-002"]


async def test_loss_on_one_leaf_spine_cable_blames_that_cable(tmp_path: Path) -> None:
    """Lossy flows are traced (TTL 2 expires at the spine they took), so the cable is named."""
    async with AsyncExitStack() as stack:
        run = await start_rail_run(stack, tmp_path)
        _, incidents = await run.detect(lambda r: r.link_loss("leaf-b0-r1", "spine-1", 5.0), within_s=60)
        cable = run.rail.fabric.link_name("leaf-b0-r1", "spine-1")
        assert [(k, c) for k, c, _ in incidents] == [("link_fault", cable)], run.evidence()
        assert sum(a.agent.prober.traced_total for a in run.agents) > 0
