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


@dataclass(frozen=True)
class Mix:
    source: str
    days: float
    gpus: int
    causes: tuple[Cause, ...]
    planned: int  # planned interruptions over the same days and GPUs (restart only)

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
        str(raw.get("source", where.name)), days, int(gpus), causes, int(_number(where, "planned.count", count, 0))
    )


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
    return Cause(
        name=str(raw["name"]),
        cause=str(raw.get("cause", "other")),
        count=int(_number(where, f"{key}.count", raw.get("count"), 0)),
        rule=rule,
        component=component if rule is not None else None,
        repair_s=_number(where, f"{key}.repair_h", raw.get("repair_h"), 0) * 3600.0,
        repair_source=str(raw["repair_source"]),
    )
