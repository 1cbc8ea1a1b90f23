"""Traced flows on a real fabric: a spine named by its address, and a lossy uplink named even
though replies come back over their own spines (ECMP hashes each direction on its own)."""

from __future__ import annotations

from controller.detect.probes import ProbeLocaliser, ProbeObs
from controller.fabric import generate_fabric
from controller.fabric.model import Fabric
from controller.fabric.probeplan import ProbeConfig
from starpulse.core.clock import FakeClock

SPINE_AT = {"spine-0": "10.9.200.1", "spine-1": "10.9.201.1"}


def _fabric() -> Fabric:
    fabric = generate_fabric(12, gpus_per_node=1, rails=1, nodes_per_block=4, spines=2)
    for spine, address in SPINE_AT.items():
        fabric.graph.nodes[spine]["addresses"] = [address]
    return fabric


def _obs(local: str, peer: str, via: str, sent: int, lost: int) -> ProbeObs:
    return ProbeObs(local, peer, via, sent, lost, 20.0, 3.0, False)


def _nic(block: int, slot: int) -> str:
    return f"node-{block * 4 + slot:03d}/nic-0"


def _localise(cross: list[ProbeObs]) -> list[tuple[str, str]]:
    """Leaf b0 loses only above it: its same-leaf ring is clean, as are b1's and b2's."""
    fabric = _fabric()
    loc = ProbeLocaliser(fabric, ProbeConfig(enabled=True), clock=FakeClock())
    for block in range(3):
        ring = [_obs(_nic(block, i), _nic(block, (i + 1) % 4), "", 400, 0) for i in range(4)]
        loc.add(f"node-{block * 4:03d}", ring)
    loc.add("node-004", [_obs(_nic(1, i), _nic(2, i), "", 400, 0) for i in range(4)])
    loc.add("node-000", cross)
    return [(b.kind, b.component) for b in loc.localise()]


def _between_b0_and_b1(bad: str, other: str) -> list[ProbeObs]:
    """Each pair's flows over the bad spine lose on the way out and back; over the other spine
    they lose only when the reply happened to take the bad one."""
    out = []
    for i in range(4):
        for a, b in ((_nic(0, i), _nic(1, i)), (_nic(1, i), _nic(0, i))):
            out += [_obs(a, b, bad, 100, 8), _obs(a, b, other, 100, 3)]
    return out


def test_a_traced_spine_is_named_by_its_address_and_the_lossy_uplink_is_blamed() -> None:
    blames = _localise(_between_b0_and_b1(SPINE_AT["spine-1"], SPINE_AT["spine-0"]))
    assert blames == [("link", "leaf-b0-r0<->spine-1")]


def test_uplinks_that_lose_alike_stay_a_path_fault_on_the_leaf() -> None:
    cross = []
    for i in range(4):
        for a, b in ((_nic(0, i), _nic(1, i)), (_nic(1, i), _nic(0, i))):
            cross += [_obs(a, b, SPINE_AT["spine-1"], 100, 5), _obs(a, b, SPINE_AT["spine-0"], 100, 4)]
    assert _localise(cross) == [("path", "leaf-b0-r0")]


def test_an_address_the_fabric_does_not_give_is_untraced() -> None:
    cross = []
    for i in range(4):
        for a, b in ((_nic(0, i), _nic(1, i)), (_nic(1, i), _nic(0, i))):
            cross += [_obs(a, b, "10.77.0.1", 200, 11)]
    assert _localise(cross) == [("path", "leaf-b0-r0")]
