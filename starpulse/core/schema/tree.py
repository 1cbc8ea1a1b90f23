"""Declaring settings on dataclass fields, and the tree of a settings dataclass they make."""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

_META = "starpulse.setting"


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()  # Spec.example: none given


class ConfigError(ValueError):
    """Input that cannot be used; ``errors`` holds every problem, one line each.

    The one shape of every "this file, flag or variable is invalid" error: a command prints
    the lines and exits 2. Subclasses say which reader refused (rules, policy, fabric, ...).
    """

    def __init__(self, errors: str | Sequence[str]) -> None:
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        super().__init__("\n".join(self.errors))


# -- declaring settings ---------------------------------------------------------------------
@dataclass(frozen=True)
class Spec:
    """What a field's metadata says about it as a setting (or a section)."""

    doc: str = ""
    gt: float | None = None
    ge: float | None = None
    le: float | None = None
    lt: float | None = None
    prefix: tuple[str, ...] = ()  # a string must start with one of these (e.g. http://, https://)
    pattern: str = ""  # a string must match this regular expression whole
    quantity: tuple[str, ...] = ()  # a float read by starpulse.core.units ("5m", 300, {value, unit})
    number_keys: bool = False  # a mapping's keys may be numbers (YAML's 79:), read as their text
    file_key: str = ""  # the key in the file when it cannot be the field's name (``pass``)
    choices: tuple[str, ...] = ()  # a list's items come from these
    address: bool = False  # HOST:PORT (a list: every item)
    empty: bool = False  # with address: "" is allowed too (not set)
    nonempty: bool = False  # a string not blank, a list not empty
    example: Any = UNSET  # shown in a rendered file (a required setting's only value there)
    shape: type | None = None  # a free mapping read by its own parser, keyed like this dataclass
    switch: str = ""  # sections: the bool key that turns the section on (off: the field is None)
    switch_doc: str = ""
    source: tuple[type, str] | None = None  # from_field: the service field this setting is


def meta(doc: str, **rules: Any) -> dict[str, Spec]:
    """Field metadata for a setting without a default: ``field(metadata=meta("..."))``."""
    return {_META: Spec(doc, **rules)}


def setting(default: Any, doc: str, **rules: Any) -> Any:
    """A documented setting with a default (a list or dict is copied for each instance)."""
    if isinstance(default, list | dict):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta(doc, **rules))
    return field(default=default, metadata=meta(doc, **rules))


def section(cls: type, doc: str = "", *, switch: str = "", switch_doc: str = "") -> Any:
    """A nested section; with ``switch`` it is None unless that bool key of the section is true."""
    spec = {_META: Spec(doc, switch=switch, switch_doc=switch_doc)}
    if switch:
        return field(default=None, metadata=spec)
    return field(default_factory=cls, metadata=spec)


def from_field(cls: type, name: str, *, convert: Callable[[Any], Any] | None = None) -> Any:
    """The setting that is ``cls.name`` in a file section: that field's default, doc and checks.

    :func:`gather` hands the value back to ``cls``. ``convert`` adapts the default to this
    section's type (a ``str`` path in the service config read as a ``Path``).
    """
    f = _fields(cls)[name]
    spec = spec_of(f)
    if spec is None:
        raise TypeError(f"{cls.__name__}.{name} is not a documented setting")
    md = {_META: dataclasses.replace(spec, source=(cls, name))}
    if f.default is not MISSING:
        return field(default=convert(f.default) if convert else f.default, metadata=md)
    if f.default_factory is not MISSING:
        return field(default_factory=f.default_factory, metadata=md)
    return field(metadata=md)


def default_of(cls: type, name: str) -> Any:
    """The default of dataclass field ``cls.name`` (for a setting derived from it)."""
    f = _fields(cls)[name]
    if f.default_factory is not MISSING:
        return f.default_factory()
    return f.default


