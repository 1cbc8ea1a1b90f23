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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import networkx as nx
import structlog
import yaml

from controller.fabric.model import EDGE_KINDS, REQUIRED_ATTRS, VERTEX_KINDS, Fabric, FabricError
from starpulse.core.schema import ConfigError, Reading, Schema, meta, setting, show

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


@dataclass(frozen=True)
class FabricFile:
    """The top level of a fabric file, as the settings schema reads it."""

    version: Literal[1] = field(metadata=meta("The format's version"))
    vertices: list[dict[str, Any]] | None = setting(None, "Every node, GPU, NIC, leaf and spine")
    nodes: list[dict[str, Any]] | None = setting(None, "An alias of vertices")
    links: list[dict[str, Any]] = setting([], "Every cable and host attachment")
    params: dict[str, Any] = setting({}, "Free-form, kept as is")

    def problems(self) -> list[tuple[str, str]]:
        if self.vertices is not None and self.nodes is not None:
            return [("nodes", "give either 'vertices' or its alias 'nodes', not both")]
        if self.vertices is None and self.nodes is None:
            return [("vertices", "is required")]
        return []


_SCHEMA = Schema(FabricFile, "fabric")
_TYPE_WORDS = {int: "an integer", bool: "true or false", str: "a string"}


def fabric_from_dict(data: Any, source: str = "<fabric>") -> Fabric:
    """Build and validate a ``Fabric`` from the file structure; every error, each naming ``source`` and the key.

    The top level is read by the settings schema; each vertex against ``REQUIRED_ATTRS`` (its
    kind's attributes) and each link against ``EDGE_KINDS``, through the same error list; the
    graph's own consistency (a NIC on two leaves) is ``Fabric``'s, checked once those pass.
    """
    if not isinstance(data, Mapping):
        raise FabricFileError(f"{source}: top level must be an object, got {type(data).__name__}")
    reading = Reading(_SCHEMA, source, dict(data))
    f = reading.read()  # None on a top-level error: the vertices and links are checked all the same
    key = "vertices" if data.get("vertices") is not None else "nodes"
    graph = _graph(reading, key, _mappings(data.get(key)), _mappings(data.get("links")))
    if reading.errors or f is None:
        raise FabricFileError(reading.errors)
    try:
        return Fabric(graph, f.params)
    except FabricError as exc:
        raise FabricFileError(f"{source}: {exc}") from None


def _mappings(items: Any) -> list[Any]:
    """A list's items as they stand (the schema reported a non-mapping one): None for those."""
    return [item if isinstance(item, Mapping) else None for item in items] if isinstance(items, list) else []


def _graph(reading: Reading, key: str, vertices: list[Any], links: list[Any]) -> nx.Graph:
    """The graph of every vertex and link without a problem; each problem reported, keyed where it sits."""
    graph = nx.Graph()
    refused: set[str] = set()  # vertices with a problem: their links are not reported again
    for i, v in enumerate(vertices):
        if v is None:
            continue
        name, kind = v.get("name"), v.get("kind")
        if type(name) is str and name and name not in graph and kind in REQUIRED_ATTRS and _typed(v, kind):
            graph.add_node(name, **{k: x for k, x in v.items() if k != "name"})
            continue
        _report(reading, f"{key}[{i}]", _vertex_problems(v, graph))
        if isinstance(name, str):
            refused.add(name)
    for i, link in enumerate(links):
        if link is None:
            continue
        a, b = link.get("a"), link.get("b")
        if type(a) is str and type(b) is str:
            if a in graph and b in graph and link.get("kind") in EDGE_KINDS and not graph.has_edge(a, b):
                graph.add_edge(a, b, **{k: x for k, x in link.items() if k not in ("a", "b")})
                continue
            if a in refused or b in refused:
                continue
        _report(reading, f"links[{i}]", _link_problems(link, graph))
    return graph


def _report(reading: Reading, at: str, problems: list[tuple[str, str]]) -> None:
    for key, msg in problems:
        reading.err(f"{at}.{key}", msg)


def _typed(v: Mapping[str, Any], kind: str, only: str = "") -> bool:
    """Whether the vertex has its kind's attributes (``only``: that one), each of its type (a bool is no int)."""
    for attr, typ in REQUIRED_ATTRS[kind].items():
        if only and attr != only:
            continue
        value = v.get(attr)
        if type(value) is not typ and (typ is bool or isinstance(value, bool) or not isinstance(value, typ)):
            return False
    return True


def _vertex_problems(v: Mapping[str, Any], graph: nx.Graph) -> list[tuple[str, str]]:
    """A vertex: a new name, a known kind and that kind's attributes with their types."""
    name, kind = v.get("name"), v.get("kind")
    if not isinstance(name, str) or not name:
        return [("name", f"must be a non-empty string, got {show(name)}")]
    if name in graph:
        return [("name", f"duplicate vertex name {name!r}")]
    if kind not in REQUIRED_ATTRS:
        return [("kind", f"must be one of {', '.join(VERTEX_KINDS)}, got {show(kind)}")]
    return [
        (attr, f"must be {_TYPE_WORDS[typ]} on a {kind} vertex, got {show(v.get(attr))}")
        for attr, typ in REQUIRED_ATTRS[kind].items()
        if not _typed({attr: v.get(attr)}, kind, attr)
    ]


def _link_problems(link: Mapping[str, Any], graph: nx.Graph) -> list[tuple[str, str]]:
    """A link: two known vertices, a known kind, not cabled twice."""
    ends = [e for e in ("a", "b") if not isinstance(link.get(e), str) or link[e] not in graph]
    out = [(end, f"must name a vertex, got {show(link.get(end))}") for end in ends]
    if link.get("kind") not in EDGE_KINDS:
        out.append(("kind", f"must be one of {', '.join(EDGE_KINDS)}, got {show(link.get('kind'))}"))
    if not out and graph.has_edge(link["a"], link["b"]):
        out.append(("b", f"duplicate link {link['a']!r} - {link['b']!r}"))
    return out


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
