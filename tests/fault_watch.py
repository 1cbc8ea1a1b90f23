"""Helpers to exercise the fault table: parameters a kind accepts, and what simulated hardware shows.

A ``Watch`` looks at a node or a cluster on a healthy step first: its state (link state,
rates, NVML's view of each GPU, switch port tables, agents) and the pace at which every
counter grows. A fault shows when, a step after it, the state, the kernel log or a pace
differs. Counters keep what a fault did to them (a flap counted stays counted), so a
clear is complete when, a step later, the state is the healthy one again and every
counter grows at its healthy pace.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from typing import Any

from agent.collectors.sonic import APPL_DB, CONFIG_DB, COUNTERS_DB, STATE_DB
from agent.sim.fake_switch import FakeSwitch
from agent.sim.fault_kinds import REQUIRED, FaultKind, Param
from agent.sim.node import SimNode

View = dict[str, Any]
# Files that count (they only grow) rather than say a state.
_COUNTING_DIRS = ("counters", "hw_counters", "statistics", "ethtool")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def example(param: Param) -> float:
    """A value ``param`` accepts (its default, or its lowest allowed value when it has none)."""
    if param.default is not REQUIRED and param.default is not None:
        return param.default
    low = param.minimum + (1 if param.exclusive_minimum else 0)
    return int(low) if param.integer else float(param.maximum if param.maximum is not None else low)


def examples(kind: FaultKind, shape: str | None) -> dict[str, Any]:
    """Parameters for ``kind`` on a target of ``shape``: every required one given an allowed value."""
    return {p.name: example(p) for p in kind.params if p.applies_to(shape) and p.default is REQUIRED}


def node_view(sim: SimNode, prefix: str = "") -> View:
    """Every GPU as NVML (or its vendor's fake) holds it, every file of the sysfs tree, and the kernel log."""
    view: View = {f"{prefix}gpu-{i}": dataclasses.asdict(sim.nvml.gpu(i)) for i in range(sim.gpus)}
    if sim.amdsmi is not None:
        view |= {f"{prefix}amd-gpu-{g.index}": dataclasses.asdict(g) for g in sim.amdsmi.gpus}
    if sim.npu_smi is not None:
        view |= {f"{prefix}npu-{n.npu_id}": dataclasses.asdict(n) for n in sim.npu_smi.npus}
    root = sim.sysfs_root
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".tmp"]
        for name in files:
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8", errors="replace") as f:
                view[f"{prefix}sys/{os.path.relpath(path, root)}"] = f.read()
    with open(sim.kmsg_path, encoding="utf-8") as f:
        view[f"{prefix}kmsg"] = f.read()
    return view


def switch_view(switch: FakeSwitch, prefix: str = "") -> View:
    """Every hash the fake switch keeps in its Redis databases."""
    view: View = {}
    for db in (APPL_DB, CONFIG_DB, COUNTERS_DB, STATE_DB):
        client = switch._client(db)
        for key in sorted(client.keys("*")):
            view[f"{prefix}db{db}/{key!r}"] = client.hgetall(key)
    return view


def counting(key: str) -> bool:
    """Whether a view entry holds counters (compared by growth) rather than state (compared as is)."""
    parts = key.split("/")
    return f"db{COUNTERS_DB}" in parts or any(d in parts for d in _COUNTING_DIRS)


def numbers(value: Any) -> list[float]:
    return [float(n) for n in _NUMBER.findall(repr(value))]


def growth(before: View, after: View) -> dict[str, list[float]]:
    """Per counting entry, how much each number in it grew between two views."""
    return {
        k: [b - a for a, b in zip(numbers(before[k]), numbers(after[k]), strict=False)]
        for k in after
        if counting(k) and k in before
    }


def state_differences(now: View, then: View) -> list[str]:
    """State entries (not counters, not the kernel log: both keep history) where two views differ."""
    keys = now.keys() | then.keys()
    return sorted(k for k in keys if not counting(k) and not k.endswith("kmsg") and now.get(k) != then.get(k))


def growth_differences(now: dict[str, list[float]], then: dict[str, list[float]]) -> list[str]:
    """Counting entries that grew at another pace now than then.

    A counter's fractional growth is carried between steps, so one unit either way is the
    same pace; a fault still holding (a storm, a slowed link) differs by far more.
    """
    out = []
    for key in now.keys() | then.keys():
        a, b = now.get(key, []), then.get(key, [])
        if len(a) != len(b) or any(abs(x - y) > 1 + 0.01 * max(abs(x), abs(y)) for x, y in zip(a, b, strict=True)):
            out.append(key)
    return sorted(out)


class Watch:
    """Looks at one simulated node or cluster before, during and after a fault."""

    def __init__(self, look: Callable[[], View], step: Callable[[], None]) -> None:
        self.look = look
        self.step = step
        first = look()
        step()
        self.healthy = look()
        self.pace = growth(first, self.healthy)

    def shows(self) -> list[str]:
        """After a fault and one step: the state entries, kernel logs and counter paces it changed."""
        self.step()
        now = self.look()
        logs = [k for k in now if k.endswith("kmsg") and now[k] != self.healthy.get(k)]
        moved = growth_differences(growth(self.healthy, now), self.pace)
        return state_differences(now, self.healthy) + logs + moved

    def left_behind(self) -> list[str]:
        """After a clear: the state entries not healthy again and counters not back at their pace."""
        self.step()
        before = self.look()
        self.step()
        after = self.look()
        return state_differences(after, self.healthy) + growth_differences(growth(before, after), self.pace)
