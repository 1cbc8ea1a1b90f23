"""A NIC and the switch above it on exactly the same evidence: only that NIC's paths are counted
(its node's other NICs and its leaf's other NICs left out, e.g. gone quiet), so votes and rate
tie; the switch is named, which takes no node out, rather than whichever name sorts last."""

from __future__ import annotations

from controller.detect.probes import ProbeLocaliser, ProbeObs
from controller.fabric import generate_fabric
from controller.fabric.probeplan import ProbeConfig
from starpulse.core.clock import FakeClock


def _localised(lossy_sent: int, lossy_lost: int) -> list[tuple[str, str, str]]:
    fabric = generate_fabric(6, gpus_per_node=2, rails=2, nodes_per_block=3, spines=2)
    loc = ProbeLocaliser(fabric, ProbeConfig(enabled=True), clock=FakeClock())
    me = "node-000"
    local = fabric.nics_of(me)[0]
    rail0_peers = [fabric.nics_of(n)[0] for n in fabric.nodes() if n != me]
    loc.add(me, [ProbeObs(local, p, "", lossy_sent, lossy_lost, 100.0, 20.0, False) for p in rail0_peers])
    # clean traffic elsewhere (rail 1, node-000 not in it): the fabric's background is low
    others = [n for n in fabric.nodes() if n != me]
    for node in others:
        nic = fabric.nics_of(node)[1]
        peers = [fabric.nics_of(n)[1] for n in others if n != node]
        loc.add(node, [ProbeObs(nic, p, "", 400, 0, 100.0, 20.0, False) for p in peers])
    return [(b.kind, b.what, b.component) for b in loc.localise()]


def test_a_tie_between_a_nic_and_its_leaf_names_the_leaf() -> None:
    assert _localised(400, 12) == [("leaf", "loss", "leaf-b0-r0")]


def test_no_loss_names_nothing() -> None:
    assert _localised(400, 0) == []
