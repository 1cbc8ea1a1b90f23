"""The fault mix: which faults happen how often, how the controller sees them, how long repair takes.

Read from a data file (the default: ``data/llama3_mix.yaml``, Llama 3's interruptions by
cause); every rate is an input, every repair time sourced or labelled an assumption there.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

COMPONENTS = ("gpu", "nic", "cable", "node")
# What puts a fault right, in the repair ladder's order (controller/heal/ladder.py's rungs, then
# the hardware repair after the ladder's end): a rung fixes every fault a lower one would.
FIXES = ("none", "reset_gpu", "reboot", "hardware")


class MixError(ValueError):
    """A mix file that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class Cause:
    """One row of the mix: ``rule`` None means no incident (the job fails by itself)."""

    name: str
    cause: str  # the report's bucket (controller.query.fleet.CAUSES)
    count: int
    rule: str | None
    component: str | None
    repair_s: float
    repair_source: str
    fixed_by: tuple[tuple[str, float], ...] = ()  # (FIXES entry, probability); (): the ladder's default
    fixed_by_source: str = ""


@dataclass(frozen=True)
class Ladder:
    """How the repair ladder's agent round trips go in the simulator (the mix's ``ladder:``).

    The rungs, their order per incident kind, their time limits and the validation's checks are
    the policy's (``--policy``); what is here is what the policy cannot say: how long an agent
    takes for each, and which rung puts each cause right. Every value names its source."""

    rung_s: dict[str, float]  # reset_gpu, reboot: how long the agent's round trip takes
    scan_s: float  # after a repair that worked: until the node's reports show its conditions resolved
    diagnostic_s: dict[str, float]  # a diagnostic's run time by name (absent: its policy limit)
    default_fixed_by: tuple[tuple[str, float], ...]
    sources: dict[str, str]


@dataclass(frozen=True)
class Mix:
    source: str
    days: float
    gpus: int
    causes: tuple[Cause, ...]
    planned: int  # planned interruptions over the same days and GPUs (restart only)
    ladder: Ladder | None = None  # None: a repair takes the cause's repair time, the ladder not played

    @property
    def unplanned(self) -> int:
        return sum(c.count for c in self.causes)

    def rate_per_gpu_day(self, planned: bool = False) -> float:
        """Faults (or planned interruptions) per GPU-day, the input rate."""
        return (self.planned if planned else self.unplanned) / (self.days * self.gpus)


def default_mix_path() -> Path:
    return Path(str(resources.files("starpulse.app.fleetsim") / "data" / "llama3_mix.yaml"))


def load_mix(path: str | Path | None = None) -> Mix:
    """The mix in ``path`` (None: the packaged Llama 3 mix); MixError names the file and key."""
    where = Path(path) if path is not None else default_mix_path()
    try:
        raw = yaml.safe_load(where.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise MixError(f"{where}: cannot read the fault mix: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("causes"), list) or not raw["causes"]:
        raise MixError(f"{where}: needs a non-empty 'causes' list")
    causes = tuple(_cause(where, i, c) for i, c in enumerate(raw["causes"]))
    days, gpus = _number(where, "days", raw.get("days")), _number(where, "gpus", raw.get("gpus"))
    planned = raw.get("planned") or {}
    count = planned.get("count", 0) if isinstance(planned, dict) else planned
    return Mix(
        str(raw.get("source", where.name)),
        days,
        int(gpus),
        causes,
        int(_number(where, "planned.count", count, 0)),
        _ladder(where, raw["ladder"]) if raw.get("ladder") is not None else None,
    )


def _sourced(where: Path, key: str, raw: Any) -> tuple[float, str]:
    """``{value: N, source: "..."}``: a duration in seconds and where it comes from."""
    if not isinstance(raw, dict) or not raw.get("source"):
        raise MixError(f"{where}: {key} must be a mapping with value and source (say where the number comes from)")
    return _number(where, f"{key}.value", raw.get("value"), 0), str(raw["source"])


def _fixed_by(where: Path, key: str, raw: Any) -> tuple[tuple[str, float], ...]:
    if not isinstance(raw, dict) or not raw:
        raise MixError(f"{where}: {key} must map what fixes the fault ({', '.join(FIXES)}) to a probability")
    out = []
    for fix, p in raw.items():
        if fix not in FIXES:
            raise MixError(f"{where}: {key}.{fix}: not one of {', '.join(FIXES)}")
        out.append((str(fix), _number(where, f"{key}.{fix}", p, 0)))
    if abs(sum(p for _, p in out) - 1.0) > 1e-6:
        raise MixError(
            f"{where}: {key}: the probabilities must add up to 1 (they add up to {sum(p for _, p in out):g})"
        )
    return tuple(out)


def _ladder(where: Path, raw: Any) -> Ladder:
    if not isinstance(raw, dict):
        raise MixError(f"{where}: ladder must be a mapping")
    sources: dict[str, str] = {}
    rung_s: dict[str, float] = {}
    for rung in ("reset_gpu", "reboot"):
        rung_s[rung], sources[rung] = _sourced(where, f"ladder.{rung}", raw.get(rung))
    scan_s, sources["scan"] = _sourced(where, "ladder.scan", raw.get("scan"))
    diagnostic_s: dict[str, float] = {}
    diags = raw.get("diagnostics") or {}
    if not isinstance(diags, dict):
        raise MixError(f"{where}: ladder.diagnostics must map a diagnostic's name to its run time")
    for name, value in diags.items():
        diagnostic_s[str(name)], sources[f"diagnostic:{name}"] = _sourced(where, f"ladder.diagnostics.{name}", value)
    if not raw.get("fixed_by_source"):
        raise MixError(f"{where}: ladder.fixed_by_source is required: say where the repair outcomes come from")
    sources["fixed_by"] = str(raw["fixed_by_source"])
    default = _fixed_by(where, "ladder.fixed_by", raw.get("fixed_by"))
    return Ladder(rung_s, scan_s, diagnostic_s, default, sources)


def _number(where: Path, key: str, value: Any, minimum: float = 1e-9) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise MixError(f"{where}: {key} must be a number >= {minimum:g}, got {value!r}")
    return float(value)


def _cause(where: Path, i: int, raw: Any) -> Cause:
    key = f"causes[{i}]"
    if not isinstance(raw, dict) or "name" not in raw:
        raise MixError(f"{where}: {key} must be a mapping with a name")
    rule = raw.get("rule")
    rule = None if rule in (None, "none") else str(rule)
    component = raw.get("component")
    if rule is not None and component not in COMPONENTS:
        raise MixError(f"{where}: {key}.component must be one of {', '.join(COMPONENTS)} (got {component!r})")
    if not raw.get("repair_source"):
        raise MixError(f"{where}: {key}.repair_source is required: say where the repair time comes from")
    if raw.get("fixed_by") is not None and not raw.get("fixed_by_source"):
        raise MixError(f"{where}: {key}.fixed_by_source is required: say where the repair outcomes come from")
    return Cause(
        name=str(raw["name"]),
        cause=str(raw.get("cause", "other")),
        count=int(_number(where, f"{key}.count", raw.get("count"), 0)),
        rule=rule,
        component=component if rule is not None else None,
        repair_s=_number(where, f"{key}.repair_h", raw.get("repair_h"), 0) * 3600.0,
        repair_source=str(raw["repair_source"]),
        fixed_by=_fixed_by(where, f"{key}.fixed_by", raw["fixed_by"]) if raw.get("fixed_by") is not None else (),
        fixed_by_source=str(raw.get("fixed_by_source", "")),
    )
