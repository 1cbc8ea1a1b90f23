"""The fabric graph: compute nodes, GPUs, NICs, rail leaves and spines, and the cables between them.

Detection correlates symptoms on this graph (errors on many NICs of one leaf -> suspect
the leaf), so every lookup it needs is an O(1) dict read. The indexes are built once
when the graph is wrapped and patched in place when learned wiring replaces a cable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import networkx as nx
import structlog

log = structlog.get_logger(__name__)

VertexKind = Literal["node", "gpu", "nic", "leaf", "spine"]
ComponentType = Literal["gpu", "nic", "node", "switch", "link"]

VERTEX_KINDS: tuple[str, ...] = ("node", "gpu", "nic", "leaf", "spine")
SWITCH_KINDS: frozenset[str] = frozenset({"leaf", "spine"})

# Attributes each vertex kind must carry, with their types (bool is checked before int).
REQUIRED_ATTRS: dict[str, dict[str, type]] = {
    "node": {"block": int, "spare": bool},
    "gpu": {"host": str, "index": int},
    "nic": {"host": str, "index": int, "rail": int},
    "leaf": {"block": int, "rail": int},
    "spine": {"index": int},
}

# Edge kind -> the two vertex kinds it joins (unordered).
EDGE_KINDS: dict[str, frozenset[str]] = {
    "gpu-nic": frozenset({"gpu", "nic"}),
    "node-gpu": frozenset({"node", "gpu"}),
    "node-nic": frozenset({"node", "nic"}),
    "nic-leaf": frozenset({"nic", "leaf"}),
    "leaf-spine": frozenset({"leaf", "spine"}),
}

LINK_SEPARATOR = "<->"
# Lower tier first, so a cable reads host-to-switch: "node-003/nic-5<->leaf-b0-r5".
_TIER = {"node": 0, "gpu": 1, "nic": 2, "leaf": 3, "spine": 4}


class FabricError(ValueError):
    """The graph is not a valid fabric (bad kind, dangling link, duplicate name)."""


def node_name(index: int, width: int = 3) -> str:
    """Stable compute-node name: ``node-007``; width grows past 999 nodes."""
    return f"node-{index:0{width}d}"


def gpu_name(node: str, index: int) -> str:
    return f"{node}/gpu-{index}"


def nic_name(node: str, index: int) -> str:
    return f"{node}/nic-{index}"


def leaf_name(block: int, rail: int) -> str:
    return f"leaf-b{block}-r{rail}"


def spine_name(index: int) -> str:
    return f"spine-{index}"


def port_name(index: int) -> str:
    """SONiC port naming: one 4-lane port every 4 lanes, ``Ethernet<4*k>``."""
    return f"Ethernet{4 * index}"


@dataclass(frozen=True)
class WiringChange:
    """One cable the controller now believes is elsewhere than declared."""

    a: str
    old_peer: str | None
    new_peer: str
    port: str

    def __str__(self) -> str:
        return f"{self.a}: {self.old_peer or 'nothing'} -> {self.new_peer} ({self.port})"


@dataclass(frozen=True)
class LearnedEdge:
    """One cable as LLDP shows it. ``port`` is on ``b`` (nic-leaf) or ``a`` (leaf-spine)."""

    a: str
    b: str
    kind: str
    port: str
    source: str  # "host" | "switch"
    peer_port: str | None = None  # the other end's port, for leaf-spine


class _LearnedCables(Protocol):
    """A reconcile report, as far as ``apply_learned`` reads it."""

    learned: list[LearnedEdge]


class Fabric:
    """A typed ``networkx.Graph`` plus the indexes detection needs.

    Vertex attribute ``kind`` is one of ``VERTEX_KINDS``; edge attribute ``kind`` one of
    ``EDGE_KINDS``. Mutate the wiring through ``apply_learned``/``rewire_nic`` only:
    editing ``graph`` directly leaves the indexes stale (call ``reindex()`` after).
    Lists returned by lookups are the indexes themselves: read them, do not mutate them.
    """

    def __init__(self, graph: nx.Graph, params: Mapping[str, Any] | None = None) -> None:
        self.graph = graph
        self.params: dict[str, Any] = dict(params or {})
        # Bumped on every change of the wiring: a probe-mesh plan computed in a worker thread
        # (controller.mesh) is dropped when the fabric moved under it.
        self.generation = 0
        self.reindex()

    # -- index -------------------------------------------------------------------------

    # Complexity over 15 on purpose: one pass over the graph fills every lookup table; separate passes would walk it
    # once per table.
    def reindex(self) -> None:  # noqa: C901
        """Validate the graph and rebuild every lookup table from it. O(V + E)."""
        g = self.graph
        by_kind: dict[str, list[str]] = {k: [] for k in VERTEX_KINDS}
        kind_of: dict[str, str] = {}
        for name, attrs in g.nodes(data=True):
            kind = attrs.get("kind")
            if kind not in REQUIRED_ATTRS:
                raise FabricError(f"vertex {name!r}: unknown kind {kind!r} (expected one of {VERTEX_KINDS})")
            _check_attrs(name, kind, attrs)
            by_kind[kind].append(name)
            kind_of[name] = kind
        self._kind_of = kind_of
        self._by_kind = by_kind
        # Asked on every eviction (the spare pool): a walk of every node each time cost the fleet
        # simulator O(nodes) per fault at 10,000 nodes.
        self._spares = [n for n in by_kind["node"] if g.nodes[n]["spare"]]

        self._gpus_of: dict[str, list[str]] = {n: [] for n in by_kind["node"]}
        self._nics_of: dict[str, list[str]] = {n: [] for n in by_kind["node"]}
        self._host_of: dict[str, str] = {}
        self._leaf_of: dict[str, str] = {}
        self._nic_port: dict[str, str] = {}
        self._nics_on_leaf: dict[str, list[str]] = {leaf: [] for leaf in by_kind["leaf"]}
        self._spines_of: dict[str, list[str]] = {leaf: [] for leaf in by_kind["leaf"]}
        self._leaves_of: dict[str, list[str]] = {s: [] for s in by_kind["spine"]}
        self._nic_of_gpu: dict[str, str] = {}
        self._gpus_of_nic: dict[str, list[str]] = {n: [] for n in by_kind["nic"]}
        self._peer_at: dict[tuple[str, str], str] = {}
        self._nodes_in_block: dict[int, list[str]] = {}
        self._behind_cache: dict[str, list[str]] = {}
        self.generation += 1

        for node in by_kind["node"]:
            self._nodes_in_block.setdefault(int(g.nodes[node]["block"]), []).append(node)
        for kind in ("gpu", "nic"):
            for v in by_kind[kind]:
                host = g.nodes[v]["host"]
                if kind_of.get(host) != "node":
                    raise FabricError(f"{kind} {v!r}: host {host!r} is not a node vertex")
                self._host_of[v] = host
                (self._gpus_of if kind == "gpu" else self._nics_of)[host].append(v)

        for a, b, attrs in g.edges(data=True):
            ekind = attrs.get("kind")
            pair = EDGE_KINDS.get(ekind)
            if pair is None:
                raise FabricError(f"link {a!r}-{b!r}: unknown kind {ekind!r} (expected one of {tuple(EDGE_KINDS)})")
            if frozenset({kind_of[a], kind_of[b]}) != pair or kind_of[a] == kind_of[b]:
                raise FabricError(
                    f"link {a!r}-{b!r}: kind {ekind!r} joins {sorted(pair)}, not {kind_of[a]} and {kind_of[b]}"
                )
            if ekind == "gpu-nic":
                gpu, nic = (a, b) if kind_of[a] == "gpu" else (b, a)
                if gpu in self._nic_of_gpu:
                    raise FabricError(f"gpu {gpu!r} is paired with two NICs")
                self._nic_of_gpu[gpu] = nic
                self._gpus_of_nic[nic].append(gpu)
            elif ekind == "nic-leaf":
                nic, leaf = (a, b) if kind_of[a] == "nic" else (b, a)
                self._index_nic_leaf(nic, leaf, attrs)
            elif ekind == "leaf-spine":
                leaf, spine = (a, b) if kind_of[a] == "leaf" else (b, a)
                self._spines_of[leaf].append(spine)
                self._leaves_of[spine].append(leaf)
                for sw, key in ((leaf, "leaf_port"), (spine, "spine_port")):
                    port = attrs.get(key)
                    if port:
                        self._claim_port(sw, str(port), spine if sw == leaf else leaf)
            elif ekind in ("node-gpu", "node-nic"):
                node, dev = (a, b) if kind_of[a] == "node" else (b, a)
                if self._host_of.get(dev) != node:
                    raise FabricError(f"link {a!r}-{b!r}: {dev!r} belongs to {self._host_of.get(dev)!r}")

    def _index_nic_leaf(self, nic: str, leaf: str, attrs: Mapping[str, Any]) -> None:
        if nic in self._leaf_of:
            raise FabricError(f"nic {nic!r} is cabled to two leaves: {self._leaf_of[nic]!r} and {leaf!r}")
        port = attrs.get("port")
        if not isinstance(port, str) or not port:
            raise FabricError(f"link {nic!r}-{leaf!r}: nic-leaf link needs a 'port' (the leaf's port name)")
        self._leaf_of[nic] = leaf
        self._nic_port[nic] = port
        self._nics_on_leaf[leaf].append(nic)
        self._claim_port(leaf, port, nic)

    def _claim_port(self, switch: str, port: str, peer: str) -> None:
        other = self._peer_at.get((switch, port))
        if other is not None and other != peer:
            raise FabricError(f"{switch} port {port} is cabled to both {other!r} and {peer!r}")
        self._peer_at[(switch, port)] = peer

    # -- lookups ---------------------------------------------------------------------------

    def __contains__(self, name: object) -> bool:
        return name in self._kind_of

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Fabric):
            return NotImplemented
        return (
            self.params == other.params
            and dict(self.graph.nodes(data=True)) == dict(other.graph.nodes(data=True))
            and _edge_set(self.graph) == _edge_set(other.graph)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        s = self.summary()
        return f"Fabric(nodes={s['node']}, gpus={s['gpu']}, nics={s['nic']}, leaves={s['leaf']}, spines={s['spine']})"

    def kind(self, name: str) -> str:
        """Vertex kind of ``name``; KeyError for a name not in the fabric."""
        try:
            return self._kind_of[name]
        except KeyError:
            raise KeyError(f"{name!r} is not in the fabric") from None

    def component_type(self, name: str) -> ComponentType:
        """What a finding's component is: leaves and spines are both "switch"; "a<->b" is a link."""
        if LINK_SEPARATOR in name:
            a, b = self.link_ends(name)
            if a not in self._kind_of or b not in self._kind_of:
                raise KeyError(f"link {name!r} joins a name not in the fabric")
            return "link"
        kind = self.kind(name)
        if kind in SWITCH_KINDS:
            return "switch"
        return kind  # type: ignore[return-value]

    def link_name(self, a: str, b: str) -> str:
        """Canonical cable name, the same for (a, b) and (b, a): lower tier first, then by name."""
        ka = _TIER.get(self._kind_of.get(a, ""), 99)
        kb = _TIER.get(self._kind_of.get(b, ""), 99)
        first, second = (a, b) if (ka, a) <= (kb, b) else (b, a)
        return f"{first}{LINK_SEPARATOR}{second}"

    @staticmethod
    def link_ends(link: str) -> tuple[str, str]:
        """The two vertex names of a ``link_name``; ValueError when it is not one."""
        a, sep, b = link.partition(LINK_SEPARATOR)
        if not sep or not a or not b:
            raise ValueError(f"{link!r} is not a link name ('a{LINK_SEPARATOR}b')")
        return a, b

    def nodes(self) -> list[str]:
        """All compute nodes, spares included, in name order."""
        return self._by_kind["node"]

    def spares(self) -> list[str]:
        return list(self._spares)

    def gpus(self) -> list[str]:
        return self._by_kind["gpu"]

    def nics(self) -> list[str]:
        return self._by_kind["nic"]

    def leaves(self) -> list[str]:
        return self._by_kind["leaf"]

    def spines(self) -> list[str]:
        return self._by_kind["spine"]

    def switches(self) -> list[str]:
        return self._by_kind["leaf"] + self._by_kind["spine"]

    def is_spare(self, node: str) -> bool:
        return bool(self._node_attrs(node, "node")["spare"])

    def gpus_of(self, node: str) -> list[str]:
        return self._lookup(self._gpus_of, node, "node")

    def nics_of(self, node: str) -> list[str]:
        return self._lookup(self._nics_of, node, "node")

    def host_of(self, device: str) -> str:
        """The compute node a GPU or NIC sits in."""
        return self._lookup(self._host_of, device, "gpu or nic")

    def nic_of_gpu(self, gpu: str) -> str | None:
        """The NIC behind the same PCIe switch as ``gpu`` (its rail)."""
        self._node_attrs(gpu, "gpu")
        return self._nic_of_gpu.get(gpu)

    def gpus_of_nic(self, nic: str) -> list[str]:
        return self._lookup(self._gpus_of_nic, nic, "nic")

    def rail_of(self, nic: str) -> int:
        return int(self._node_attrs(nic, "nic")["rail"])

    def leaf_of(self, nic: str) -> str | None:
        """The leaf the NIC is cabled to (learned wiring wins once applied); None when uncabled."""
        self._node_attrs(nic, "nic")
        return self._leaf_of.get(nic)

    def port_of(self, nic: str) -> str | None:
        """The leaf port the NIC is cabled to."""
        self._node_attrs(nic, "nic")
        return self._nic_port.get(nic)

    def peer_at(self, switch: str, port: str) -> str | None:
        """What is cabled to ``switch`` port ``port``: a NIC, a leaf or a spine; None when unused."""
        return self._peer_at.get((switch, port))

    def nics_on_leaf(self, leaf: str) -> list[str]:
        return self._lookup(self._nics_on_leaf, leaf, "leaf")

    def spines_of(self, leaf: str) -> list[str]:
        return self._lookup(self._spines_of, leaf, "leaf")

    def leaves_of(self, spine: str) -> list[str]:
        return self._lookup(self._leaves_of, spine, "spine")

    def block_of(self, node: str) -> int:
        """The block (pod) of a compute node, or of the node a GPU/NIC sits in, or of a leaf."""
        kind = self.kind(node)
        if kind in ("gpu", "nic"):
            node = self._host_of[node]
        elif kind not in ("node", "leaf"):
            raise KeyError(f"{node!r} is a {kind}, which has no block")
        return int(self.graph.nodes[node]["block"])

    def blocks(self) -> list[int]:
        return sorted(self._nodes_in_block)

    def blocks_index(self) -> Mapping[int, list[str]]:
        """Block -> its compute nodes, read-only: a new object after every ``reindex`` (so a
        reader may keep what it derived from it while it is the same object)."""
        return self._nodes_in_block

    def nodes_in_block(self, block: int) -> list[str]:
        return self._nodes_in_block.get(block, [])

    def nodes_behind(self, switch: str) -> list[str]:
        """Compute nodes whose traffic a switch carries.

        A leaf: nodes with at least one NIC cabled to it. A spine: nodes behind any leaf
        the spine connects (with full-mesh spines that is every cabled node; the point is
        the blast radius, not reachability). Cached; the cache resets when wiring changes.
        """
        cached = self._behind_cache.get(switch)
        if cached is not None:
            return cached
        kind = self.kind(switch)
        if kind == "leaf":
            result = list(dict.fromkeys(self._host_of[nic] for nic in self._nics_on_leaf[switch]))
        elif kind == "spine":
            seen: dict[str, None] = {}
            for leaf in self._leaves_of[switch]:
                seen.update(dict.fromkeys(self.nodes_behind(leaf)))
            result = list(seen)
        else:
            raise KeyError(f"{switch!r} is a {kind}, not a switch")
        self._behind_cache[switch] = result
        return result

    def summary(self) -> dict[str, Any]:
        """Counts per vertex kind plus blocks and rails, for logs and `starpulse fabric show`."""
        out: dict[str, Any] = {k: len(v) for k, v in self._by_kind.items()}
        out["spares"] = len(self.spares())
        out["links"] = self.graph.number_of_edges()
        out["blocks"] = len(self._nodes_in_block)
        out["rails"] = len({int(self.graph.nodes[leaf]["rail"]) for leaf in self._by_kind["leaf"]})
        return out

    # -- learned wiring --------------------------------------------------------------------

    def rewire_nic(self, nic: str, leaf: str, port: str) -> WiringChange | None:
        """Make ``nic``'s cable go to ``leaf`` ``port``; None when that is already so.

        Whatever was on that leaf port before loses its cable (the port now holds ``nic``).
        """
        self._node_attrs(nic, "nic")
        self._node_attrs(leaf, "leaf")
        old_leaf = self._leaf_of.get(nic)
        if old_leaf == leaf and self._nic_port.get(nic) == port:
            return None
        if old_leaf is not None:
            self._unlink_nic(nic)
        occupant = self._peer_at.get((leaf, port))
        if occupant is not None:
            if self._kind_of[occupant] == "nic":
                self._unlink_nic(occupant)
            else:
                self.graph.remove_edge(leaf, occupant)
                self._spines_of[leaf].remove(occupant)
                self._leaves_of[occupant].remove(leaf)
                self._drop_ports_of(leaf, occupant)
        self.graph.add_edge(nic, leaf, kind="nic-leaf", port=port, learned=True)
        self._index_nic_leaf(nic, leaf, {"port": port})
        self._moved()
        return WiringChange(nic, old_leaf, leaf, port)

    def rewire_uplink(self, leaf: str, leaf_port: str, spine: str, spine_port: str | None) -> WiringChange | None:
        """Make ``leaf`` port ``leaf_port`` go to ``spine``; None when that is already so."""
        self._node_attrs(leaf, "leaf")
        self._node_attrs(spine, "spine")
        old = self._peer_at.get((leaf, leaf_port))
        if old == spine:
            return None
        if old is not None:
            if self._kind_of[old] == "nic":
                self._unlink_nic(old)
            else:
                self.graph.remove_edge(leaf, old)
                self._spines_of[leaf].remove(old)
                self._leaves_of[old].remove(leaf)
                self._drop_ports_of(leaf, old)
        if self.graph.has_edge(leaf, spine):
            self._drop_ports_of(leaf, spine)
        else:
            self._spines_of[leaf].append(spine)
            self._leaves_of[spine].append(leaf)
        attrs: dict[str, Any] = {"kind": "leaf-spine", "leaf_port": leaf_port, "learned": True}
        if spine_port:
            attrs["spine_port"] = spine_port
            occupant = self._peer_at.get((spine, spine_port))
            if occupant is not None and occupant != leaf:
                self._peer_at.pop((spine, spine_port))
        self.graph.add_edge(leaf, spine, **attrs)
        self._peer_at[(leaf, leaf_port)] = spine
        if spine_port:
            self._peer_at[(spine, spine_port)] = leaf
        self._moved()
        return WiringChange(leaf, old, spine, leaf_port)

    def apply_learned(self, learned: _LearnedCables | Iterable[LearnedEdge]) -> list[WiringChange]:
        """Treat LLDP-learned cables as the truth, so root cause follows the real cable.

        Accepts a ``ReconcileReport`` or its ``learned`` edges; edges to names not in the
        fabric are ignored (they are reported as unknown devices instead).
        """
        edges: Iterable[LearnedEdge] = learned.learned if hasattr(learned, "learned") else learned
        changes: list[WiringChange] = []
        for edge in edges:
            if edge.a not in self._kind_of or edge.b not in self._kind_of:
                continue
            if edge.kind == "nic-leaf" and edge.port:
                change = self.rewire_nic(edge.a, edge.b, edge.port)
            elif edge.kind == "leaf-spine" and edge.port:
                change = self.rewire_uplink(edge.a, edge.port, edge.b, edge.peer_port)
            else:
                continue
            if change is not None:
                changes.append(change)
                log.info(
                    "fabric_rewired",
                    component=change.a,
                    old=change.old_peer,
                    new=change.new_peer,
                    port=change.port,
                )
        return changes

    def _moved(self) -> None:
        self._behind_cache.clear()
        self.generation += 1

    def _unlink_nic(self, nic: str) -> None:
        leaf = self._leaf_of.pop(nic)
        port = self._nic_port.pop(nic)
        self.graph.remove_edge(nic, leaf)
        self._nics_on_leaf[leaf].remove(nic)
        if self._peer_at.get((leaf, port)) == nic:
            del self._peer_at[(leaf, port)]
        self._moved()

    def _drop_ports_of(self, a: str, b: str) -> None:
        for key in [k for k, v in self._peer_at.items() if (k[0] == a and v == b) or (k[0] == b and v == a)]:
            del self._peer_at[key]

    # -- helpers ---------------------------------------------------------------------------

    def _node_attrs(self, name: str, expected: str) -> dict[str, Any]:
        kind = self.kind(name)
        if kind != expected:
            raise KeyError(f"{name!r} is a {kind}, not a {expected}")
        attrs: dict[str, Any] = self.graph.nodes[name]
        return attrs

    def _lookup(self, table: dict[str, list[str]] | dict[str, str], name: str, expected: str) -> Any:
        try:
            return table[name]
        except KeyError:
            kind = self._kind_of.get(name)
            what = "not in the fabric" if kind is None else f"a {kind}, not a {expected}"
            raise KeyError(f"{name!r} is {what}") from None


def _check_attrs(name: str, kind: str, attrs: Mapping[str, Any]) -> None:
    for attr, typ in REQUIRED_ATTRS[kind].items():
        value = attrs.get(attr)
        is_bool = isinstance(value, bool)
        ok = is_bool if typ is bool else isinstance(value, typ) and not is_bool
        if not ok:
            raise FabricError(f"{kind} {name!r}: attribute {attr!r} must be {typ.__name__}, got {value!r}")


def _edge_set(g: nx.Graph) -> set[tuple[frozenset[str], tuple[tuple[str, Any], ...]]]:
    return {(frozenset((a, b)), tuple(sorted(d.items()))) for a, b, d in g.edges(data=True)}
