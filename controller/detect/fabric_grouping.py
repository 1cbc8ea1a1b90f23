"""Grouping on the fabric: which conditions are one fault, and what its root cause is.

Stateless between calls: a set of active conditions in, groups out, following the
precedence the correlator's docstring gives (a switch over its NICs, a partition over lost
heartbeats, a node over its GPUs). The correlator (controller.detect.correlate) owns the
incidents' lifecycle around it.

A leaf is blamed when host links of several of its nodes fail together, unless the leaf's own
agent says otherwise: ``port_clean(switch, port, since_ms)`` (controller.detect.switch_witness)
tells whether the switch's latest report, taken after ``since_ms``, has that port up and clean.
When every one of those links' leaf ports is clean after its condition began, and the switch
raised nothing about them itself, the nodes' conditions stay their own (NIC, link or node
faults): a switch that says its ports are clean is not blamed for them.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from controller.detect.agent_conflict import RULE as AGENT_CONFLICT_RULE
from controller.detect.correlation_settings import CorrelationConfig
from controller.detect.model import ComponentType, Condition
from controller.fabric.model import LINK_SEPARATOR, Fabric

Key = tuple[str, str]
Signature = tuple[str, str]
NETWORK_CATEGORIES = frozenset({"nic_link", "nic_errors", "switch", "switch_port"})
HOST_LINK_CATEGORIES = frozenset({"nic_link", "nic_errors"})  # what a node says about its own NICs
_NIC_RE = re.compile(r"/nic-\d+$")
_OPTIC_WORDS = ("optic", "transceiver", "dom")
_SILENT_WORDS = ("silent", "stale", "unreachable")


@dataclass
class Group:
    """One would-be incident: its kind, root cause and member condition keys."""

    kind: str
    root_cause: str
    component_type: ComponentType
    members: set[Key] = field(default_factory=set)
    nodes: set[str] = field(default_factory=set)
    disc: str = ""  # discriminator when root_cause does not identify the group (partitions)
    note: dict[str, Any] = field(default_factory=dict)  # why it was grouped this way

    @property
    def signature(self) -> Signature:
        return (self.kind, self.disc or self.root_cause)


@dataclass
class _Net:
    """What a network condition says about the graph."""

    cond: Condition
    nic: str | None = None  # the host NIC it concerns
    node: str | None = None
    leaf: str | None = None  # the leaf that NIC is cabled to
    switch: str | None = None  # set when it is a switch's own condition (switch or switch:port)
    port: str | None = None
    peer: str | None = None  # what is cabled to switch:port
    spine: str | None = None  # spine implicated (own condition or uplink toward it)
    uplink_leaf: str | None = None  # leaf end of an uplink condition
    cable: str | None = None  # a condition whose component is a cable


class Grouper:
    """Pure grouping: a set of conditions -> groups, following the module's precedence."""

    def __init__(
        self,
        fabric: Fabric | None,
        config: CorrelationConfig,
        fleet_size: Callable[[], int] | None = None,
        port_clean: Callable[[str, str, int], bool] | None = None,
    ) -> None:
        """``port_clean``: the switches' own word on their ports (see the module docstring); None: never asked."""
        self.fabric = fabric
        self.config = config
        self._fleet_size = fleet_size
        self._port_clean = port_clean

    # -- names ---------------------------------------------------------------------------

    def _kind(self, name: str) -> str | None:
        fab = self.fabric
        if fab is not None and name in fab:
            return fab.kind(name)
        if _NIC_RE.search(name):
            return "nic"
        if name.startswith("spine"):
            return "spine"
        if name.startswith("leaf"):
            return "leaf"
        return None

    def _host(self, nic: str) -> str:
        fab = self.fabric
        if fab is not None and nic in fab:
            return fab.host_of(nic)
        return nic.rsplit("/", 1)[0]

    def _leaf_of(self, nic: str) -> str | None:
        fab = self.fabric
        if fab is not None and nic in fab:
            return fab.leaf_of(nic)
        return None

    def _cable(self, a: str, b: str) -> str:
        fab = self.fabric
        if fab is not None:
            return fab.link_name(a, b)
        return f"{a}{LINK_SEPARATOR}{b}"

    def _facts(self, c: Condition) -> _Net:
        f = _Net(cond=c, node=c.node)
        comp = c.component
        if LINK_SEPARATOR in comp:
            f.cable = comp
            ends = Fabric.link_ends(comp)
            kinds = {self._kind(e): e for e in ends}
            if "nic" in kinds:
                f.nic = kinds["nic"]
                other = ends[1] if ends[0] == f.nic else ends[0]
                f.leaf = self._leaf_of(f.nic) or (other if self._kind(other) == "leaf" else None)
            elif "spine" in kinds and "leaf" in kinds:
                f.spine, f.uplink_leaf = kinds["spine"], kinds["leaf"]
        elif ":" in comp:
            switch, _, port = comp.partition(":")
            f.switch, f.port = switch, port
            fab = self.fabric
            peer = fab.peer_at(switch, port) if fab is not None and switch in fab else None
            ev_peer = c.evidence.get("peer")
            f.peer = peer or (ev_peer if isinstance(ev_peer, str) and ev_peer else None)
            sk, pk = self._kind(switch), self._kind(f.peer) if f.peer else None
            if pk == "nic" and f.peer is not None:
                f.nic, f.leaf = f.peer, switch
            elif sk == "leaf" and pk == "spine":
                f.spine, f.uplink_leaf = f.peer, switch
            elif sk == "spine":
                f.spine = switch
                f.uplink_leaf = f.peer if pk == "leaf" else None
        else:
            kind = self._kind(comp)
            if kind == "nic":
                f.nic = comp
                f.leaf = self._leaf_of(comp)
            elif kind in ("leaf", "spine"):
                f.switch = comp
                if kind == "spine":
                    f.spine = comp
        if f.nic is not None:
            f.node = self._host(f.nic)
        return f

    # -- grouping ------------------------------------------------------------------------

    def group(self, conds: Iterable[Condition]) -> list[Group]:
        """Group conditions; every condition lands in exactly one group."""
        by_cat: dict[str, list[Condition]] = {}
        for c in sorted(conds, key=lambda c: c.key):
            by_cat.setdefault(c.category, []).append(c)
        out: dict[Signature, Group] = {}
        self._heartbeats(by_cat.pop("heartbeat", []), out)
        net = [c for cat in sorted(NETWORK_CATEGORIES) for c in by_cat.pop(cat, [])]
        self._network(sorted(net, key=lambda c: c.key), out)
        self._gpus(by_cat.pop("gpu", []), out)
        # A node that is slow because of a fault already found (a NIC down, a PFC storm, a
        # throttled GPU, a dead leaf) is explained by it: it joins that incident as evidence.
        explained: dict[str, Group] = {}
        for g in sorted(out.values(), key=lambda g: g.signature):
            if g.kind not in ("partition", "node_down"):
                for n in g.nodes:
                    explained.setdefault(n, g)
        for c in by_cat.pop("failslow", []):
            node = c.node or c.component
            cause = explained.get(node)
            if cause is not None:
                cause.members.add(c.key)
                cause.note.setdefault("explained_stragglers", []).append(node)
            else:
                self._add(out, "straggler", node, "node", [c], [node])
        for c in by_cat.pop("agent", []):  # the agent itself: never explained by a hardware fault
            node = c.node or c.component
            if c.rule == AGENT_CONFLICT_RULE:  # someone else speaks as the node
                self._add(out, "agent_conflict", node, "node", [c], [node])
            else:  # its own troubles (a damaged buffer): seen and alerted, never a reason to evict
                self._add(out, "other", c.component, c.component_type, [c], [node])
        for c in by_cat.pop("hang", []):  # one job's verdict, decided on the jobs floor: its own incident
            nodes = c.evidence.get("nodes") or ([c.node] if c.node else [])
            self._add(out, "job_hang", c.component, "job", [c], [str(n) for n in nodes])
        for c in by_cat.pop("path", []):  # probes' loss above a leaf, its uplink not traced
            # the leaf itself named since (its ring lost too): the path was the leaf's own fault,
            # and its incident is absorbed by the leaf's (controller.detect.probe_persist)
            leaf = next((g for g in out.values() if g.kind == "switch_fault" and g.root_cause == c.component), None)
            if leaf is not None:
                leaf.members.add(c.key)
            else:
                self._add(out, "path_fault", c.component, "network", [c], [])
        for c in by_cat.pop("host", []):
            node = c.node or c.component
            self._add(out, "host_fault", node, "node", [c], [node])
        for cat in sorted(by_cat):
            for c in by_cat[cat]:
                self._add(out, "other", c.component, c.component_type, [c], [c.node] if c.node else [])
        return sorted(out.values(), key=lambda g: g.signature)

    @staticmethod
    def _add(
        out: dict[Signature, Group],
        kind: str,
        root: str,
        ctype: str,
        conds: Iterable[Condition],
        nodes: Iterable[str | None],
        disc: str = "",
        note: dict[str, Any] | None = None,
    ) -> Group:
        sig = (kind, disc or root)
        g = out.get(sig)
        if g is None:
            g = out[sig] = Group(kind, root, cast(ComponentType, ctype), disc=disc)
        g.members.update(c.key for c in conds)
        g.nodes.update(n for n in nodes if n)
        if note:
            g.note.update(note)
        return g

    def fleet_size(self) -> int | None:
        if self._fleet_size is not None:
            return self._fleet_size()
        return len(self.fabric.nodes()) if self.fabric is not None else None

    def _heartbeats(self, conds: list[Condition], out: dict[Signature, Group]) -> None:
        cfg = self.config
        by_node: dict[str, list[Condition]] = {}
        for c in conds:
            by_node.setdefault(c.node or c.component, []).append(c)
        lost = set(by_node)
        fleet = self.fleet_size()
        if fleet and len(lost) >= cfg.partition_min_nodes and len(lost) > cfg.partition_fleet_share * fleet:
            members = [c for n in sorted(lost) for c in by_node[n]]
            note = {"reason": "fleet_share", "lost": len(lost), "fleet": fleet}
            self._add(out, "partition", "", "network", members, lost, disc="fleet", note=note)
            return
        fab = self.fabric
        if fab is not None:
            leaves_of: dict[str, set[str]] = {}
            for n in lost:
                if n in fab and fab.kind(n) == "node":
                    leaves_of[n] = {leaf for nic in fab.nics_of(n) if (leaf := fab.leaf_of(nic))}
            remaining = set(leaves_of)
            while remaining:
                counts = Counter(leaf for n in remaining for leaf in leaves_of[n])
                if not counts:
                    break
                leaf, count = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
                if count < cfg.partition_min_nodes:
                    break
                nodes = {n for n in remaining if leaf in leaves_of[n]}
                common = sorted(set.intersection(*(leaves_of[n] for n in nodes)))
                members = [c for n in sorted(nodes) for c in by_node[n]]
                note = {"reason": "behind_switch", "switches": common, "lost": len(nodes)}
                self._add(out, "partition", "", "network", members, nodes, disc=f"behind:{leaf}", note=note)
                remaining -= nodes
                lost -= nodes
        for n in sorted(lost):
            self._add(out, "node_down", n, "node", by_node[n], [n])

    # Complexity over 15 on purpose: the leaf/spine/partition grouping reads as one pass; splitting it scatters the
    # order of the tests.
    def _network(self, conds: list[Condition], out: dict[Signature, Group]) -> None:  # noqa: C901
        cfg = self.config
        facts = [self._facts(c) for c in conds]
        used: set[Key] = set()

        def take(fs: Iterable[_Net]) -> list[Condition]:
            picked = [f.cond for f in fs if f.cond.key not in used]
            used.update(c.key for c in picked)
            return picked

        # 2. spines: their own conditions, or uplinks of several leaves toward them.
        by_spine: dict[str, list[_Net]] = {}
        for f in facts:
            if f.spine:
                by_spine.setdefault(f.spine, []).append(f)
        for spine in sorted(by_spine):
            fs = by_spine[spine]
            leaves = sorted({f.uplink_leaf for f in fs if f.uplink_leaf})
            reports_itself = any(f.switch == spine for f in fs)
            if len(leaves) >= cfg.min_leaves_for_spine or reports_itself:
                self._add(out, "switch_fault", spine, "switch", take(fs), [], note={"leaves": leaves})

        # 3. leaves: host links of several nodes on one leaf fail together.
        by_leaf: dict[str, list[_Net]] = {}
        for f in facts:
            if f.nic and f.leaf and f.cond.key not in used:
                by_leaf.setdefault(f.leaf, []).append(f)
        leaf_groups: list[tuple[str, list[_Net]]] = []
        cleared: dict[Key, str] = {}  # host link condition -> the leaf whose agent reports its port clean
        for leaf in sorted(by_leaf):
            fs = by_leaf[leaf]
            nodes = {f.node for f in fs if f.node}
            if len(nodes) >= cfg.min_nodes_for_switch:
                # The leaf's own conditions, and its uplinks as the spines see them: a dead
                # leaf is one incident, not one plus a link fault per spine cable.
                own = [f for f in facts if leaf in (f.switch, f.uplink_leaf) and f.cond.key not in used]
                if self._leaf_says_clean(leaf, fs, own):
                    cleared.update((f.cond.key, leaf) for f in fs)  # the NICs' own faults (step 5)
                    continue
                leaf_groups.append((leaf, fs + own))
        fab = self.fabric
        spine_fold: str | None = None
        if fab is not None and len(leaf_groups) >= 2 and all(leaf in fab for leaf, _ in leaf_groups):
            common = set.intersection(*(set(fab.spines_of(leaf)) for leaf, _ in leaf_groups))
            if len(common) == 1:  # partial mesh: only one spine is shared by every failing leaf
                spine_fold = common.pop()
        for leaf, fs in leaf_groups:
            nodes_l = [f.node for f in fs]
            if spine_fold is not None:
                self._add(
                    out,
                    "switch_fault",
                    spine_fold,
                    "switch",
                    take(fs),
                    nodes_l,
                    note={"leaves": sorted(leaf for leaf, _ in leaf_groups)},
                )
            else:
                self._add(
                    out,
                    "switch_fault",
                    leaf,
                    "switch",
                    take(fs),
                    nodes_l,
                    note={"nodes": len({n for n in nodes_l if n})},
                )

        # 4. switches' own conditions left over.
        for f in facts:
            if f.cond.key in used or f.switch is None:
                continue
            c = f.cond
            optic = _is_optic(c)
            if f.nic is not None and (c.category == "switch_port" or optic):
                continue  # the switch side of a host link: paired with its NIC below
            if f.peer and f.port and (c.category == "switch_port" or optic):
                cable = self._cable(f.switch, f.peer)
                self._add(out, "link_fault", cable, "link", take([f]), [f.node])
            else:
                self._add(out, "switch_fault", f.switch, "switch", take([f]), [])
        for f in facts:  # leaf<->spine cables not claimed by a spine
            if f.cond.key not in used and f.cable and f.nic is None:
                self._add(out, "link_fault", f.cable, "link", take([f]), [])

        # 5. host NICs left over.
        by_nic: dict[str, list[_Net]] = {}
        for f in facts:
            if f.cond.key not in used and f.nic:
                by_nic.setdefault(f.nic, []).append(f)
        nic_faults: dict[str, list[tuple[str, list[_Net]]]] = {}
        for nic in sorted(by_nic):
            fs = by_nic[nic]
            if any(f.switch or f.cable for f in fs):
                on_leaf = next((f.leaf for f in fs if f.leaf), None)
                named = next((f.cable for f in fs if f.cable), None)
                cable = named or (self._cable(nic, on_leaf) if on_leaf else nic)
                self._add(out, "link_fault", cable, "link", take(fs), [self._host(nic)])
            else:
                nic_faults.setdefault(self._host(nic), []).append((nic, fs))
        for node in sorted(nic_faults):
            items = nic_faults[node]
            if len(items) >= cfg.node_device_threshold:
                fs_all = [f for _, fs in items for f in fs]
                self._add(out, "node_fault", node, "node", take(fs_all), [node], note={"nics": len(items)})
            else:
                for nic, fs in items:
                    leaf_word = next((cleared[f.cond.key] for f in fs if f.cond.key in cleared), None)
                    note = {"switch_reports_clean": leaf_word} if leaf_word else None
                    self._add(out, "nic_fault", nic, "nic", take(fs), [node], note=note)
        for f in facts:  # e.g. a node-level NIC condition naming no port
            if f.cond.key not in used:
                c = f.cond
                kind = "nic_fault" if c.category in ("nic_link", "nic_errors") else "switch_fault"
                self._add(out, kind, c.component, c.component_type, take([f]), [c.node])

    def _leaf_says_clean(self, leaf: str, fs: list[_Net], own: list[_Net]) -> bool:
        """True when ``leaf``'s agent reports every leaf port of these host links clean, each in a
        report taken after that link's condition began, and raised nothing about them itself."""
        fab = self.fabric
        if self._port_clean is None or fab is None:
            return False
        ports: set[str] = set()
        for f in fs:
            if f.cond.category not in HOST_LINK_CATEGORIES or f.nic is None or f.nic not in fab:
                return False  # the switch's own word on the link (a port down), or a NIC off the fabric
            port = fab.port_of(f.nic)
            if port is None or not self._port_clean(leaf, port, f.cond.first_seen_ms):
                return False
            ports.add(port)
        return not any(f.switch == leaf and (f.port is None or f.port in ports) for f in own)

    def _gpus(self, conds: list[Condition], out: dict[Signature, Group]) -> None:
        by_node: dict[str, list[Condition]] = {}
        for c in conds:
            node = c.node or (self._host(c.component) if "/" in c.component else c.component)
            by_node.setdefault(node, []).append(c)
        for node in sorted(by_node):
            cs = by_node[node]
            gpus = sorted({c.component for c in cs if c.component_type == "gpu"})
            if len(gpus) >= self.config.node_device_threshold:
                self._add(out, "node_fault", node, "node", cs, [node], note={"gpus": len(gpus)})
                continue
            node_level = [c for c in cs if c.component_type != "gpu"]
            if node_level:
                self._add(out, "node_fault", node, "node", node_level, [node])
            for gpu in gpus:
                self._add(out, "gpu_fault", gpu, "gpu", [c for c in cs if c.component == gpu], [node])


def _is_optic(c: Condition) -> bool:
    text = c.rule.lower()
    return any(w in text for w in _OPTIC_WORDS) or bool(c.evidence.get("optic"))


def is_silence(c: Condition) -> bool:
    text = c.rule.lower()
    return any(w in text for w in _SILENT_WORDS) or bool(c.evidence.get("silent"))
