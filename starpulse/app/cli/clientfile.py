"""The client commands' own settings file: which controller to ask, and with which credentials.

``$STARPULSE_CLIENT_CONFIG``, else ``$XDG_CONFIG_HOME/starpulse/client.toml`` (``~/.config/...``
without it), like kubectl's kubeconfig: an operator who always asks the same controller writes
it once. TOML, every key optional::

    controller = "ctl-1.example:50051"
    tls_ca = "/etc/starpulse/tls/ca.pem"        # the three TLS files go together
    tls_cert = "~/.config/starpulse/admin.pem"
    tls_key = "~/.config/starpulse/admin.key"
    admin_token_file = "~/.config/starpulse/admin.token"

Precedence, highest first: the flag, the environment (``$STARPULSE_CONTROLLER``,
``$STARPULSE_ADMIN_TOKEN``), this file, the built-in default. Relative paths are relative to
the file. A file that does not parse, or names an unknown key, is one line naming it.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

CLIENT_CONFIG_ENV = "STARPULSE_CLIENT_CONFIG"
KEYS = ("controller", "tls_ca", "tls_cert", "tls_key", "admin_token_file")
PATH_KEYS = frozenset({"tls_ca", "tls_cert", "tls_key", "admin_token_file"})


@dataclass(frozen=True)
class ClientFile:
    """What the file says (empty when there is none), or why it cannot be used (``error``)."""

    path: Path
    values: Mapping[str, str]
    error: str | None = None


def default_path(env: Mapping[str, str] | None = None) -> Path:
    """Where the file is looked for: $STARPULSE_CLIENT_CONFIG, else the XDG config folder."""
    env = os.environ if env is None else env
    if env.get(CLIENT_CONFIG_ENV):
        return Path(env[CLIENT_CONFIG_ENV]).expanduser()
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path("~/.config").expanduser()
    return base / "starpulse" / "client.toml"


def load(env: Mapping[str, str] | None = None) -> ClientFile:
    """The client file of this environment (a few lines, read where the parser is built)."""
    env = os.environ if env is None else env
    return _load(default_path(env), bool(env.get(CLIENT_CONFIG_ENV)))


def _load(path: Path, named: bool) -> ClientFile:
    if not path.exists():
        error = f"{path}: no such file (named by ${CLIENT_CONFIG_ENV})" if named else None
        return ClientFile(path, {}, error)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        return ClientFile(path, {}, f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}")
    except tomllib.TOMLDecodeError as exc:
        return ClientFile(path, {}, f"{path}: not valid TOML: {exc}")
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        return ClientFile(path, {}, f"{path}: unknown key {unknown[0]!r} (known: {', '.join(KEYS)})")
    values: dict[str, str] = {}
    for key, value in raw.items():
        if not isinstance(value, str) or not value.strip():
            return ClientFile(path, {}, f"{path}: {key}: must be a non-empty string, got {value!r}")
        text = value.strip()
        if key in PATH_KEYS:
            p = Path(text).expanduser()
            text = str(p if p.is_absolute() else path.parent / p)
        values[key] = text
    return ClientFile(path, values)