def gather(settings: Any, cls: type) -> dict[str, Any]:
    """Every value in a settings tree declared ``from_field(cls, ...)``, by its field name in ``cls``."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(settings):
        spec = spec_of(f)
        value = getattr(settings, f.name)
        if spec is not None and spec.source is not None and spec.source[0] is cls:
            out[spec.source[1]] = value
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.update(gather(value, cls))
    return out


def spec_of(f: dataclasses.Field[Any]) -> Spec | None:
    """What a dataclass field declares as a setting; None for a plain field."""
    spec: Spec | None = f.metadata.get(_META)
    return spec


def _fields(cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls)}


# -- the tree -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Leaf:
    """One setting: its dotted key, its kind (from the annotation) and its rules."""

    key: str
    kind: str  # str address path int float bool enum list int_list list_map map str_map records record_map maps
    #            quantity flag_record record
    spec: Spec
    default: Any  # MISSING: required
    nullable: bool = False
    choices: tuple[str, ...] = ()  # enum values, or a list's items
    as_tuple: bool = False
    item: type | None = None  # records, record_map, flag_record: the dataclass each item is read as
    literal: tuple[Any, ...] = ()  # enum: the Literal's own values (an int Literal is not its text)
    attr: str = ""  # the dataclass field, where the file's key differs (Spec.file_key)

    @property
    def name(self) -> str:
        return self.key.rsplit(".", 1)[-1]

    @property
    def required(self) -> bool:
        return self.default is MISSING

    def expect(self) -> str:
        """What a valid value looks like, for messages and rendered files."""
        s = self.spec
        pairs = ((">", s.gt), (">=", s.ge), ("<", s.lt), ("<=", s.le))
        bounds = [f"{op} {v:g}" for op, v in pairs if v is not None]
        rng = (" " + " and ".join(bounds)) if bounds else ""
        if self.kind == "list":
            if self.choices:
                base = "a list with items from " + ", ".join(self.choices)
            else:
                base = "a list of HOST:PORT" if s.address else "a list of strings"
            if s.nonempty:
                base = "a non-empty " + base[2:]
        else:
            base = {
                "str": _str_expect(s),
                "address": "HOST:PORT or empty" if s.empty else "HOST:PORT",
                "path": "a path",
                "int": "an integer" + rng,
                "int_list": "a list of integers",
                "quantity": "a "
                + " or ".join(s.quantity)
                + " quantity (e.g. "
                + _QUANTITY_EG.get(s.quantity[0], "5")
                + ")"
                + rng
                if s.quantity
                else "",
                "flag_record": "true, false or a mapping",
                "record": "a mapping",
                "float": "a number" + rng,
                "bool": "true or false",
                "enum": "one of " + ", ".join(self.choices),
                "map": "a mapping",
                "list_map": "a mapping of names to non-empty lists of "
                + ("items from " + ", ".join(self.choices) if self.choices else "strings"),
                "str_map": "a mapping of names to "
                + ("one of " + ", ".join(self.choices) if self.choices else "strings"),
                "records": "a list of mappings",
                "maps": "a list of mappings",
                "record_map": "a mapping of names to mappings",
            }[self.kind]
        return base + (", or null" if self.nullable else "")


_QUANTITY_EG = {"time": "60s, 10m, 24h"}


def _str_expect(s: Spec) -> str:
    base = "a non-empty string" if s.nonempty else "a string"
    if s.pattern:
        base += f" matching {s.pattern}"
    return base + (" starting with " + " or ".join(s.prefix) if s.prefix else "")


@dataclass(frozen=True)
class Section:
    """A nested dataclass of settings at a dotted key ("" for the root)."""

    key: str
    cls: type
    doc: str
    children: dict[str, Leaf | Section]
    switch: str = ""

    @property
    def name(self) -> str:
        return self.key.rsplit(".", 1)[-1]


Node = Leaf | Section


class Schema:
    """The tree of a settings dataclass: what a file may hold, and how to read it."""

    def __init__(self, root: type, name: str) -> None:
        self.name = name  # "controller": for messages about the whole
        self.root = _section(root, "", _doc_of(root), "", "")

    def leaves(self, node: Section | None = None) -> Iterator[Leaf]:
        """Every setting, depth first in declaration order."""
        for child in (node or self.root).children.values():
            if isinstance(child, Leaf):
                yield child
            else:
                yield from self.leaves(child)

    def node(self, key: str) -> Node:
        """The setting or section at a dotted key; KeyError when there is none."""
        node: Node = self.root
        for part in key.split("."):
            if not isinstance(node, Section) or part not in node.children:
                raise KeyError(f"{key!r} is not a setting of the {self.name} settings")
            node = node.children[part]
        return node

    def leaf(self, key: str) -> Leaf:
        node = self.node(key)
        if not isinstance(node, Leaf):
            raise KeyError(f"{key!r} is a section of the {self.name} settings, not a setting")
        return node


def join_key(prefix: str, name: str) -> str:
    """A dotted key below ``prefix`` ("" for the root)."""
    return f"{prefix}.{name}" if prefix else name


def _doc_of(cls: type) -> str:
    return " ".join((cls.__doc__ or "").split("\n\n")[0].split())


def _section(cls: type, key: str, doc: str, switch: str, switch_doc: str) -> Section:
    hints = get_type_hints(cls)
    children: dict[str, Node] = {}
    if switch:
        children[switch] = Leaf(join_key(key, switch), "bool", Spec(switch_doc), False)
    for f in dataclasses.fields(cls):
        spec = spec_of(f)
        where = f"{cls.__name__}.{f.name}"
        if spec is None:
            raise TypeError(f"{where}: not a documented setting (use setting(), meta() or section())")
        hint, nullable = _unwrap_optional(hints[f.name])
        name = spec.file_key or f.name
        sub_key = join_key(key, name)
        if _is_record(hint) and nullable and not spec.switch:  # an optional mapping: None when absent
            children[name] = Leaf(sub_key, "record", spec, f.default, True, item=hint, attr=f.name)
            continue
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            children[f.name] = _section(hint, sub_key, spec.doc or _doc_of(hint), spec.switch, spec.switch_doc)
            continue
        default = f.default
        if f.default_factory is not MISSING:
            default = f.default_factory()
        kind, choices, as_tuple = _kind(hint, where)
        if kind == "str" and spec.address:
            kind = "address"
        if kind == "str" and spec.choices:
            kind = "enum"
        if kind == "float" and spec.quantity:
            kind = "quantity"
        item = _item_class(hint) if kind in ("records", "record_map", "flag_record") else None
        literal = tuple(get_args(hint)) if kind == "enum" and get_origin(hint) is Literal else ()
        children[name] = Leaf(
            sub_key, kind, spec, default, nullable, choices or spec.choices, as_tuple, item, literal, f.name
        )
    return Section(key, cls, doc, children, switch)


def record_section(cls: type, key: str) -> Section:
    """The section one item of a ``records``/``record_map`` setting is read as, keyed where it sits."""
    return _section(cls, key, _doc_of(cls), "", "")


def _is_record(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _item_class(hint: Any) -> type:
    item: type = next(a for a in reversed(get_args(hint)) if _is_record(a))
    return item


def _unwrap_optional(hint: Any) -> tuple[Any, bool]:
    if get_origin(hint) in (types.UnionType, typing.Union):
        args = [a for a in get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0], len(args) < len(get_args(hint))
    return hint, False


def _kind(hint: Any, where: str) -> tuple[str, tuple[str, ...], bool]:
    origin, args = get_origin(hint), get_args(hint)
    simple = {str: "str", Path: "path", bool: "bool", int: "int", float: "float"}
    if hint in simple:
        return simple[hint], (), False
    if origin is Literal:
        return "enum", tuple(str(a) for a in args), False
    if origin is list and args == (str,):
        return "list", (), False
    if origin is list and args == (int,):
        return "int_list", (), False
    if origin in (types.UnionType, typing.Union) and bool in args and any(_is_record(a) for a in args):
        return "flag_record", (), False
    if origin is list and args and _is_record(args[0]):
        return "records", (), False
    if origin is list and args and get_origin(args[0]) is dict:
        return "maps", (), False
    if origin is tuple and args == (str, ...):
        return "list", (), True
    if origin is dict and args and args[0] is str:
        if _is_record(args[1]):
            return "record_map", (), False
        kinds = {list[str]: "list_map", str: "str_map"}
        return kinds.get(args[1], "map"), (), False
    raise TypeError(f"{where}: type {hint!r} is not one a settings file can hold")
