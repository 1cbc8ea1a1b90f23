"""A reference settings file: every setting at its default, documented."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import yaml

from starpulse.core.schema.tree import UNSET, Leaf, Node, Schema, Section, Spec, default_of, spec_of

# -- rendering ------------------------------------------------------------------------------
_WIDTH = 100


def render(schema: Schema, header: str) -> str:
    """A settings file with every setting at its default (a required one: its example), documented."""
    out: list[str] = []
    for line in header.strip("\n").splitlines():
        indent = " " * (len(line) - len(line.lstrip()) + 2)
        wrapped = textwrap.wrap(line, _WIDTH - 2, subsequent_indent=indent, break_on_hyphens=False) or [""]
        out.extend(f"# {part}".rstrip() for part in wrapped)
    for node in schema.root.children.values():
        out.append("")
        _render(node, 0, out)
    return "\n".join(out) + "\n"


def _comment(out: list[str], pad: str, text: str, *, sentence: bool = True) -> None:
    """``text`` as comment lines; a ``sentence`` ends in a full stop."""
    text = text + "." if sentence and not text.endswith(".") else text
    out.extend(
        textwrap.wrap(text, _WIDTH, initial_indent=pad + "# ", subsequent_indent=pad + "# ", break_on_hyphens=False)
    )


def describe(leaf: Leaf) -> str:
    """A setting's doc and, where it says more than the value shows, what it must be."""
    text = leaf.spec.doc.rstrip(".")
    detail = leaf.expect()
    if leaf.kind in ("str", "path", "map", "bool") and not (leaf.spec.nonempty or leaf.nullable):
        detail = ""
    if leaf.required:
        detail = "required; " + (detail or leaf.expect())
    return f"{text}. {detail[0].upper()}{detail[1:]}." if detail else f"{text}."


def _render(node: Node, indent: int, out: list[str]) -> None:
    pad = " " * indent
    if isinstance(node, Section):
        if node.doc:
            _comment(out, pad, node.doc)
        out.append(f"{pad}{node.name}:")
        for child in node.children.values():
            _render(child, indent + 2, out)
        return
    _comment(out, pad, describe(node))
    spec = node.spec
    if spec.shape is not None:
        out.append(f"{pad}{node.name}:")
        _render_shape(spec.shape, pad + "  ", out)
        return
    if spec.example is not UNSET and not node.required:
        _comment(out, pad, f"e.g. {node.name}: {to_yaml(spec.example)}", sentence=False)
    value = spec.example if node.required else node.default
    out.append(f"{pad}{node.name}: {to_yaml(value)}")


def _render_shape(cls: type, pad: str, out: list[str]) -> None:
    """The keys of a free mapping its own parser reads, from the dataclass it becomes."""
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        spec = spec_of(f) or Spec()
        hint = hints[f.name]
        if spec.doc:
            _comment(out, pad, spec.doc)
        item = get_args(hint)[0] if get_origin(hint) is list else None
        if isinstance(item, type) and dataclasses.is_dataclass(item):  # none, and one commented example
            out.append(f"{pad}{f.name}: []")
            lines: list[str] = []
            _render_shape(item, "", lines)
            first = next(i for i, line in enumerate(lines) if not line.startswith("#"))
            out.append(f"{pad}# e.g. {f.name}:")
            out.extend(f"{pad}#   {'- ' if i == first else '  '}{line}" for i, line in enumerate(lines))
        elif isinstance(hint, type) and dataclasses.is_dataclass(hint):
            out.append(f"{pad}{f.name}:")
            _render_shape(hint, pad + "  ", out)
        else:
            value = spec.example if spec.example is not UNSET else default_of(cls, f.name)
            out.append(f"{pad}{f.name}: {to_yaml(value)}")


def to_yaml(value: Any) -> str:
    """One value in YAML flow style, as a line of a settings file writes it."""
    if isinstance(value, Path):
        value = str(value)
    elif isinstance(value, tuple):
        value = list(value)
    text: str = yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False)
    return text.strip().removesuffix("...").strip()
