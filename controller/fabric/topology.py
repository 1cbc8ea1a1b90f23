"""Learned topology: LLDP from agents reconciled with the declared fabric.

Miswiring is reported once per change ("node-007/nic-3 expected on leaf-b0-r3, seen on
leaf-b0-r4"), and the learned cable replaces the declared one in the fabric so root
cause follows the real wiring. LLDP is always compared with the declaration (a copy kept
apart), never with the fabric the learned cables were applied to: a miswire stays
reported while it lasts, and clears, and the fabric follows, when the cable is put back.
"""

from __future__ import annotations

import structlog

from controller.fabric import Fabric, ReconcileReport, reconcile
from controller.fabric.naming import NicNamer
from controller.ingest.registry import NodeRecord
from starpulse.core.clock import Clock
from starpulse.v1 import inventory_pb2 as ipb

log = structlog.get_logger(__name__)


class TopologyTracker:
    """Keeps every node's latest LLDP view and reconciles at most once a second."""

    def __init__(self, fabric: Fabric | None, min_interval_s: float = 1.0, *, clock: Clock) -> None:
        self.fabric = fabric
        self.clock = clock
        self.declared = Fabric(fabric.graph.copy(), fabric.params) if fabric is not None else None
        self.min_interval_s = min_interval_s
        self._hosts: dict[str, list[tuple[str, str, str]]] = {}
        self._switches: dict[str, list[tuple[str, str, str]]] = {}
        self._interfaces: dict[str, dict[str, str]] = {}
        self._dirty = False
        self._last_run = 0.0
        self._reported: set[str] = set()
        self.report = ReconcileReport()
        self.rewirings = 0  # how many reconciliations changed the fabric's wiring (copies of it follow this)

    def update(self, node: NodeRecord) -> None:
        """Record a node's current LLDP neighbours (call when they change)."""
        triples = [(n.local_interface, n.chassis_name, n.port_id) for n in node.lldp]
        if node.role == ipb.NODE_ROLE_SWITCH:
            self._switches[node.node_id] = triples
        else:
            self._hosts[node.node_id] = triples
            # Interfaces named by PCIe pairing, never by LLDP: a miswire must stay visible.
            self._interfaces[node.node_id] = NicNamer(node.node_id, node.inventory, lldp=[]).interfaces()
        self._dirty = True

    def forget(self, node_id: str) -> None:
        self._hosts.pop(node_id, None)
        self._switches.pop(node_id, None)
        self._interfaces.pop(node_id, None)
        self._dirty = True

    @property
    def nodes_reporting(self) -> int:
        return sum(1 for t in self._hosts.values() if t) + sum(1 for t in self._switches.values() if t)

    def tick(self) -> ReconcileReport | None:
        """Reconcile when something changed (rate-limited); returns the new report, if any."""
        if self.fabric is None or self.declared is None or not self._dirty:
            return None
        now = self.clock.monotonic()
        if now - self._last_run < self.min_interval_s:
            return None
        self._dirty = False
        self._last_run = now
        report = reconcile(self.declared, self._hosts, self._switches, nic_of_interface=self._interfaces)
        changes = self.fabric.apply_learned(report)  # also puts back cables that match the declaration again
        messages = set(report.messages())
        for message in sorted(messages - self._reported):
            log.warning("topology_mismatch", detail=message)
        for message in sorted(self._reported - messages):
            log.info("topology_mismatch_cleared", detail=message)
        self._reported = messages
        if changes:
            self.rewirings += 1
            log.info("fabric_rewired_from_lldp", changes=len(changes))
        self.report = report
        return report
