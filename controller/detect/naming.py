"""Naming components: what the engine calls a GPU, a NIC port, a switch port or an event's part.

Components are fabric names ("node-003/gpu-5", "node-003/nic-5", "leaf-b0-r3:Ethernet8" or,
when the fabric knows the cable, "node-003/nic-5<->leaf-b0-r3"). A node's naming is built
once per registration (its inventory) and LLDP list, not per report: the per-report path
only looks names up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.detect.model import ComponentType
from controller.fabric import Fabric
from controller.fabric.naming import NicNamer, gpu_name, switch_port_name
from controller.ingest.registry import NodeRecord
from starpulse.core import vocab
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

SWITCH = ipb.NODE_ROLE_SWITCH
_GPU_EVENTS = frozenset(
    {
        tpb.EVENT_KIND_XID,
        tpb.EVENT_KIND_ECC_DBE,
        tpb.EVENT_KIND_GPU_LOST,
        tpb.EVENT_KIND_GPU_RESET_REQUIRED,
        tpb.EVENT_KIND_GPU_RECOVERY_ACTION,
        tpb.EVENT_KIND_ROW_REMAP_FAILURE,
        tpb.EVENT_KIND_NVLINK_DOWN,
        tpb.EVENT_KIND_THERMAL_SLOWDOWN,
        tpb.EVENT_KIND_ACCEL_FAULT,  # a vendor fault code is about one chip
    }
)
_NIC_EVENTS = frozenset({tpb.EVENT_KIND_NIC_LINK_DOWN, tpb.EVENT_KIND_NIC_LINK_UP, tpb.EVENT_KIND_NIC_DRIVER_ERROR})
_PORT_EVENTS = frozenset({tpb.EVENT_KIND_SWITCH_PORT_DOWN, tpb.EVENT_KIND_SWITCH_PORT_UP, tpb.EVENT_KIND_PFC_STORM})


@dataclass(frozen=True, slots=True)
class NodeNames:
    """Per-node naming, rebuilt when the agent re-registers (new inventory) or LLDP changes."""

    token: int
    lldp_id: int
    namer: NicNamer
    gpu_by_pci: dict[str, int]
    nic_by_pci: dict[str, str]
    gpu_indices: frozenset[int]
    gpu_comp: dict[int, str]  # inventory GPU index -> "node/gpu-<i>", built once, not per report
    nic_inventory: dict[str, str]  # inventory port "mlx5_0/1" -> its component, for nic_set kinds
    # (rdma_device, port) -> ("dev/port", component name, on a rail): the NIC naming of every report
    nic_ports: dict[tuple[str, int], tuple[str, str, bool]]


class Naming:
    """Component names for one engine: per-node caches, and the fabric's word on cables.

    It is also what evaluators call ``names`` (controller.detect.evaluators.base.Names)."""

    def __init__(self, fabric: Fabric | None) -> None:
        self.fabric = fabric
        self._nodes: dict[str, NodeNames] = {}

    def node(self, node: NodeRecord) -> NodeNames:
        """Naming for a node, cached until it re-registers (stream_token) or its LLDP list is replaced."""
        ctx = self._nodes.get(node.node_id)
        lldp_id = id(node.lldp)
        if ctx is not None and ctx.token == node.stream_token and ctx.lldp_id == lldp_id:
            return ctx
        inv = node.inventory
        nid = node.node_id
        namer = NicNamer(nid, inv, node.lldp or None)
        indices = frozenset(g.index for g in inv.gpus)
        nic_by_pci: dict[str, str] = {}
        nic_inventory: dict[str, str] = {}
        for n in inv.nics:
            local = f"{n.rdma_device}/{n.port}"
            name = namer.nic(local)
            nic_inventory[local] = name or f"{nid}/{local}"  # as the report path names a port
            if name is not None and n.pci_address:
                nic_by_pci[vocab.pci_key(n.pci_address)] = name
        ctx = NodeNames(
            token=node.stream_token,
            lldp_id=lldp_id,
            namer=namer,
            gpu_by_pci={vocab.pci_key(g.pci_bus_id): g.index for g in inv.gpus if g.pci_bus_id},
            nic_by_pci=nic_by_pci,
            gpu_indices=indices,
            gpu_comp={i: gpu_name(nid, f"gpu-{i}") for i in indices},
            nic_inventory=nic_inventory,
            nic_ports={},
        )
        self._nodes[node.node_id] = ctx
        return ctx

    def forget(self, node_id: str) -> None:
        self._nodes.pop(node_id, None)

    def event_component(self, node: NodeRecord, ev: tpb.Event) -> tuple[str, ComponentType, str | None]:
        """(fabric name, type, compute node) of an event's component."""
        nid = node.node_id
        kind = ev.kind
        comp = ev.component
        if node.role == SWITCH:
            if kind in _PORT_EVENTS and comp:
                name, ctype, _ = self.port_component(nid, comp)
                return name, ctype, None
            return nid, "switch", None
        if kind in _GPU_EVENTS:
            ctx = self.node(node)
            if comp.startswith("gpu@") or (comp in ("", "gpu") and ev.pci):
                index = ctx.gpu_by_pci.get(vocab.pci_key(ev.pci or comp[4:]))
                if index is not None:
                    return gpu_name(nid, f"gpu-{index}"), "gpu", nid
            return gpu_name(nid, comp or "gpu"), "gpu", nid
        if kind in _NIC_EVENTS:
            ctx = self.node(node)
            nic = ctx.namer.nic(comp) if comp else None
            if nic is None and ev.pci:
                nic = ctx.nic_by_pci.get(vocab.pci_key(ev.pci))
            if nic is not None:
                return nic, "nic", nid
        return nid, "node", nid

    def nic_evidence(self, comp: str, s: tpb.NicSample, **extra: Any) -> dict[str, Any]:
        """A NIC condition's evidence: the port, and its leaf and leaf port when the fabric knows."""
        evidence: dict[str, Any] = {"rdma_device": s.rdma_device, "port": s.port, "netdev": s.netdev}
        if self.fabric is not None:
            evidence.update(nic_fabric_evidence(self.fabric, comp))
        evidence.update(extra)
        return evidence

    def port_component(self, switch: str, port: str) -> tuple[str, ComponentType, str | None]:
        """The cable when the fabric knows what the port connects to, else the switch port."""
        fabric = self.fabric
        if fabric is not None:
            peer = fabric.peer_at(switch, port)
            if peer is not None:
                return fabric.link_name(switch, peer), "link", peer
        return switch_port_name(switch, port), "switch", None


def nic_fabric_evidence(fabric: Fabric, comp: str) -> dict[str, Any]:
    """The leaf and leaf port a NIC is cabled to, for a condition's evidence ({} if not known).

    Detection shards run without the fabric (it changes as LLDP is learned); the controller
    adds this to their NIC conditions (Detection.on_shard_changes).
    """
    if comp in fabric and fabric.kind(comp) == "nic":
        leaf = fabric.leaf_of(comp)
        if leaf is not None:
            return {"leaf": leaf, "leaf_port": fabric.port_of(comp)}
    return {}
