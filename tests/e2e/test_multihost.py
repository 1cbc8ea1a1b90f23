"""Multi-host end to end: the real controller, agents and lldpd on separate network namespaces.

One cluster for the module (tests/netns/cluster.py): a controller host, four node hosts and
four leaf hosts wired as a two-rail fabric with veth cables, the management network bridged
through each block's rail-0 leaf. Every scenario starts from all links up (the ``net``
fixture restores them and waits until the controller sees every node online and every
cable confirmed by LLDP), cuts something real, and asserts what the controller saw.

Select with ``pytest -m netns``. Needs root, iproute2, nftables and lldpd: without them the
tests skip on a workstation and fail in CI (CI=true), never pass silently.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from starpulse.core.vocab import EVICTABLE_KINDS
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb
from tests.netns.cluster import HEARTBEAT_TIMEOUT_S, MultiHostCluster, start_cluster
from tests.netns.harness import require_lab, run, sigterm_raises, sweep_stale, wait_until

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.timeout(300)]

IGNORABLE_XIDS = (43, 45, 63, 92, 121)  # catalog action "none": events, no remediation
LINK_DOWN = tpb.EVENT_KIND_NIC_LINK_DOWN
LINK_UP = tpb.EVENT_KIND_NIC_LINK_UP
LOSS_RULESET = """
table inet starpulse_loss {
    chain input {
        type filter hook input priority 0; policy accept;
        iifname "mgmt0" numgen random mod 100 < 25 counter drop
    }
    chain output {
        type filter hook output priority 0; policy accept;
        oifname "mgmt0" numgen random mod 100 < 25 counter drop
    }
}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiHostCluster]:
    require_lab()
    sweep_stale()
    with sigterm_raises():
        c = start_cluster(tmp_path_factory.mktemp("multihost"))
        try:
            yield c
        finally:
            prefix = c.lab.prefix
            c.close()
            assert not c.lab.leftovers(), f"namespaces of {prefix} left behind"


@pytest.fixture
def net(cluster: MultiHostCluster) -> Iterator[MultiHostCluster]:
    cluster.restore()
    cluster.wait_healthy(timeout=30)
    yield cluster
    cluster.restore()


def _now_ms() -> int:
    return int(time.time() * 1000)


