"""Compare the declared fabric with the cabling LLDP reports.

A rail-optimized fabric only correlates correctly if NIC i really is on rail leaf i.
Miscabling is common after repairs, so the controller learns the real wiring from LLDP
(host side from each agent, switch side from SONiC's LLDP_ENTRY_TABLE), reports what
differs, and can adopt the learned cable as the truth (``Fabric.apply_learned``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from controller.fabric.model import Fabric, LearnedEdge

log = structlog.get_logger(__name__)

# (local interface or NIC name, neighbour system name, neighbour port), or an object with
# ``local_interface``/``chassis_name``/``port_id`` (a starpulse.v1 LldpNeighbor).
Observation = tuple[str, str, str] | Any


@dataclass(frozen=True)
class Miswire:
    """A cable that ends somewhere other than declared."""

    component: str  # the NIC, or "leaf-b0-r0 Ethernet64" for an uplink
    expected: str | None
    seen: str
    expected_port: str | None = None
    seen_port: str | None = None
    message: str = ""


@dataclass(frozen=True)
class UnknownDevice:
    """An LLDP neighbour (or a reporter) whose name is not in the fabric."""

    name: str
    seen_by: str
    local: str = ""
    port: str = ""


@dataclass(frozen=True)
class MissingLink:
    """A declared cable that no LLDP report confirms, from a reporter that did report."""

    a: str
    b: str
    kind: str
    port: str
    message: str


@dataclass
class ReconcileReport:
    """What reconcile found; ``ok`` when nothing differs from the declaration."""

    miswired: list[Miswire] = field(default_factory=list)
    unknown: list[UnknownDevice] = field(default_factory=list)
    missing: list[MissingLink] = field(default_factory=list)
    learned: list[LearnedEdge] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)  # "node-007 eth9": no NIC for that interface

    @property
    def ok(self) -> bool:
        return not (self.miswired or self.unknown or self.missing)

    def messages(self) -> list[str]:
        """One human line per problem, for logs and the CLI."""
        out = [m.message for m in self.miswired]
        out += [f"unknown device {u.name!r} seen by {u.seen_by} {u.local}".rstrip() for u in self.unknown]
        out += [m.message for m in self.missing]
        return out


def _triple(obs: Observation) -> tuple[str, str, str]:
    if isinstance(obs, tuple | list):
        local, name, port = obs
        return str(local), str(name), str(port)
    return str(obs.local_interface), str(obs.chassis_name), str(obs.port_id)


def _resolve_nic(
    fabric: Fabric, node: str, iface: str, nic_of_interface: Mapping[str, Mapping[str, str]] | None
) -> str | None:
    """Fabric NIC name for ``node``'s interface: a full NIC name, "nic-3", or via the mapping."""
    mapped = (nic_of_interface or {}).get(node, {}).get(iface)
    candidates = [mapped] if mapped else []
    candidates += [iface, f"{node}/{iface}"]
    for cand in candidates:
        if cand is None:
            continue
        full = cand if "/" in cand else f"{node}/{cand}"
        if full in fabric and fabric.kind(full) == "nic" and fabric.host_of(full) == node:
            return full
    return None


