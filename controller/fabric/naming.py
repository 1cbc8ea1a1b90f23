"""Agent component names -> fabric component names.

Agents name what they see locally ("gpu-3", "mlx5_4/1", "Ethernet8"); the fabric names
things globally ("node-007/gpu-3", "node-007/nic-4", "leaf-b0-r3:Ethernet8"). A host
NIC's rail is, in order of trust: the leaf its LLDP neighbour names (the real cable),
the GPU it pairs with on PCIe (rail-optimised hosts pair GPU i with NIC i), then its
position among the node's non-bond RDMA devices.
"""

from __future__ import annotations

import re

from starpulse.v1 import inventory_pb2 as ipb

_LEAF_RAIL = re.compile(r"^leaf-b\d+-r(\d+)$")


def gpu_name(node: str, agent_component: str) -> str:
    """'gpu-3' on node-007 -> 'node-007/gpu-3'; other forms are kept under the node."""
    return f"{node}/{agent_component}"


def switch_port_name(switch: str, port: str) -> str:
    return f"{switch}:{port}"


class NicNamer:
    """Maps one node's RDMA ports ('mlx5_4/1') to fabric NIC names ('node-007/nic-4')."""

    def __init__(self, node: str, inventory: ipb.Inventory, lldp: list[ipb.LldpNeighbor] | None = None) -> None:
        self.node = node
        self._by_port: dict[str, str] = {}
        self._by_netdev: dict[str, str] = {}
        rails_by_netdev: dict[str, int] = {}
        for nb in lldp if lldp is not None else inventory.lldp_neighbors:
            m = _LEAF_RAIL.fullmatch(nb.chassis_name)
            if m:
                rails_by_netdev[nb.local_interface] = int(m.group(1))
        rails = [n for n in inventory.nics if "bond" not in n.rdma_device]
        rails.sort(key=lambda n: _natural(n.rdma_device))
        for position, nic in enumerate(rails):
            if nic.HasField("paired_gpu_index"):
                rail = nic.paired_gpu_index
            elif nic.netdev in rails_by_netdev:
                rail = rails_by_netdev[nic.netdev]
            else:
                rail = position
            name = f"{node}/nic-{rail}"
            self._by_port[f"{nic.rdma_device}/{nic.port}"] = name
            if nic.netdev:
                self._by_netdev[nic.netdev] = name

    def interfaces(self) -> dict[str, str]:
        """netdev -> fabric NIC name, for LLDP reconciliation."""
        return dict(self._by_netdev)

    def nic(self, agent_component: str) -> str | None:
        """Fabric NIC for 'mlx5_4/1' (or a netdev name); None for ports off the rails (bond, frontend)."""
        return self._by_port.get(agent_component) or self._by_netdev.get(agent_component)


def _natural(name: str) -> tuple[object, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))
