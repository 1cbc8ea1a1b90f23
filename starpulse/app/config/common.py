"""What every service's settings share: the TLS and log sections, and reading them into a service's config."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from starpulse.core.names import InvalidName, validate_node_id
from starpulse.core.schema import Flag, Override, Reading, Schema, read_file, setting
from starpulse.core.tls import TLSSettings

T = TypeVar("T")
Overrides = Mapping[str, Override | tuple[str, object]]
_TLS_KEYS = ("ca_file", "cert_file", "key_file")


@dataclass
class TLSFiles:
    """Mutual TLS: all three files or none (none: plaintext)."""

    ca_file: Path | None = setting(
        None, "CA certificate (PEM) that signs every agent, relay and controller certificate"
    )
    cert_file: Path | None = setting(None, "This service's certificate (PEM); an agent's names its node id")
    key_file: Path | None = setting(None, "This service's private key (PEM)")


@dataclass
class LogSection:
    """Logs: JSON lines on stdout by default (journald keeps each as one entry)."""

    level: Literal["debug", "info", "warning", "error", "critical"] = setting("info", "Log threshold")
    format: Literal["json", "console"] = setting(
        "json", "json: one object a line (journald, log shippers); console: for people"
    )


TLS_FLAGS = (
    Flag("--tls-ca", "tls.ca_file", metavar="PEM", help="CA certificate (mutual TLS; with the two below)"),
    Flag("--tls-cert", "tls.cert_file", metavar="PEM", help="this side's certificate"),
    Flag("--tls-key", "tls.key_file", metavar="PEM", help="this side's private key"),
)
LOG_LEVEL_FLAG = Flag("--log-level", "log.level")


def read_settings(
    schema: Schema,
    path: str | Path | None,
    env: Mapping[str, str] | None,
    overrides: Overrides | None,
    flags: Mapping[str, str] | None,
    build: Callable[[Reading, Any], T | None],
) -> T:
    """One service's settings: its file (if any), the environment, then the flags, read and ``build`` into its config.

    ``env`` None reads os.environ; ``flags`` (key -> flag) name the running command's flags
    in messages. ConfigError lists every problem; ``build`` returns None only after recording one.
    """
    reading = Reading(
        schema,
        str(path) if path is not None else "",
        read_file(path) if path is not None else {},
        base_dir=Path(path).parent if path is not None else None,
        flags=flags,
    )
    reading.apply_env(os.environ if env is None else env)
    reading.apply_overrides(overrides or {})
    file = reading.read()
    built = build(reading, file) if file is not None else None
    reading.fail()
    assert built is not None
    return built


def tls_settings(reading: Reading, files: TLSFiles) -> TLSSettings | None:
    """The TLSSettings of a ``tls`` section: all three files or none."""
    given = {k: getattr(files, k) for k in _TLS_KEYS}
    missing = [k for k, v in given.items() if v is None]
    if len(missing) == len(_TLS_KEYS):
        return None
    if missing:
        flags = [reading.flags[f"tls.{k}"] for k in _TLS_KEYS if f"tls.{k}" in reading.flags]
        hint = f" ({', '.join(flags[:-1])} and {flags[-1]} go together)" if len(flags) > 1 else ""
        reading.err("tls", f"set all of ca_file, cert_file and key_file or none; missing {', '.join(missing)}{hint}")
        return None
    absent = [k for k, v in given.items() if not Path(v).is_file()]
    for k in absent:  # named by key (and flag) here; the files' contents are checked where they load
        reading.err(f"tls.{k}", f"file {str(given[k])!r} does not exist")
    if absent:
        return None
    return TLSSettings(given["ca_file"], given["cert_file"], given["key_file"])


PathKind = Literal["file", "folder", "input", "input-folder"]


def path_problem(path: Path, kind: PathKind) -> str | None:
    """Why ``path`` cannot be made or used as a ``kind`` ("file": one the program creates or
    opens, such as a database or a socket; "folder": one it creates; "input": one it reads,
    which must be there and not a folder; "input-folder": a folder it reads); None when it can.

    Read before anything is opened, so a parent that is a file (``--db /etc/hosts/c.db``)
    is one line naming the setting, never a traceback from deep inside SQLite or mkdir.
    """
    if path.exists():
        if kind in ("folder", "input-folder") and not path.is_dir():
            return f"{path} is a file, not a folder"
        if kind in ("file", "input") and path.is_dir():
            return f"{path} is a folder, not a file"
        return None
    above = path.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if above.exists() and not above.is_dir():
        return f"{above} is a file, so there is no {path}"
    if kind == "input":
        return f"no such file {path}"
    if kind == "input-folder":
        return f"no such folder {path}"
    return None


def check_path(reading: Reading, key: str, path: str | Path | None, kind: PathKind) -> None:
    """One error naming ``key`` (and its flag) when ``path`` cannot be a ``kind`` (``path_problem``)."""
    if path is None or str(path) == "" or str(path) == ":memory:":
        return
    problem = path_problem(Path(path), kind)
    if problem is not None:
        reading.err(key, problem)


def check_node_id(reading: Reading, key: str, node: str) -> None:
    try:
        validate_node_id(node)
    except InvalidName as exc:
        reading.err(key, str(exc))
