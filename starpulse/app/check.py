"""`starpulse check FILE...`: every data file the project takes, read by its own reader, every error.

The kinds: the services' settings (controller, agent, relay: ``starpulse.app.config``), alert
receivers (notify), detection rules, the healing policy (with its repair ladder), the declared
fabric and scenario files. Each kind's reader collects all of a file's problems before it
refuses it, one line each naming the file, the key and what was expected; this module only
finds the kind (by the file's top-level keys unless told) and runs that reader.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from starpulse.core.schema import ConfigError, read_file

KINDS = ("controller", "agent", "relay", "notify", "rules", "policy", "fabric", "scenario")

_NOTIFY_KEYS = {"receivers", "external_url", "poll_interval_s", "batch_size", "concurrency", "retention_s"}


def detect_kind(path: str | Path, data: dict[str, Any]) -> str:
    """Which reader a file is for, from its top-level keys (a service file by its sections)."""
    from starpulse.app.config import guess_kind

    keys = set(data)
    if "kinds" in keys and "version" in keys:
        return "policy"
    if "rules" in keys and ("defaults" in keys or "version" in keys):
        return "rules"
    if "faults" in keys or ("name" in keys and isinstance(data.get("fabric"), dict) and "nodes" in data["fabric"]):
        return "scenario"
    if keys & {"vertices", "links"} or isinstance(data.get("nodes"), list):
        return "fabric"
    if keys and keys <= _NOTIFY_KEYS:
        return "notify"
    return guess_kind(data, path)


def check(path: str | Path, kind: str | None = None) -> tuple[str, str]:
    """(kind, one-line summary) of a valid file; ConfigError with every problem otherwise."""
    if kind is None:
        kind = detect_kind(path, read_file(path))
    return kind, _CHECKERS[kind](Path(path))


def _service(kind: str) -> Callable[[Path], str]:
    def run(path: Path) -> str:
        from starpulse.app.config import check_file

        return check_file(path, kind)

    return run


def _notify(path: Path) -> str:
    from controller.outputs.notify import parse_notify_config

    cfg = parse_notify_config(read_file(path), str(path), base_dir=path.parent)
    return f"{len(cfg.receivers)} receiver(s)"


def _rules(path: Path) -> str:
    from controller.detect.rules import load_rules

    return f"{len(load_rules(path).rules)} rule(s)"


def _policy(path: Path) -> str:
    from controller.heal.policy import load_policy

    return f"{len(load_policy(path).kinds)} incident kind(s)"


def _fabric(path: Path) -> str:
    from controller.fabric import load_fabric

    return ", ".join(f"{v} {k}" for k, v in load_fabric(path).summary().items())


def _scenario(path: Path) -> str:
    from starpulse.app.scenario.spec import load_scenario

    s = load_scenario(path)
    return f"scenario {s.name}: {s.fabric.nodes} nodes, {len(s.faults)} fault(s)"


_CHECKERS: dict[str, Callable[[Path], str]] = {
    "controller": _service("controller"),
    "agent": _service("agent"),
    "relay": _service("relay"),
    "notify": _notify,
    "rules": _rules,
    "policy": _policy,
    "fabric": _fabric,
    "scenario": _scenario,
}


def check_all(paths: list[str], kind: str | None = None) -> tuple[list[str], bool]:
    """The output lines for ``paths`` ('ok' lines and every error line) and whether all were valid."""
    lines: list[str] = []
    ok = True
    for path in paths:
        try:
            found, summary = check(path, kind)
        except ConfigError as exc:
            ok = False
            lines.extend(line if line.startswith(str(path)) else f"{path}: {line}" for line in exc.errors)
            continue
        lines.append(f"ok: {path} ({found}): {summary}")
    return lines, ok
