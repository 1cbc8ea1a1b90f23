"""Fabric files: the declared wiring an operator keeps under version control.

Format (JSON, or YAML with the same structure), version 1::

    {
      "version": 1,
      "params": {"nodes": 32, "rails": 8, ...},          # free-form, kept as is
      "vertices": [                                       # "nodes" is accepted as an alias
        {"name": "node-000", "kind": "node", "block": 0, "spare": false, "slot": 0},
        {"name": "node-000/gpu-0", "kind": "gpu", "host": "node-000", "index": 0},
        {"name": "node-000/nic-0", "kind": "nic", "host": "node-000", "index": 0, "rail": 0},
        {"name": "leaf-b0-r0", "kind": "leaf", "block": 0, "rail": 0},
        {"name": "spine-0", "kind": "spine", "index": 0}
      ],
      "links": [
        {"a": "node-000/gpu-0", "b": "node-000/nic-0", "kind": "gpu-nic"},
        {"a": "node-000/nic-0", "b": "leaf-b0-r0", "kind": "nic-leaf", "port": "Ethernet0"},
        {"a": "leaf-b0-r0", "b": "spine-0", "kind": "leaf-spine",
         "leaf_port": "Ethernet64", "spine_port": "Ethernet0"}
      ]
    }

Any other keys on a vertex or link are kept as attributes. Saving then loading gives an
equal ``Fabric`` (same params, vertices, attributes and links).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import networkx as nx
import structlog
import yaml

from controller.fabric.model import EDGE_KINDS, VERTEX_KINDS, Fabric, FabricError
from starpulse.core.schema import ConfigError

log = structlog.get_logger(__name__)

FORMAT_VERSION = 1
_YAML_SUFFIXES = (".yaml", ".yml")


class FabricFileError(FabricError, ConfigError):
    """A fabric file that cannot be loaded; the message names the file and the problem."""


def fabric_to_dict(fabric: Fabric) -> dict[str, Any]:
    """The file structure for ``fabric`` (vertices and links in graph order)."""
    vertices = [{"name": name, **attrs} for name, attrs in fabric.graph.nodes(data=True)]
    links = [{"a": a, "b": b, **attrs} for a, b, attrs in fabric.graph.edges(data=True)]
    return {"version": FORMAT_VERSION, "params": dict(fabric.params), "vertices": vertices, "links": links}


# Complexity over 15 on purpose: one validation per file section, every error naming the file and key.
def fabric_from_dict(data: Any, source: str = "<fabric>") -> Fabric:  # noqa: C901
    """Build and validate a ``Fabric`` from the file structure; errors start with ``source``."""

    def fail(msg: str) -> FabricFileError:
        return FabricFileError(f"{source}: {msg}")

    if not isinstance(data, Mapping):
        raise fail(f"top level must be an object, got {type(data).__name__}")
    version = data.get("version")
    if version != FORMAT_VERSION:
        raise fail(f"unsupported version {version!r} (expected {FORMAT_VERSION})")
    if "vertices" in data and "nodes" in data:
        raise fail("give either 'vertices' or its alias 'nodes', not both")
    vertices = data.get("vertices", data.get("nodes"))
    links = data.get("links", [])
    params = data.get("params", {})
    if not isinstance(vertices, list):
        raise fail("'vertices' must be a list")
    if not isinstance(links, list):
        raise fail("'links' must be a list")
    if not isinstance(params, Mapping):
        raise fail("'params' must be an object")

    graph = nx.Graph()
    for i, v in enumerate(vertices):
        if not isinstance(v, Mapping):
            raise fail(f"vertex #{i} must be an object, got {v!r}")
        name = v.get("name")
        if not isinstance(name, str) or not name:
            raise fail(f"vertex #{i} has no 'name'")
        kind = v.get("kind")
        if kind not in VERTEX_KINDS:
            raise fail(f"vertex {name!r}: unknown kind {kind!r} (expected one of {', '.join(VERTEX_KINDS)})")
        if name in graph:
            raise fail(f"duplicate vertex name {name!r}")
        graph.add_node(name, **{k: val for k, val in v.items() if k != "name"})

    for i, link in enumerate(links):
        if not isinstance(link, Mapping):
            raise fail(f"link #{i} must be an object, got {link!r}")
        a, b, kind = link.get("a"), link.get("b"), link.get("kind")
        for end in (a, b):
            if not isinstance(end, str) or end not in graph:
                raise fail(f"link #{i} ({a!r} - {b!r}): unknown vertex {end!r}")
        if kind not in EDGE_KINDS:
            expected = ", ".join(EDGE_KINDS)
            raise fail(f"link #{i} ({a!r} - {b!r}): unknown kind {kind!r} (expected one of {expected})")
        if graph.has_edge(a, b):
            raise fail(f"duplicate link {a!r} - {b!r}")
        graph.add_edge(a, b, **{k: val for k, val in link.items() if k not in ("a", "b")})

    try:
        return Fabric(graph, params)
    except FabricError as exc:
        raise fail(str(exc)) from None


def save_fabric(fabric: Fabric, path: str | Path) -> None:
    """Write ``fabric`` to ``path``: YAML for .yaml/.yml, JSON otherwise."""
    p = Path(path)
    data = fabric_to_dict(fabric)
    tmp = p.with_name(p.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        if p.suffix.lower() in _YAML_SUFFIXES:
            yaml.safe_dump(data, fh, sort_keys=False)
        else:
            json.dump(data, fh, separators=(",", ":"))
            fh.write("\n")
    tmp.replace(p)  # a crash mid-write never leaves a truncated fabric file
    log.info("fabric_saved", path=str(p), **fabric.summary())


def load_fabric(path: str | Path) -> Fabric:
    """Read a fabric file (YAML for .yaml/.yml, JSON otherwise); FabricFileError names the file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise FabricFileError(f"{p}: cannot read: {exc.strerror or exc}") from None
    is_yaml = p.suffix.lower() in _YAML_SUFFIXES
    try:
        data = yaml.safe_load(text) if is_yaml else json.loads(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise FabricFileError(f"{p}: not valid {'YAML' if is_yaml else 'JSON'}: {exc}") from None
    fabric = fabric_from_dict(data, str(p))
    log.info("fabric_loaded", path=str(p), **fabric.summary())
    return fabric
