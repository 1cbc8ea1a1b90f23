"""Reading a settings tree: a file, then environment overrides, then flags, every problem at once."""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import yaml

from starpulse.core.schema.tree import ConfigError, Leaf, Node, Schema, Section, Spec, join_key, record_section
from starpulse.core.units import BadValue, parse_quantity

ENV_PREFIX = "STARPULSE_"


# -- reading --------------------------------------------------------------------------------
class Override(NamedTuple):
    """A value set from outside the file: a flag, say; ``origin`` names it in messages."""

    origin: str
    value: Any
    base_dir: Path | None = None  # relative paths inside the value (a file the flag named)


def read_file(path: str | Path) -> dict[str, Any]:
    """Parse a YAML or TOML (by suffix) settings file into a mapping; ConfigError otherwise."""
    name = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read: {exc.strerror or exc}") from exc
    try:
        data = tomllib.loads(text) if name.endswith(".toml") else yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{name}: not valid YAML{at}: {getattr(exc, 'problem', None) or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{name}: not valid TOML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{name}: must be a mapping of sections, got {show(data)}")
    return data


def show(value: Any) -> str:
    """A value as a message quotes it: its repr, cut at 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_FAILED = object()  # a section that had an error: not built, and neither is anything holding it


class Reading:
    """A raw settings tree being assembled (file, then environment, then flags) and read.

    Every value remembers where it came from, so that each error line names the file, the
    environment variable or the flag. ``flags`` (dotted key -> flag) are the flags of the
    running command: messages then say how to set a missing or related setting there.
    """

    def __init__(
        self,
        schema: Schema,
        source: str = "",
        raw: dict[str, Any] | None = None,
        *,
        base_dir: Path | None = None,
        flags: Mapping[str, str] | None = None,
    ) -> None:
        self.schema = schema
        self.source = source  # the file, or "" when there is none
        self.raw: dict[str, Any] = raw if raw is not None else {}
        self.base_dir = base_dir  # the file's folder: its relative paths are relative to it
        self.flags = dict(flags or {})
        self.origin: dict[str, str] = {}  # dotted key -> env var or flag
        self.bases: dict[str, Path | None] = {}  # dotted key -> folder of an override's file
        self.errors: list[str] = []

    # -- where things came from --
    def where(self, key: str) -> str:
        """What set ``key`` (or the section holding it, or the values inside it); else the file."""
        if key in self.origin:
            return self.origin[key]
        above = [o for k, o in self.origin.items() if key.startswith((k + ".", k + "["))]
        if above:
            return above[0]
        below = sorted({o for k, o in self.origin.items() if not key or k.startswith(key + ".")})
        return ", ".join(below) if below else self.source

    def base_dir_of(self, key: str) -> Path | None:
        """The folder relative paths in ``key``'s value are relative to (None: the working directory)."""
        if key in self.bases:
            return self.bases[key]
        return None if key in self.origin else self.base_dir

    def name(self, key: str) -> str:
        """A dotted key as a message names it, with its flag when the command has one."""
        flag = self.flags.get(key)
        return f"{key} ({flag})" if flag else key

    def err(self, key: str, msg: str) -> None:
        where = self.where(key)
        line = f"{key}: {msg}" if key else msg
        self.errors.append(f"{where}: {line}" if where else line)

    def missing(self, key: str) -> None:
        flag = self.flags.get(key)
        if flag and not self.source and key not in self.origin:
            self.errors.append(f"{flag} is required (or {key} in --config FILE)")
        else:
            self.err(key, "is required")

    def fail(self) -> None:
        """Raise ConfigError when anything was wrong."""
        if self.errors:
            raise ConfigError(self.errors)

    # -- layers --
    def _set(self, path: list[str], value: Any) -> None:
        node = self.raw
        for part in path[:-1]:
            nxt = node.get(part)
            if not isinstance(nxt, dict):
                nxt = {}
                node[part] = nxt
            node = nxt
        node[path[-1]] = value

    def override(self, key: str, value: Any, origin: str, base_dir: Path | None = None) -> None:
        """Set one setting from outside the file (a flag); KeyError when ``key`` is not a setting."""
        self.schema.leaf(key)
        self._set(key.split("."), value)
        self.origin[key] = origin
        if base_dir is not None:
            self.bases[key] = base_dir

    def apply_overrides(self, overrides: Mapping[str, Override | tuple[str, Any]]) -> None:
        for key, item in overrides.items():
            o = Override(*item)
            self.override(key, o.value, o.origin, o.base_dir)

    def apply_env(self, env: Mapping[str, str], prefix: str = ENV_PREFIX) -> None:
        """``STARPULSE_<SECTION>__<KEY>`` overrides; another service's sections are left alone."""
        for var in sorted(env):
            if not var.startswith(prefix) or "__" not in var:
                continue
            parts = var[len(prefix) :].lower().split("__")
            if parts[0] in self.schema.root.children:
                self._env_var(var, parts, env[var])

    def _env_var(self, var: str, parts: list[str], text: str) -> None:
        node: Node = self.schema.root
        for i, part in enumerate(parts):
            if isinstance(node, Leaf):
                if node.kind not in ("map", "list_map"):
                    self.errors.append(f"{var}: {'.'.join(parts[:i])} is a setting, not a section")
                    return
                break  # a key inside a free mapping: its consumer checks it
            if part not in node.children:
                self.errors.append(
                    f"{var}: unknown setting {'.'.join(parts[: i + 1])}{did_you_mean(part, node.children)}"
                )
                return
            node = node.children[part]
        if isinstance(node, Section):
            self.errors.append(f"{var}: {'.'.join(parts)} is a section, not a setting")
            return
        value = _env_value(node, text) if node.key == ".".join(parts) else _yaml_value(text)
        self._set(parts, value)
        self.origin[".".join(parts)] = var

    # -- checking --
    def read(self) -> Any:
        """The settings dataclass of the layers, or None when anything is wrong (see ``errors``)."""
        value = self._section(self.schema.root, self.raw)
        return None if value is _FAILED or self.errors else value

    def _section(self, sec: Section, raw: Any) -> Any:
        before = len(self.errors)
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            self.err(sec.key, f"must be a mapping, got {show(raw)}")
            raw = {}
        for name in raw:
            if name not in sec.children:
                self.err(join_key(sec.key, str(name)), f"unknown key{did_you_mean(str(name), sec.children)}")
        values: dict[str, Any] = {}
        for name, node in sec.children.items():
            if isinstance(node, Section):
                values[name] = self._section(node, raw.get(name))
            elif name in raw:
                values[node.attr or name] = self._value(node, raw[name])
            elif node.required:
                self.missing(node.key)
            else:
                values[node.attr or name] = node.default
        if len(self.errors) > before or any(v is _FAILED for v in values.values()):
            return _FAILED
        if sec.switch and not values.pop(sec.switch):
            return None
        try:
            built = sec.cls(**values)
        except ValueError as exc:  # the dataclass's own checks, across its fields
            self.err(sec.key, str(exc))
            return _FAILED
        return self._problems(sec, built)

    def _problems(self, sec: Section, built: Any) -> Any:
        """A section's checks across its keys (``problems()``: (key below the section, what is wrong))."""
        check = getattr(built, "problems", None)
        if not callable(check):
            return built
        found = list(check())
        for sub, msg in found:
            self.err(join_key(sec.key, sub), msg)
        return _FAILED if found else built

    def _item(self, sec: Section, name: Any, raw: Any) -> Any:
        """One item of a list or mapping of sections; ``problems_as(name)``: checks that need its name."""
        built = self._section(sec, raw)
        check = getattr(built, "problems_as", None)
        if built is _FAILED or not callable(check):
            return built
        found = list(check(str(name)))
        for sub, msg in found:
            self.err(join_key(sec.key, sub) if sub else sec.key, msg)
        return _FAILED if found else built

    def _records(self, leaf: Leaf, value: Any) -> Any:
        """A list (``records``) or mapping (``record_map``) of sections, each item keyed where it sits."""
        assert leaf.item is not None
        if leaf.kind == "records":
            items = [(f"{leaf.key}[{i}]", i, v) for i, v in enumerate(value)]
        else:
            items = [(join_key(leaf.key, str(k)), k, v) for k, v in value.items()]
        built = {at: self._item(record_section(leaf.item, at), k, v) for at, k, v in items}
        if any(v is _FAILED for v in built.values()):
            return _FAILED
        if leaf.kind == "records":
            return [built[at] for at, _, _ in items]
        return {k: built[at] for at, k, _ in items}

    def _value(self, leaf: Leaf, value: Any) -> Any:
        """The checked value (a path as Path, relative to its file), or _FAILED after an error."""
        if value is None:
            if leaf.nullable:
                return None
            self.err(leaf.key, f"must be {leaf.expect()}, got null")
            return _FAILED
        if leaf.kind == "list" and leaf.choices and isinstance(value, list) and value:
            return self._choices(leaf, value)
        if not _valid(leaf, value):
            self.err(leaf.key, f"must be {leaf.expect()}, got {show(value)}")
            return _FAILED
        compound = self._COMPOUND.get(leaf.kind)
        if compound is not None:
            return compound(self, leaf, value)
        if leaf.spec.number_keys:
            return {str(k): v for k, v in value.items()}
        if leaf.kind == "path":
            path = Path(value).expanduser()
            base = self.base_dir_of(leaf.key)
            return base / path if base is not None and not path.is_absolute() else path
        if leaf.kind == "float":
            return float(value)
        if leaf.as_tuple:
            return tuple(value)
        return value

    def _choices(self, leaf: Leaf, value: list[Any]) -> Any:
        """A list whose items come from ``choices``: each item that does not, by its index."""
        bad = [i for i, v in enumerate(value) if v not in leaf.choices]
        for i in bad:
            self.err(f"{leaf.key}[{i}]", f"must be one of {', '.join(leaf.choices)}, got {show(value[i])}")
        if bad:
            return _FAILED
        if not _valid(leaf, value):
            self.err(leaf.key, f"must be {leaf.expect()}, got {show(value)}")
            return _FAILED
        return tuple(value) if leaf.as_tuple else value

    def _flag_record(self, leaf: Leaf, value: Any) -> Any:
        """true/false, or a mapping read as the leaf's dataclass."""
        if isinstance(value, bool):
            return value
        if not isinstance(value, dict):
            self.err(leaf.key, f"must be {leaf.expect()}, got {show(value)}")
            return _FAILED
        assert leaf.item is not None
        return self._section(record_section(leaf.item, leaf.key), value)

    def _record(self, leaf: Leaf, value: Any) -> Any:
        """An optional mapping read as the leaf's dataclass."""
        assert leaf.item is not None
        return self._section(record_section(leaf.item, leaf.key), value)

    def _quantity(self, leaf: Leaf, value: Any) -> Any:
        """A quantity with its unit ("5m", 300, {value, unit}) as the canonical unit's number."""
        try:
            amount = parse_quantity(value, leaf.spec.quantity).value
        except BadValue as exc:
            self.err(leaf.key, str(exc))
            return _FAILED
        if not _in_bounds(leaf.spec, amount):
            self.err(leaf.key, f"must be {leaf.expect()}, got {show(value)}")
            return _FAILED
        return amount

    def _list_map(self, leaf: Leaf, value: dict[Any, Any]) -> Any:
        """Names to non-empty lists of strings (from ``choices`` when given): each entry, each item, by its key."""
        before = len(self.errors)
        one = "one of " + ", ".join(leaf.choices) if leaf.choices else "a non-empty string"
        for name, items in value.items():
            at = join_key(leaf.key, str(name))
            if not isinstance(name, str) or not isinstance(items, list) or not items:
                self.err(at, f"must be a non-empty list, each {one}, got {show(items)}")
                continue
            for i, item in enumerate(items):
                if not isinstance(item, str) or not item or (leaf.choices and item not in leaf.choices):
                    self.err(f"{at}[{i}]", f"must be {one}, got {show(item)}")
        return _FAILED if len(self.errors) > before else value

    def _maps(self, leaf: Leaf, value: list[Any]) -> Any:
        """A list of free mappings: each item that is not one, by its index (the keys are its consumer's)."""
        bad = [i for i, item in enumerate(value) if not isinstance(item, dict)]
        for i in bad:
            self.err(f"{leaf.key}[{i}]", f"must be a mapping, got {show(value[i])}")
        return _FAILED if bad else value

    _COMPOUND: ClassVar[dict[str, Callable[[Reading, Leaf, Any], Any]]] = {
        "records": _records,
        "record_map": _records,
        "flag_record": _flag_record,
        "record": _record,
        "quantity": _quantity,
        "maps": _maps,
        "list_map": _list_map,
    }


def did_you_mean(name: str, options: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    return f", did you mean {close[0]!r}?" if close else ""


def address_ok(value: str) -> bool:
    """HOST:PORT (a port 0-65535), or unix:PATH."""
    if value.startswith("unix:"):
        return len(value) > 5
    host, _, port = value.rpartition(":")
    return bool(host.strip("[]")) and port.isdigit() and 0 <= int(port) <= 65535


def _in_bounds(s: Spec, value: float) -> bool:
    return not (
        (s.gt is not None and not value > s.gt)
        or (s.ge is not None and not value >= s.ge)
        or (s.le is not None and not value <= s.le)
        or (s.lt is not None and not value < s.lt)
    )


def _valid(leaf: Leaf, value: Any) -> bool:
    s, k = leaf.spec, leaf.kind
    if k in ("int", "float"):
        number = isinstance(value, int | float) and not isinstance(value, bool)
        return number and (k == "float" or isinstance(value, int)) and _in_bounds(s, value)
    if k == "bool":
        return isinstance(value, bool)
    if k == "int_list":
        return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    if k in ("quantity", "flag_record"):
        return True  # read by their own step in Reading._value
    if k in ("str", "path"):
        return (
            isinstance(value, str)
            and not (s.nonempty and not value.strip())
            and (k == "str" or bool(value))
            and (not s.prefix or value.startswith(s.prefix))
            and (not s.pattern or re.fullmatch(s.pattern, value) is not None)
        )
    if k == "address":
        return isinstance(value, str) and ((s.empty and value == "") or address_ok(value))
    if k == "enum":
        return not isinstance(value, bool) and value in (leaf.literal or leaf.choices)
    if k == "list":
        return (
            isinstance(value, list)
            and all(isinstance(v, str) and v for v in value)
            and not (s.nonempty and not value)
            and not (leaf.choices and any(v not in leaf.choices for v in value))
            and not (s.address and not all(address_ok(v) for v in value))
        )
    if k in ("map", "record_map", "record"):
        return isinstance(value, dict) and not (s.nonempty and not value)
    if k in ("records", "maps"):
        return isinstance(value, list)
    if k == "str_map":
        keys_ok = all(isinstance(n, str) or (s.number_keys and isinstance(n, int)) for n in value)
        return (
            isinstance(value, dict)
            and keys_ok
            and all(isinstance(v, str) and (not leaf.choices or v in leaf.choices) for v in value.values())
        )
    return isinstance(value, dict)  # list_map: each entry checked by Reading._list_map


def _yaml_value(text: str) -> Any:
    if not text.strip():
        return ""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _env_value(leaf: Leaf, text: str) -> Any:
    """An environment string as the setting would read it from YAML (lists: also a,b,c)."""
    if leaf.nullable and text.strip() in ("", "null", "~"):
        return None
    if leaf.kind in ("str", "path", "address", "enum"):
        return text
    value = _yaml_value(text)
    if leaf.kind == "list" and isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value