def _inject_xids(net: MultiHostCluster, node: str, count: int, tag: str) -> set[str]:
    """``count`` Xid lines with distinct (gpu, xid) keys where possible; their kmsg seqs."""
    seqs = set()
    for i in range(count):
        gpu, xid = i % net.gpus, IGNORABLE_XIDS[(i // net.gpus) % len(IGNORABLE_XIDS)]
        seqs.add(str(net.xid(node, gpu, xid, f"{tag} {i}")))
    return seqs


def _stored_kmsg_seqs(net: MultiHostCluster, node: str) -> list[str]:
    return [e.attributes["kmsg_seq"] for e in net.events(node) if "kmsg_seq" in e.attributes]


def _assert_exactly_once(net: MultiHostCluster, node: str, injected: set[str]) -> None:
    """Every event seq 1..N stored once, and each injected kernel-log record exactly once."""
    events = net.events(node)
    seqs = sorted(e.seq for e in events)
    assert seqs == list(range(1, len(seqs) + 1)), f"{node}: event seqs not contiguous/unique: {seqs}"
    kmsg = [e.attributes["kmsg_seq"] for e in events if e.attributes.get("kmsg_seq") in injected]
    assert sorted(kmsg) == sorted(injected), f"{node}: lost or duplicated: {sorted(kmsg)} vs {sorted(injected)}"


def _incidents_since(net: MultiHostCluster, t0_ms: int, **match: str) -> list:
    return [
        i for i in net.incidents() if i.opened_ms >= t0_ms - 1000 and all(getattr(i, k) == v for k, v in match.items())
    ]


def _link_events(net: MultiHostCluster, node: str, after_seq: int, component: str) -> list[int]:
    return [
        e.kind
        for e in sorted(net.events(node), key=lambda e: e.seq)
        if e.seq > after_seq and e.kind in (LINK_DOWN, LINK_UP) and e.component == component
    ]


def _nodes(net: MultiHostCluster) -> list[Any]:
    return list(net.query().ListNodes(spb.ListNodesRequest(), timeout=5).nodes)


def _last_seq(net: MultiHostCluster, node: str) -> int:
    return max((e.seq for e in net.events(node)), default=0)


class TestMultiHost:
    def test_lldp_neighbours_come_from_real_frames(self, net: MultiHostCluster) -> None:
        """Each node's lldpd hears its two leaves on the ports the fabric declares; the controller agrees."""

        def node_hears(node: str) -> bool:
            expected = sorted((c.netdev, c.leaf, c.port) for c in net.cables if c.node == node)
            return sorted(net.lldp_neighbours(node)) == expected

        def leaf_hears(leaf: str) -> bool:
            heard = {name for _, name, _ in net.lldp_neighbours(leaf)}
            return heard == {c.node for c in net.cables if c.leaf == leaf}

        # a cable an earlier test took down and restored is heard again at lldpd's next frame
        wait_until(lambda: all(node_hears(n) for n in net.node_ids), 40, "each node's two leaves over LLDP")
        wait_until(lambda: all(leaf_hears(leaf) for leaf in net.fabric.leaves()), 40, "each leaf's nodes over LLDP")
        topo = net.topology()
        assert topo.nodes_reporting_lldp == len(net.node_ids)
        assert list(topo.missing_links) == [] and list(topo.miswired) == [] and list(topo.unknown_devices) == []

    def test_management_cut_buffers_events_and_replays_them(self, net: MultiHostCluster) -> None:
        """node-000 loses its management link: unreachable; events written meanwhile, before and after
        its agent restarts, arrive once each when it is back."""
        node, neighbour = "node-000", "node-001"  # same management switch, different port
        leaf = net.mgmt_leaf(node)
        t0 = _now_ms()
        net.lab.set_link(leaf, f"m-{node}", False)
        injected = _inject_xids(net, node, 10, "during-cut")
        wait_until(
            lambda: net.node_states().get(node) == "unreachable",
            HEARTBEAT_TIMEOUT_S + 10,
            f"{node} unreachable",
            diagnose=net.diagnose,
        )
        assert net.node_states()[neighbour] == "online"
        wait_until(lambda: net.buffered_events(node) >= len(injected), 15, "the events held in the agent's buffer")
        assert not injected & set(_stored_kmsg_seqs(net, node)), "events crossed a cut link"
        net.restart_agent(node)  # the buffer survives on disk; the new agent cannot reach the controller either
        injected |= _inject_xids(net, node, 4, "after-restart")
        wait_until(lambda: net.buffered_events(node) >= len(injected), 15, "the new events buffered too")
        wait_until(
            lambda: _incidents_since(net, t0, kind="node_down", root_cause=node), 15, f"node_down incident for {node}"
        )
        net.lab.set_link(leaf, f"m-{node}", True)
        wait_until(lambda: net.node_states().get(node) == "online", 40, f"{node} back online", diagnose=net.diagnose)
        wait_until(lambda: injected <= set(_stored_kmsg_seqs(net, node)), 30, "buffered events replayed")
        _assert_exactly_once(net, node, injected)

    def test_switch_uplink_cut_is_one_partition_and_blames_no_node(self, net: MultiHostCluster) -> None:
        """The management uplink of leaf-b1-r0 goes down: both nodes behind it are lost, one partition incident."""
        leaf = "leaf-b1-r0"
        behind = sorted(n for n in net.node_ids if net.mgmt_leaf(n) == leaf)
        others = sorted(set(net.node_ids) - set(behind))
        assert len(behind) >= 2
        t0 = _now_ms()
        net.lab.set_link(leaf, "uplink", False)
        wait_until(
            lambda: all(net.node_states().get(n) == "unreachable" for n in behind),
            HEARTBEAT_TIMEOUT_S + 10,
            f"{behind} unreachable",
            diagnose=net.diagnose,
        )
        states = net.node_states()
        assert all(states[n] == "online" for n in others), states
        found = wait_until(lambda: _incidents_since(net, t0, kind="partition"), 15, "a partition incident")
        assert isinstance(found, list) and len(found) == 1, found
        inc = found[0]
        assert sorted(inc.affected_nodes) == behind
        assert inc.root_cause == "" and inc.component_type == "network"
        assert inc.action == "investigate_network"
        members = {c["node"] for c in json.loads(inc.evidence_json)}
        assert sorted(members) == behind  # one heartbeat condition per lost node, all in this incident
        blamed = [i for i in _incidents_since(net, t0) if i.id != inc.id and set(i.affected_nodes) & set(behind)]
        assert not blamed, "a lost node blamed on its own (node_down or an evictable kind)"
        assert inc.kind not in EVICTABLE_KINDS
        net.lab.set_link(leaf, "uplink", True)
        wait_until(
            lambda: all(net.node_states().get(n) == "online" for n in behind),
            40,
            f"{behind} back online",
            diagnose=net.diagnose,
        )
        wait_until(
            lambda: any(i.id == inc.id and i.resolved_ms for i in net.incidents()),
            20,
            "the partition incident resolved",
        )

    def test_fabric_link_down_changes_finding_and_learned_topology(self, net: MultiHostCluster) -> None:
        """The leaf port of node-001's rail-1 cable goes down: NIC-down event and incident, and LLDP loses the cable."""
        cable = net.cable("node-001", 1)
        component = "mlx5_1/1"
        base = _last_seq(net, cable.node)
        t0 = _now_ms()
        net.lab.set_link(cable.leaf, cable.port, False)
        wait_until(
            lambda: _link_events(net, cable.node, base, component) == [LINK_DOWN],
            15,
            "nic_link_down from the real carrier",
            diagnose=net.diagnose,
        )
        down = next(e for e in net.events(cable.node) if e.seq > base and e.kind == LINK_DOWN)
        assert down.attributes["netdev"] == cable.netdev and down.source == "sysfs"
        missing = f"{cable.nic} expected on {cable.leaf} port {cable.port}, not seen"
        wait_until(lambda: missing in net.topology().missing_links, 20, "the cable missing from learned topology")
        assert list(net.topology().missing_links) == [missing]
        assert (cable.netdev, cable.leaf, cable.port) not in net.lldp_neighbours(cable.node)
        found = wait_until(lambda: _incidents_since(net, t0, root_cause=cable.nic), 15, f"an incident on {cable.nic}")
        assert isinstance(found, list) and found[0].kind in ("nic_fault", "link_fault")
        assert net.node_states()[cable.node] == "online"  # management is a different network
        net.lab.set_link(cable.leaf, cable.port, True)
        wait_until(
            lambda: _link_events(net, cable.node, base, component) == [LINK_DOWN, LINK_UP],
            15,
            "nic_link_up when the carrier returns",
        )
        wait_until(lambda: not net.topology().missing_links, 20, "the cable confirmed by LLDP again")

    def test_a_cable_pulled_is_an_event_at_once_at_a_60s_report_interval(self, net: MultiHostCluster) -> None:
        """node-002's agent reporting every 60 s: its rail-1 cable cut at the leaf still reaches the
        controller as nic_link_down within seconds (netlink wakes the agent's link watch), long
        before the next report could have carried it. The time it takes is printed, not asserted."""
        cable = net.cable("node-002", 1)
        base = _last_seq(net, cable.node)
        restarted_ms = _now_ms()
        net.restart_agent(cable.node, interval_s=60.0)
        try:
            wait_until(
                lambda: any(n.node_id == cable.node and n.last_seen_ms > restarted_ms for n in _nodes(net)),
                30,
                "the 60 s agent's first report",
            )
            time.sleep(1.0)  # its first cycle listed the ports; the watch polls from there
            cut = time.time()
            net.lab.set_link(cable.leaf, cable.port, False)
            wait_until(
                lambda: LINK_DOWN in _link_events(net, cable.node, base, "mlx5_1/1"),
                15,
                "nic_link_down from the cut, with no report due for a minute",
                diagnose=net.diagnose,
            )
            assert time.time() - cut < 60  # no report could have carried it
            down = next(e for e in net.events(cable.node) if e.seq > base and e.kind == LINK_DOWN)
            print(f"cable cut -> event stored at the controller: {(time.time() - cut) * 1000:.0f} ms (upper bound)")
            assert down.attributes["netdev"] == cable.netdev
        finally:
            net.lab.set_link(cable.leaf, cable.port, True)
            net.restart_agent(cable.node)

    # Timing-bound: 1.0 s between the link's up and down equals resolve_hold_s; under load it can miss (issue 16 note).
    @pytest.mark.flaky(reruns=2, reruns_delay=1)
    def test_flapping_link_reports_every_transition_in_one_incident(self, net: MultiHostCluster) -> None:
        """node-002's rail-0 cable flaps three times: six transitions in order, and the NIC keeps one incident."""
        cable = net.cable("node-002", 0)
        component = "mlx5_0/1"
        base = _last_seq(net, cable.node)
        t0 = _now_ms()
        expected: list[int] = []

        def toggle(up: bool) -> None:
            net.lab.set_link(cable.leaf, cable.port, up)
            expected.append(LINK_UP if up else LINK_DOWN)
            wait_until(
                lambda: _link_events(net, cable.node, base, component) == expected,
                15,
                f"transition {len(expected)} seen by the controller",
                diagnose=net.diagnose,
            )

        toggle(False)
        first = wait_until(lambda: _incidents_since(net, t0, root_cause=cable.nic), 15, f"an incident on {cable.nic}")
        assert isinstance(first, list) and len(first) == 1
        for up in (True, False, True, False, True):
            toggle(up)
        ids = {i.id for i in _incidents_since(net, t0, root_cause=cable.nic)}
        assert ids == {first[0].id}, f"a flapping NIC keeps its one incident, got {ids}"

    def test_swapped_cables_are_miswires_and_the_fabric_follows(self, net: MultiHostCluster) -> None:
        """node-000's two cables swapped: both miswires reported from real LLDP while it lasts, gone when put back."""
        a, b = net.cable("node-000", 0), net.cable("node-000", 1)
        net.swap_cables_at_node(a.node, a.rail, b.rail)
        swapped = sorted([(a.netdev, b.leaf, b.port), (b.netdev, a.leaf, a.port)])
        wait_until(lambda: sorted(net.lldp_neighbours(a.node)) == swapped, 15, "lldpd hears the new wiring")
        expected = sorted(
            [f"{a.nic} expected on {a.leaf}, seen on {b.leaf}", f"{b.nic} expected on {b.leaf}, seen on {a.leaf}"]
        )
        wait_until(lambda: sorted(net.topology().miswired) == expected, 20, "both miswires reported", diagnose=net._why)
        assert list(net.topology().missing_links) == []  # every cable is seen, only in the wrong place
        net.restore()
        wait_until(
            lambda: (
                sorted(net.lldp_neighbours(a.node)) == sorted([(a.netdev, a.leaf, a.port), (b.netdev, b.leaf, b.port)])
            ),
            15,
            "lldpd hears the original wiring",
        )
        wait_until(lambda: not net.topology().miswired, 20, "the miswires cleared once cabled back", diagnose=net._why)

    def test_packet_loss_still_delivers_every_event(self, net: MultiHostCluster) -> None:
        """25% of node-003's management packets dropped each way (nftables): every event arrives exactly once."""
        node = "node-003"
        net.lab.nft(node, LOSS_RULESET)
        injected = _inject_xids(net, node, 20, "lossy")
        wait_until(
            lambda: injected <= set(_stored_kmsg_seqs(net, node)),
            60,
            "every event through the lossy link",
            diagnose=net.diagnose,
        )
        _assert_exactly_once(net, node, injected)
        ruleset = run(["ip", "netns", "exec", net.lab.ns(node), "nft", "-j", "list", "ruleset"]).stdout
        dropped = sum(item["counter"]["packets"] for item in _exprs(json.loads(ruleset)) if "counter" in item)
        assert dropped > 0, "the loss rule dropped nothing: the test proved nothing"


def _exprs(doc: dict) -> list[dict]:
    out = []
    for item in doc.get("nftables", []):
        out.extend(x for x in item.get("rule", {}).get("expr", []) if isinstance(x, dict))
    return out
