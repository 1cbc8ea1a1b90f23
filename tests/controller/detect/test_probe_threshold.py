"""The delay threshold changes while the localiser runs (a settings reload, or the rail lab
setting it from its own measured round trips): results already in the window are judged
against the new threshold, and ageing them out later stays consistent."""

from __future__ import annotations

import pytest

from controller.detect.probes import ProbeLocaliser, ProbeObs
from controller.fabric import generate_fabric
from controller.fabric.probeplan import ProbeConfig
from starpulse.core.clock import FakeClock

SLOW_NODE = "node-002"


def _feed(loc: ProbeLocaliser, slow_us: float) -> None:
    """Every NIC probes every other node's NICs; round trips through SLOW_NODE take ``slow_us``."""
    fabric = loc.fabric
    nics = fabric.nics()
    for node in fabric.nodes():
        obs = []
        for local in fabric.nics_of(node):
            for peer in nics:
                if fabric.host_of(peer) == node:
                    continue
                slow = SLOW_NODE in (node, fabric.host_of(peer))
                obs.append(ProbeObs(local, peer, "", 50, 0, slow_us if slow else 1_000.0, 20.0, False))
        loc.add(node, obs)


def _blamed(loc: ProbeLocaliser) -> list[tuple[str, str, str]]:
    return [(b.kind, b.what, b.component) for b in loc.localise()]


def test_a_lowered_threshold_judges_what_the_window_already_holds() -> None:
    clock = FakeClock()
    fabric = generate_fabric(6, gpus_per_node=8, rails=2, nodes_per_block=3, spines=2)
    loc = ProbeLocaliser(fabric, ProbeConfig(enabled=True, rtt_threshold_us=500_000.0), clock=clock)
    _feed(loc, slow_us=80_000.0)
    assert _blamed(loc) == []  # 80 ms is under a 500 ms threshold

    loc.set_rtt_threshold(50_000.0)
    assert _blamed(loc) == [("node", "delay", SLOW_NODE)]

    loc.set_rtt_threshold(200_000.0)
    assert _blamed(loc) == []
    # what was counted slow leaves the window as it was counted: a clean window after it ages out
    clock.advance(loc.config.localise_window_s + 1)
    _feed(loc, slow_us=1_000.0)
    loc.set_rtt_threshold(50_000.0)
    assert _blamed(loc) == []
    assert loc.health[SLOW_NODE]["p99_us"] == pytest.approx(1_000.0)


def test_a_threshold_must_be_positive() -> None:
    loc = ProbeLocaliser(generate_fabric(6, rails=2, nodes_per_block=3), ProbeConfig(enabled=True), clock=FakeClock())
    with pytest.raises(ValueError, match="rtt_threshold_us"):
        loc.set_rtt_threshold(0.0)
