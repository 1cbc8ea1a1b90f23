"""Conditions become incidents: concurrent findings grouped by what they share on the fabric.

Sixteen NICs down at once on sixteen nodes is one broken leaf, not sixteen broken nodes;
evicting those nodes would be exactly wrong. So every condition waits a short settle
time (its siblings arrive within a report interval or two), then the whole batch is
grouped on the fabric graph and each group becomes one incident with one root cause.

Grouping precedence (each condition joins the first group that claims it; deterministic:
candidates are visited in name order and ties break by name):

1. ``partition`` - heartbeat conditions: at least ``partition_min_nodes`` lost nodes that
   all sit behind one leaf (in a rail-optimized fabric: the same block), or more than
   ``partition_fleet_share`` of the fleet, form ONE incident that blames no node (root
   cause "", component type "network"). Fewer: one ``node_down`` per node.
2. ``switch_fault`` on a spine - the spine's own conditions ("spine-2", "spine-2:Ethernet8")
   and uplink conditions whose far end is that spine (a leaf port whose peer is the spine,
   a leaf<->spine cable): when they implicate at least ``min_leaves_for_spine`` leaves or
   the spine reports itself.
3. ``switch_fault`` on a leaf - host-link conditions (NIC port down/errors, the NIC's
   cable, the leaf's host-facing port) of at least ``min_nodes_for_switch`` distinct nodes
   whose NICs sit on that leaf; the leaf's own conditions join as evidence. Leaf faults on
   several leaves that share exactly one spine (partial meshes) fold into that spine.
4. A switch's own conditions left over: an optic or port condition on a port with a known
   cable is a ``link_fault`` on that cable; anything else (silent, PFC watchdog storm) is a
   ``switch_fault`` on the switch (severity capped at warning when it is only "silent":
   the collector may be what died).
5. Host NIC conditions left over, per NIC: ``link_fault`` on its cable when the switch side
   also reports it (a condition on the cable or on the peer port), else ``nic_fault``.
   ``node_device_threshold`` or more faulty NICs on one node are a ``node_fault``.
6. GPU conditions: ``gpu_fault`` per GPU; ``node_device_threshold`` or more GPUs of one node
   (or a node-level GPU condition such as NVSwitch) are a ``node_fault``.
7. ``straggler`` (fail-slow) and ``host_fault`` (disk, memory) on the node.
8. Anything else: ``other`` on the condition's component.

Eviction rule (self-healing relies on it): only ``EVICTABLE_KINDS`` (gpu_fault, node_fault,
nic_fault, straggler, host_fault) may name a node to evict. Switch, link, partition and
node_down incidents get investigate/check verbs, never an eviction verb.

Lifecycle: opened (after settle) -> updated (members, severity or action changed) ->
resolved (every member condition resolved for ``resolve_hold_s``). Membership is sticky
while an incident is open, so a flapping NIC keeps its incident, and a recurrence soon
after resolution reopens the same incident (same id). When a larger group forms (a leaf
fault over NICs that each had their own incident) the smaller incidents are closed as
merged, pointing at the one that absorbed them: exactly one open incident per fault.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, cast

import structlog

from controller.detect.grouping import ripe_batch, standing_apart
from controller.detect.incidents import IncidentStore
from controller.detect.model import ComponentType, Condition, ConditionChange, Incident
from controller.fabric.model import LINK_SEPARATOR, Fabric
from starpulse.core import vocab
from starpulse.core.clock import SYSTEM_CLOCK, Clock
from starpulse.core.schema import setting
from starpulse.core.vocab import SEVERITY_ORDER, Severity

log = structlog.get_logger(__name__)

Key = tuple[str, str]
Signature = tuple[str, str]

# Kinds whose action is fixed by the kind, whatever their members recommend.
KIND_ACTIONS: dict[str, str] = {
    "switch_fault": "investigate_switch",
    "partition": "investigate_network",
    "link_fault": vocab.ACTION_CHECK_LINK,
    "straggler": vocab.ACTION_INVESTIGATE,
    "node_down": vocab.ACTION_INVESTIGATE,
    "other": vocab.ACTION_INVESTIGATE,
}
NETWORK_CATEGORIES = frozenset({"nic_link", "nic_errors", "switch", "switch_port"})
_ACTION_RANK = {a: i for i, a in enumerate(vocab.ACTIONS)}
_NIC_RE = re.compile(r"/nic-\d+$")
_OPTIC_WORDS = ("optic", "transceiver", "dom")
_SILENT_WORDS = ("silent", "stale", "unreachable")


@dataclass
class CorrelationConfig:
    """How long to wait, how many make a pattern, how long to hold. Times in seconds."""

    settle_s: float = setting(
        15.0,
        "Seconds: the longest a new condition waits for its siblings before it is grouped, and the wait "
        "while the fleet's report interval is not measured yet (controller.detect.grouping derives the rest)",
        ge=0,
    )
    node_window_s: float = setting(
        0.05,
        "Seconds a node-local condition (a GPU's Xid, lost GPU, DBE, a disk) waits for the same node's "
        "other devices, whose events arrive together: several GPUs failing at once are one node fault",
        ge=0,
    )
    sibling_slack_s: float = setting(
        0.25,
        "Seconds added to the siblings' measured report interval before a condition a shared component "
        "could explain (NIC, switch port, heartbeat) is grouped: transit and decision",
        ge=0,
    )
    event_window_s: float = setting(
        0.5,
        "Seconds such a condition waits when an event raised it (a port down, sent at once by the agents' "
        "link watch): its siblings' events arrive as fast (a 0.1 s poll, transit, decision)",
        ge=0,
    )
    min_nodes_for_switch: int = setting(
        2, "Distinct nodes whose NICs on one leaf must fail together to blame the leaf", ge=1
    )
    min_leaves_for_spine: int = setting(
        2, "Distinct leaves whose uplinks to one spine must fail together to blame the spine", ge=1
    )
    node_device_threshold: int = setting(
        3, "GPUs (or NICs) of one node failing at once that make it a node fault, not a device fault", ge=1
    )
    partition_min_nodes: int = setting(
        3, "Lost heartbeats behind one switch that make a partition rather than dead nodes", ge=1
    )
    partition_fleet_share: float = setting(
        0.2, "Share of the fleet (0..1): lost heartbeats above it make a partition wherever they are", gt=0, le=1
    )
    resolve_hold_s: float = setting(
        60.0,
        "Seconds of flap damping: an incident resolves only after all its conditions stayed resolved "
        "this long; a recurrence within it keeps (or reopens) the same incident",
        ge=0,
    )
    restart_grace_s: float = setting(
        300.0,
        "Seconds a resumed incident waits after a restart for its conditions to be raised again before "
        "it resolves (the condition engine rebuilds its state from fresh reports)",
        ge=0,
    )

    def __post_init__(self) -> None:
        if self.settle_s < 0 or self.resolve_hold_s < 0 or self.restart_grace_s < 0:
            raise ValueError("settle_s, resolve_hold_s and restart_grace_s must be >= 0")
        if min(self.min_nodes_for_switch, self.min_leaves_for_spine, self.node_device_threshold) < 1:
            raise ValueError("node/leaf/device thresholds must be >= 1")
        if self.partition_min_nodes < 1 or not 0 < self.partition_fleet_share <= 1:
            raise ValueError("partition_min_nodes must be >= 1 and partition_fleet_share in (0, 1]")


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
    ) -> None:
        self.fabric = fabric
        self.config = config
        self._fleet_size = fleet_size

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
        for leaf in sorted(by_leaf):
            fs = by_leaf[leaf]
            nodes = {f.node for f in fs if f.node}
            if len(nodes) >= cfg.min_nodes_for_switch:
                # The leaf's own conditions, and its uplinks as the spines see them: a dead
                # leaf is one incident, not one plus a link fault per spine cable.
                own = [f for f in facts if leaf in (f.switch, f.uplink_leaf) and f.cond.key not in used]
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
                    self._add(out, "nic_fault", nic, "nic", take(fs), [node])
        for f in facts:  # e.g. a node-level NIC condition naming no port
            if f.cond.key not in used:
                c = f.cond
                kind = "nic_fault" if c.category in ("nic_link", "nic_errors") else "switch_fault"
                self._add(out, kind, c.component, c.component_type, take([f]), [c.node])

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


def _is_silence(c: Condition) -> bool:
    text = c.rule.lower()
    return any(w in text for w in _SILENT_WORDS) or bool(c.evidence.get("silent"))


def summarize(c: Condition) -> dict[str, Any]:
    """A condition as incident evidence; complete enough to rebuild it after a restart."""
    return {
        "rule": c.rule,
        "component": c.component,
        "component_type": c.component_type,
        "category": c.category,
        "node": c.node,
        "severity": c.severity,
        "action": c.action,
        "message": c.message,
        "count": c.count,
        "first_seen_ms": c.first_seen_ms,
        "last_seen_ms": c.last_seen_ms,
        "resolved_ms": c.resolved_ms,
        "evidence": c.evidence,
    }


def _condition_from_summary(d: dict[str, Any], resolved_ms: int) -> Condition | None:
    try:
        return Condition(
            rule=str(d["rule"]),
            component=str(d["component"]),
            component_type=d.get("component_type", "node"),
            category=str(d.get("category", "")),
            node=d.get("node"),
            severity=d.get("severity", "warning"),
            action=str(d.get("action", vocab.ACTION_INVESTIGATE)),
            message=str(d.get("message", "")),
            first_seen_ms=int(d.get("first_seen_ms", 0)),
            last_seen_ms=int(d.get("last_seen_ms", 0)),
            count=int(d.get("count", 1)),
            evidence=dict(d.get("evidence") or {}),
            resolved_ms=resolved_ms,
        )
    except (KeyError, TypeError, ValueError):
        return None


class Correlator:
    """Turns condition changes into incident lifecycle changes, persisted in ``IncidentStore``.

    Single-threaded: call ``on_changes`` with every batch from the condition engine (and
    the fail-slow detector) and ``tick`` periodically (about once a second); ``tick``
    returns what happened to incidents since the last call.
    """

    def __init__(
        self,
        fabric: Fabric | None,
        store: IncidentStore,
        config: CorrelationConfig | None = None,
        jobs_of: Callable[[str], list[str]] = lambda node: [],
        fleet_size: Callable[[], int] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        window_ms: Callable[[Condition], int] | None = None,
    ) -> None:
        """``window_ms``: how long a new condition waits for its siblings (controller.detect.grouping);
        None: ``settle_s`` for every condition."""
        self.config = config or CorrelationConfig()
        self._window_ms = window_ms or (lambda _c: int(self.config.settle_s * 1000))
        self.store = store
        self.grouper = Grouper(fabric, self.config, fleet_size)
        self._jobs_of = jobs_of
        self.clock = clock
        self._clock_ms = clock.time_ms
        self._conds: dict[Key, Condition] = {}
        self._pending: dict[Key, int] = {}  # key -> ms when its grouping window closes, not yet grouped
        self._owner: dict[Key, str] = {}  # key -> open incident id
        self._open: dict[str, Incident] = {}
        self._groups: dict[str, Group] = {}  # open incident id -> the group it was built from
        self._not_before: dict[str, int] = {}  # resumed incidents: no resolution before this
        self._recent: dict[Signature, Incident] = {}  # resolved within the hold: reopen, not duplicate
        self._touched: set[str] = set()
        self._out: list[tuple[str, Incident]] = []
        self._resume()

    @property
    def fabric(self) -> Fabric | None:
        return self.grouper.fabric

    # -- input ---------------------------------------------------------------------------

    def on_changes(self, changes: Iterable[ConditionChange]) -> None:
        """Take condition changes; new conditions wait ``settle_s`` before they are grouped."""
        now = self._clock_ms()
        for ch in changes:
            c = ch.condition
            key = c.key
            self._conds[key] = c
            owner = self._owner.get(key)
            if owner is not None:
                self._touched.add(owner)
            elif ch.kind == "resolved" or not c.active:
                self._pending.pop(key, None)  # a blip shorter than settle_s opens nothing
                del self._conds[key]
            elif key not in self._pending:
                self._pending[key] = now + self._window_ms(c)

    def next_due_ms(self) -> int | None:
        """When the first pending condition's grouping window closes (None: nothing waits)."""
        return min(self._pending.values()) if self._pending else None

    def tick(self) -> list[tuple[str, Incident]]:
        """Group settled conditions, refresh and expire incidents; returns (change, incident) pairs."""
        now = self._clock_ms()
        due = ripe_batch(self._pending, self._conds, now)
        if due:
            batch = [k for k in due if self._conds[k].active]
            for k in due:
                del self._pending[k]
                if not self._conds[k].active:
                    del self._conds[k]
            if batch:
                self._regroup(batch, now)
        for iid in sorted(self._touched):
            inc = self._open.get(iid)
            if inc is not None and self._apply(inc, self._groups[iid], now):
                self._emit("updated", inc, {"reason": "member_changed"})
        self._touched.clear()
        self._expire(now)
        hold_ms = int(self.config.resolve_hold_s * 1000)
        for sig in [s for s, i in self._recent.items() if (i.resolved_ms or 0) + hold_ms < now]:
            del self._recent[sig]
        out, self._out = self._out, []
        return out

    # -- queries -------------------------------------------------------------------------

    def incidents(self, active_only: bool = True, limit: int = 100) -> list[Incident]:
        """Open incidents (newest first), or every stored incident when ``active_only`` is False."""
        if active_only:
            newest = sorted(self._open.values(), key=lambda i: (i.opened_ms, i.id), reverse=True)
            return [replace(i) for i in newest[:limit]]
        return self.store.list_incidents(active_only=False, limit=limit)

    def get(self, incident_id: str) -> Incident | None:
        inc = self._open.get(incident_id)
        return replace(inc) if inc is not None else self.store.get(incident_id)

    def incident_of(self, key: Key) -> Incident | None:
        """The open incident a condition belongs to, if any."""
        iid = self._owner.get(key)
        return self._open.get(iid) if iid else None

    # -- internals -----------------------------------------------------------------------

    def _resume(self) -> None:
        """Reload open incidents; their conditions count as resolved until raised again."""
        now = self._clock_ms()
        grace_ms = int(self.config.restart_grace_s * 1000)
        for inc in self.store.load_open():
            keys: set[Key] = set()
            for d in inc.evidence:
                c = _condition_from_summary(d, resolved_ms=now) if isinstance(d, dict) else None
                if c is not None:
                    self._conds.setdefault(c.key, c)
                    keys.add(c.key)
            keys.update(k for k in inc.condition_keys if k in self._conds)
            group = Group(inc.kind, inc.root_cause, inc.component_type, members=keys, nodes=set(inc.affected_nodes))
            if inc.kind == "partition":
                group.disc = f"resumed:{inc.id}"
            self._open[inc.id] = inc
            self._groups[inc.id] = group
            self._not_before[inc.id] = now + grace_ms
            for k in keys:
                self._owner[k] = inc.id
        if self._open:
            log.info("incidents_resumed", count=len(self._open))

    def _match(self, g: Group, taken: set[str], by_sig: dict[Signature, str]) -> str | None:
        iid = by_sig.get(g.signature)
        if iid is not None and iid not in taken:
            return iid
        if g.kind == "partition":
            best: tuple[int, str] | None = None
            for iid, og in self._groups.items():
                if iid in taken or og.kind != "partition":
                    continue
                overlap = len(og.members & g.members)
                if overlap and (best is None or (-overlap, iid) < (-best[0], best[1])):
                    best = (overlap, iid)
            if best is not None:
                return best[1]
        return None

    def _regroup(self, batch: list[Key], now: int) -> None:
        groups_of = {iid: (g.kind, g.members) for iid, g in self._groups.items() if iid in self._open}
        apart = standing_apart(groups_of, self._conds, batch, self._window_ms)
        pool = {k for k, iid in self._owner.items() if iid not in apart} | set(batch)
        groups = self.grouper.group(self._conds[k] for k in sorted(pool))
        matched: dict[str, Group] = {iid: self._groups[iid] for iid in apart}  # left as they are
        created: set[str] = set()
        fresh: list[Group] = []
        by_sig = {og.signature: iid for iid, og in sorted(self._groups.items())}
        for g in groups:
            iid = self._match(g, set(matched), by_sig)
            if iid is not None:
                matched[iid] = g
            elif any(self._conds[k].active for k in g.members):
                fresh.append(g)
        for g in fresh:
            inc = self._recent.pop(g.signature, None)
            if inc is not None:
                inc.resolved_ms = None
                self._open[inc.id] = inc
                self._apply(inc, g, now)
                self._emit("opened", inc, {"reason": "reopened", **g.note}, store_change="reopened")
            else:
                inc = Incident(
                    id="",
                    kind=g.kind,
                    root_cause=g.root_cause,
                    component_type=g.component_type,
                    affected_nodes=[],
                    affected_jobs=[],
                    severity="info",
                    action=vocab.ACTION_INVESTIGATE,
                    evidence=[],
                    opened_ms=now,
                )
                self._apply(inc, g, now)
                self.store.open(inc, detail=g.note)
                self._open[inc.id] = inc
                self._out.append(("opened", replace(inc)))
                log.info(
                    "incident_opened",
                    id=inc.id,
                    kind=inc.kind,
                    root_cause=inc.root_cause,
                    severity=inc.severity,
                    nodes=len(inc.affected_nodes),
                    conditions=len(inc.condition_keys),
                )
            matched[inc.id] = g
            created.add(inc.id)
        owner: dict[Key, str] = {}
        for iid, g in matched.items():
            for k in g.members:
                owner[k] = iid
        # Incidents whose conditions all went to other groups were absorbed by a larger fault.
        for iid in sorted(set(self._open) - set(matched)):
            inc = self._open.pop(iid)
            self._groups.pop(iid, None)
            self._not_before.pop(iid, None)
            heirs = Counter(owner[k] for k in inc.condition_keys if k in owner)
            target = min(heirs, key=lambda t: (-heirs[t], t)) if heirs else None
            self.store.resolve(inc, now, merged_into=target)
            self._out.append(("resolved", replace(inc)))
            log.info("incident_merged", id=iid, into=target, kind=inc.kind, root_cause=inc.root_cause)
        for iid, g in sorted(matched.items()):
            inc = self._open[iid]
            self._groups[iid] = g
            if iid not in created and self._apply(inc, g, now):
                self._emit("updated", inc, {"reason": "regrouped", **g.note})
        for k in set(batch) - set(owner):
            self._conds.pop(k, None)
        self._owner = owner

    def _apply(self, inc: Incident, g: Group, now: int) -> bool:
        """Derive an incident's fields from its group; True when something an operator sees changed."""
        conds = [self._conds[k] for k in sorted(g.members) if k in self._conds]
        before = (
            inc.kind,
            inc.root_cause,
            inc.severity,
            inc.action,
            inc.affected_nodes,
            inc.affected_jobs,
            inc.condition_keys,
        )
        inc.kind, inc.root_cause, inc.component_type = g.kind, g.root_cause, g.component_type
        inc.severity = self._severity(g.kind, conds)
        inc.action = KIND_ACTIONS.get(g.kind) or self._member_action(conds)
        inc.affected_nodes = sorted(g.nodes)
        jobs: set[str] = set()
        for n in inc.affected_nodes:
            jobs.update(self._jobs_of(n))
        inc.affected_jobs = sorted(jobs)
        inc.condition_keys = [c.key for c in conds]
        inc.evidence = [summarize(c) for c in conds]
        after = (
            inc.kind,
            inc.root_cause,
            inc.severity,
            inc.action,
            inc.affected_nodes,
            inc.affected_jobs,
            inc.condition_keys,
        )
        if after != before:
            inc.updated_ms = now
            return True
        return False

    @staticmethod
    def _severity(kind: str, conds: list[Condition]) -> Severity:
        if kind == "partition":
            return "critical"
        if not conds:
            return "warning"
        sev = max((c.severity for c in conds), key=lambda s: SEVERITY_ORDER.get(s, 0))
        if kind == "switch_fault" and all(_is_silence(c) for c in conds) and SEVERITY_ORDER[sev] > 1:
            return "warning"  # a silent switch alone may just be a dead collector
        return sev

    @staticmethod
    def _member_action(conds: list[Condition]) -> str:
        if not conds:
            return vocab.ACTION_INVESTIGATE
        top = max(
            conds,
            key=lambda c: (
                c.active,
                SEVERITY_ORDER.get(c.severity, 0),
                _ACTION_RANK.get(c.action, _ACTION_RANK[vocab.ACTION_INVESTIGATE]),
            ),
        )
        return top.action or vocab.ACTION_INVESTIGATE

    def _emit(self, change: str, inc: Incident, detail: dict[str, Any], store_change: str | None = None) -> None:
        self.store.update(inc, change=store_change or change, detail=detail)
        self._out.append((change, replace(inc)))
        log.info(
            f"incident_{store_change or change}",
            id=inc.id,
            kind=inc.kind,
            root_cause=inc.root_cause,
            severity=inc.severity,
            nodes=len(inc.affected_nodes),
            conditions=len(inc.condition_keys),
        )

    def _expire(self, now: int) -> None:
        """Resolve incidents whose conditions all stayed resolved for the hold time."""
        hold_ms = int(self.config.resolve_hold_s * 1000)
        for iid in sorted(self._open):
            inc = self._open[iid]
            conds = [self._conds[k] for k in inc.condition_keys if k in self._conds]
            if any(c.active for c in conds):
                continue
            quiet_since = max((c.resolved_ms or now for c in conds), default=now)
            if now - quiet_since < hold_ms or now < self._not_before.get(iid, 0):
                continue
            self._close(iid, now, None)

    def _close(self, iid: str, now: int, detail: dict[str, Any] | None) -> Incident:
        inc = self._open.pop(iid)
        group = self._groups.pop(iid)
        self._not_before.pop(iid, None)
        for k in inc.condition_keys:
            if self._owner.get(k) == iid:
                del self._owner[k]
                if k not in self._pending:
                    self._conds.pop(k, None)
        self.store.resolve(inc, now, detail=detail)
        self._recent[group.signature] = inc
        self._out.append(("resolved", replace(inc)))
        log.info(
            "incident_resolved",
            id=iid,
            kind=inc.kind,
            root_cause=inc.root_cause,
            open_ms=now - inc.opened_ms,
            **(detail or {}),
        )
        return inc

    def conditions_clear(self, incident_id: str, since_ms: int | None = None) -> bool:
        """Every condition of the open incident has resolved, or (``since_ms``) was not seen since
        then (False for an unknown or closed one).

        Why ``since_ms``: an Xid is an event, and its condition stays active for its rule's
        window after the last one (30-60 minutes); after a GPU reset the question is whether
        the Xid came again, not whether the window has run out.
        """
        inc = self._open.get(incident_id)
        if inc is None:
            return False
        return not any(
            c.active and (since_ms is None or c.last_seen_ms >= since_ms)
            for c in (self._conds[k] for k in inc.condition_keys if k in self._conds)
        )

    def resolve_on_evidence(
        self, incident_id: str, reason: str, actor: str, since_ms: int | None = None
    ) -> Incident | None:
        """Close an open incident now, without the hold: its node was repaired and proven healthy,
        or a person says it is over. Refused (None) while a condition of it is still active
        (seen since ``since_ms``), unless a person asks. Listeners (the webhook says why) hear
        it on the next tick."""
        inc = self._open.get(incident_id)
        if inc is None:
            return None
        if actor == "starpulse" and not self.conditions_clear(incident_id, since_ms):
            return None
        return replace(self._close(incident_id, self._clock_ms(), {"reason": reason, "by": actor}))
