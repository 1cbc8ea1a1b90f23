"""Command-line flags that set settings: their help, default and the settings they set come from the tree."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starpulse.core.schema.reading import Override, read_file
from starpulse.core.schema.tree import UNSET, ConfigError, Leaf, Schema


# -- flags ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Flag:
    """A command-line flag that sets a setting; its help text and default come from the setting.

    A flag with its own meaning gives ``to`` (its value -> settings to set), and its own
    ``help``, ``choices``, ``default`` or ``action``. ``file`` makes the flag name a YAML file
    holding the setting's value (under the setting's name, or at the top).
    """

    name: str  # --listen
    key: str  # server.listen
    metavar: str | None = None
    help: str = ""
    scale: float = 1.0  # the setting is the flag's value times this (--linger-ms sets relay.linger_s)
    split: bool = False  # a repeatable flag whose values may also be comma-separated
    to: Callable[[Any], Mapping[str, Any]] | None = None
    choices: tuple[str, ...] = ()
    default: Any = UNSET
    action: str = ""
    file: bool = False

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")

    def argparse_kwargs(self, schema: Schema) -> dict[str, Any]:
        """What ``ArgumentParser.add_argument(flag.name, **kwargs)`` needs."""
        leaf = schema.leaf(self.key)
        kw: dict[str, Any] = {"dest": self.dest}
        if self.metavar:
            kw["metavar"] = self.metavar
        action = self.action or (
            "store_true" if leaf.kind == "bool" else "append" if leaf.kind == "list" and not self.file else ""
        )
        if action:
            kw["action"] = action
        choices = self.choices or (leaf.choices if leaf.kind == "enum" else ())
        if choices:
            kw["choices"], kw["type"] = choices, str.lower
        elif not action and leaf.kind in ("int", "float"):
            kw["type"] = int if leaf.kind == "int" and self.scale == 1 else float
        if self.default is not UNSET:
            kw["default"] = self.default
        elif not action and not self.file and not leaf.required and leaf.default is not None:
            kw["default"] = _flag_value(leaf.default, self.scale)
        text = self.help or leaf.spec.doc
        shown = _shown_default(leaf, self)
        kw["help"] = (text + (f" (default: {shown})" if shown else "")).replace("%", "%%")
        return kw

    def overrides(self, schema: Schema, value: Any) -> dict[str, Override]:
        """The settings this flag sets from its parsed ``value``; ConfigError for a bad one."""
        leaf = schema.leaf(self.key)
        base: Path | None = None
        origin = self.name
        if self.file:
            path = Path(value)
            try:
                data = read_file(path)
            except ConfigError as exc:
                raise ConfigError([f"{self.name}: {line}" for line in exc.errors]) from exc
            value = data.get(leaf.name, data)
            origin, base = f"{self.name} {path}", path.parent
        if self.split and value is not None:
            value = [v for part in value for v in part.split(",") if v]
        if self.scale != 1 and value is not None:
            value = value * self.scale
        if leaf.nullable and value == "":
            value = None
        if self.to is None:
            return {self.key: Override(origin, value, base)}
        try:
            return {k: Override(origin, v) for k, v in self.to(value).items()}
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc


def _flag_value(default: Any, scale: float) -> Any:
    if isinstance(default, Path):
        return str(default)
    if scale != 1 and isinstance(default, int | float):
        return default / scale
    return default


def _shown_default(leaf: Leaf, flag: Flag) -> str:
    if flag.to is not None or flag.file or leaf.required or leaf.kind == "bool":
        return ""
    value = leaf.default
    if value is None or value in ("", [], {}):
        return ""
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    value = _flag_value(value, flag.scale)
    return f"{value:g}" if isinstance(value, float) else str(value)


def flag_overrides(
    schema: Schema, flags: Sequence[Flag], values: Mapping[str, Any], errors: list[str] | None = None
) -> dict[str, Override]:
    """The settings the given flags set (``values``: dest -> parsed value, given flags only).

    A bad flag value raises ConfigError, or with ``errors`` is added there, so that the
    settings can still be read and every problem reported at once.
    """
    out: dict[str, Override] = {}
    problems: list[str] = []
    for flag in flags:
        if flag.dest in values:
            try:
                out.update(flag.overrides(schema, values[flag.dest]))
            except ConfigError as exc:
                problems.extend(exc.errors)
    if problems and errors is None:
        raise ConfigError(problems)
    (errors if errors is not None else []).extend(problems)
    return out