# Complexity over 15 on purpose: one comparison per kind of wiring difference, in the order the report lists them.
def reconcile(  # noqa: C901
    fabric: Fabric,
    observed: Mapping[str, Sequence[Observation]],
    switches: Mapping[str, Sequence[Observation]] | None = None,
    nic_of_interface: Mapping[str, Mapping[str, str]] | None = None,
    check_ports: bool = True,
) -> ReconcileReport:
    """Compare declared cables with LLDP.

    ``observed``: compute node -> its LLDP neighbours (local interface or NIC name,
    neighbour system name, neighbour port). ``switches``: switch name -> (local port,
    remote system name, remote port). ``nic_of_interface``: node -> {netdev or rdma
    device: NIC name}, for agents that report raw interface names. ``check_ports``: also
    flag a NIC on the right leaf but the wrong port.

    Missing links are only reported for reporters with at least one neighbour, so an
    agent without lldpd does not turn into a wall of missing cables.
    """
    report = ReconcileReport()
    # nic -> {(leaf, port)} as seen from either side; leaf port -> spine as seen.
    seen_nic: dict[str, dict[tuple[str, str], str]] = {}
    seen_uplink: dict[tuple[str, str], tuple[str, str | None, str]] = {}
    unknown_seen: set[tuple[str, str, str]] = set()

    def unknown(name: str, seen_by: str, local: str, port: str) -> None:
        if (name, seen_by, local) not in unknown_seen:
            unknown_seen.add((name, seen_by, local))
            report.unknown.append(UnknownDevice(name, seen_by, local, port))

    reporting_nodes: list[str] = []
    for node, neighbours in observed.items():
        if node not in fabric or fabric.kind(node) != "node":
            unknown(node, "controller", "", "")
            continue
        if neighbours:
            reporting_nodes.append(node)
        for obs in neighbours:
            local, name, port = _triple(obs)
            nic = _resolve_nic(fabric, node, local, nic_of_interface)
            if nic is None:
                report.unresolved.append(f"{node} {local}")
                continue
            if name not in fabric:
                unknown(name, node, nic, port)
                continue
            seen_nic.setdefault(nic, {}).setdefault((name, port), "host")

    reporting_switches: list[str] = []
    for switch, neighbours in (switches or {}).items():
        if switch not in fabric or fabric.kind(switch) not in ("leaf", "spine"):
            unknown(switch, "controller", "", "")
            continue
        if neighbours:
            reporting_switches.append(switch)
        for obs in neighbours:
            local_port, name, remote_port = _triple(obs)
            if name not in fabric:
                unknown(name, switch, local_port, remote_port)
                continue
            kind = fabric.kind(name)
            if kind == "node":
                nic = _resolve_nic(fabric, name, remote_port, nic_of_interface)
                if nic is None:
                    report.unresolved.append(f"{name} {remote_port}")
                    continue
                seen_nic.setdefault(nic, {}).setdefault((switch, local_port), "switch")
            elif kind in ("leaf", "spine") and kind != fabric.kind(switch):
                leaf, leaf_port, spine, spine_port = (
                    (switch, local_port, name, remote_port)
                    if fabric.kind(switch) == "leaf"
                    else (name, remote_port, switch, local_port)
                )
                seen_uplink.setdefault((leaf, leaf_port), (spine, spine_port, "switch"))
            else:
                declared = fabric.peer_at(switch, local_port)
                report.miswired.append(
                    Miswire(
                        f"{switch} {local_port}",
                        declared,
                        name,
                        message=f"{switch} {local_port} expected on {declared}, seen on {name}",
                    )
                )

    confirmed: set[tuple[str, str]] = set()
    for nic, seen in seen_nic.items():
        exp_leaf, exp_port = fabric.leaf_of(nic), fabric.port_of(nic)
        # One cable has one far end. A NIC seen on two switch ports is a view in transition
        # (lldpd keeps the old neighbour until its TTL runs out after a re-cabling): report
        # what is seen, but learn nothing from it, or adopting both ends would uncable a NIC.
        ambiguous = len({w for w, _ in seen}) > 1 or len({(w, p) for w, p in seen if p}) > 1
        for (where, port), source in seen.items():
            if where == exp_leaf and (port == exp_port or not check_ports or not port):
                confirmed.add((nic, where))
                if not ambiguous:
                    report.learned.append(LearnedEdge(nic, where, "nic-leaf", exp_port or port, source))
                continue
            if fabric.kind(where) == "leaf" and not ambiguous:
                report.learned.append(LearnedEdge(nic, where, "nic-leaf", port, source))
            if where == exp_leaf:
                msg = f"{nic} expected on {exp_leaf} port {exp_port}, seen on {where} port {port}"
            else:
                msg = f"{nic} expected on {exp_leaf}, seen on {where}"
            report.miswired.append(Miswire(nic, exp_leaf, where, exp_port, port, msg))

    for (leaf, leaf_port), (spine, seen_spine_port, source) in seen_uplink.items():
        report.learned.append(LearnedEdge(leaf, spine, "leaf-spine", leaf_port, source, seen_spine_port))
        declared = fabric.peer_at(leaf, leaf_port)
        if declared == spine:
            confirmed.add((leaf, spine))
        else:
            report.miswired.append(
                Miswire(
                    f"{leaf} {leaf_port}",
                    declared,
                    spine,
                    leaf_port,
                    seen_spine_port,
                    f"{leaf} {leaf_port} expected on {declared}, seen on {spine}",
                )
            )

    def missing_nic(nic: str) -> None:
        leaf = fabric.leaf_of(nic)
        if leaf is None or (nic, leaf) in confirmed or nic in seen_nic:
            return
        confirmed.add((nic, leaf))  # report each cable once
        port = fabric.port_of(nic) or ""
        report.missing.append(
            MissingLink(nic, leaf, "nic-leaf", port, f"{nic} expected on {leaf} port {port}, not seen")
        )

    for node in reporting_nodes:
        for nic in fabric.nics_of(node):
            missing_nic(nic)
    for switch in reporting_switches:
        if fabric.kind(switch) == "leaf":
            for nic in fabric.nics_on_leaf(switch):
                missing_nic(nic)
            uplinks: list[tuple[str, str]] = [(switch, s) for s in fabric.spines_of(switch)]
        else:
            uplinks = [(leaf, switch) for leaf in fabric.leaves_of(switch)]
        for leaf, spine in uplinks:
            if (leaf, spine) in confirmed:
                continue
            confirmed.add((leaf, spine))
            port = str(fabric.graph.edges[leaf, spine].get("leaf_port", ""))
            if (leaf, port) in seen_uplink:
                continue  # that port was seen elsewhere: already a miswire
            report.missing.append(
                MissingLink(leaf, spine, "leaf-spine", port, f"{leaf} {port} expected on {spine}, not seen")
            )

    log.info(
        "fabric_reconciled",
        miswired=len(report.miswired),
        unknown=len(report.unknown),
        missing=len(report.missing),
        learned=len(report.learned),
        unresolved=len(report.unresolved),
    )
    for line in report.messages():
        log.warning("fabric_mismatch", detail=line)
    return report
