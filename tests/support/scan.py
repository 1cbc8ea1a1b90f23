"""Running `starpulse scan` on a fixture and reading its verdict by rule."""

from __future__ import annotations

import json
import subprocess
import sys

STARPULSE = [sys.executable, "-m", "starpulse.app.cli"]


def scan(*args: str, timeout: float = 60) -> tuple[int, dict, str]:
    out = subprocess.run(
        [*STARPULSE, "scan", "--json", "--window", "0.2", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    data = json.loads(out.stdout) if out.stdout.strip() else {}
    return out.returncode, data, out.stderr


def by_rule(data: dict) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for c in data["verdict"]["conditions"]:
        out.setdefault(c["rule"], set()).add(c["component"])
    return out
