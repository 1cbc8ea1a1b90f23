"""Declared wiring of a Xingmai-style rail-optimized two-tier Clos.

Nodes are grouped into blocks; NIC i of every node in a block goes to that block's rail
leaf i, and every leaf goes to every spine. The result is what the fabric *should* be;
``reconcile`` compares it with what LLDP says it *is*.
"""

from __future__ import annotations

from typing import Any

import networkx as nx
import structlog

from controller.fabric.model import (
    Fabric,
    gpu_name,
    leaf_name,
    nic_name,
    node_name,
    port_name,
    spine_name,
)

log = structlog.get_logger(__name__)


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def generate_fabric(
    nodes: int,
    gpus_per_node: int = 8,
    rails: int = 8,
    nodes_per_block: int = 16,
    spines: int = 8,
    spares: int = 0,
) -> Fabric:
    """Build the declared fabric.

    ``nodes`` regular nodes are followed by ``spares`` spare nodes, numbered after them and
    filling blocks the same way. Each node has ``rails`` NICs; GPU i pairs with NIC
    ``i % rails`` (so fewer rails than GPUs means NICs shared by several GPUs, and more
    rails than GPUs leaves the extra NICs unpaired). Leaf ports: node slot s in its block
    uses ``Ethernet{4*s}``; uplink to spine k uses ``Ethernet{4*(nodes_per_block + k)}``;
    spine port for leaf j (block-major, rail-minor) is ``Ethernet{4*j}``.
    """
    _check_int("nodes", nodes, 1)
    _check_int("gpus_per_node", gpus_per_node, 1)
    _check_int("rails", rails, 1)
    _check_int("nodes_per_block", nodes_per_block, 1)
    _check_int("spines", spines, 0)
    _check_int("spares", spares, 0)

    total = nodes + spares
    width = max(3, len(str(total - 1)))
    n_blocks = -(-total // nodes_per_block)

    vertices: list[tuple[str, dict[str, Any]]] = []
    edges: list[tuple[str, str, dict[str, Any]]] = []

    leaves = [[leaf_name(b, r) for r in range(rails)] for b in range(n_blocks)]
    spine_names = [spine_name(k) for k in range(spines)]
    for b in range(n_blocks):
        for r in range(rails):
            vertices.append((leaves[b][r], {"kind": "leaf", "block": b, "rail": r}))
    for k, s in enumerate(spine_names):
        vertices.append((s, {"kind": "spine", "index": k}))

    for i in range(total):
        block, slot = divmod(i, nodes_per_block)
        node = node_name(i, width)
        vertices.append((node, {"kind": "node", "block": block, "spare": i >= nodes, "slot": slot}))
        nics = [nic_name(node, r) for r in range(rails)]
        for r, nic in enumerate(nics):
            vertices.append((nic, {"kind": "nic", "host": node, "index": r, "rail": r}))
            edges.append((node, nic, {"kind": "node-nic"}))
            edges.append((nic, leaves[block][r], {"kind": "nic-leaf", "port": port_name(slot)}))
        for g in range(gpus_per_node):
            gpu = gpu_name(node, g)
            vertices.append((gpu, {"kind": "gpu", "host": node, "index": g}))
            edges.append((node, gpu, {"kind": "node-gpu"}))
            edges.append((gpu, nics[g % rails], {"kind": "gpu-nic"}))

    for b in range(n_blocks):
        for r in range(rails):
            j = b * rails + r
            for k, s in enumerate(spine_names):
                edges.append(
                    (
                        leaves[b][r],
                        s,
                        {
                            "kind": "leaf-spine",
                            "leaf_port": port_name(nodes_per_block + k),
                            "spine_port": port_name(j),
                        },
                    )
                )

    graph = nx.Graph()
    graph.add_nodes_from(vertices)
    graph.add_edges_from(edges)
    params = {
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "rails": rails,
        "nodes_per_block": nodes_per_block,
        "spines": spines,
        "spares": spares,
    }
    fabric = Fabric(graph, params)
    log.debug("fabric_generated", **fabric.summary())
    return fabric
