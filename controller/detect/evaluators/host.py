"""Host rule kinds: a filesystem or the memory running out."""

from __future__ import annotations

from typing import Any

from controller.detect.evaluators.base import Derived, HostEvaluator, Owned
from controller.detect.evaluators.params import Param, list_of, quantity, text
from controller.detect.model import Defaults
from starpulse.v1 import telemetry_pb2 as tpb

_SPACE = quantity("percent", "bytes", positive=True)


def _below_100(params: dict[str, Any], key: str, where: str, errors: list[str]) -> Derived:
    limit = params[key]
    if limit.dimension == "percent" and limit.value >= 100:
        errors.append(f"{where}: {key!r}: {limit.text!r} must be below 100%")
    return Derived()


class HostDisk(HostEvaluator):
    """A mount with less free space than min_free."""

    kind = "host_disk"
    params = {"min_free": Param(_SPACE, required=True), "ignore_mounts": Param(list_of(text), default=())}

    @classmethod
    def prepare(cls, params: dict[str, Any], defaults: Defaults, where: str, errors: list[str]) -> Derived:
        return _below_100(params, "min_free", where, errors)

    def host(self, nid: str, h: tpb.HostSample, now: int, owned: Owned) -> None:
        for rule in self.rules:
            limit = rule.params["min_free"]
            ignore = rule.params["ignore_mounts"]
            worst: tuple[float, tpb.DiskUsage, float] | None = None
            for d in h.disks:
                if not d.total_bytes or d.mount in ignore:
                    continue
                free = max(d.total_bytes - d.used_bytes, 0)
                pct = 100.0 * free / d.total_bytes
                measure = pct if limit.dimension == "percent" else float(free)
                if measure < limit.value and (worst is None or measure < worst[0]):
                    worst = (measure, d, pct)
            if worst is not None:
                _, d, pct = worst
                free = max(d.total_bytes - d.used_bytes, 0)
                self.bad_on(
                    nid,
                    rule,
                    nid,
                    "node",
                    f"{nid}: {d.mount} has {pct:.1f}% free (minimum {limit.text})",
                    {
                        "mount": d.mount,
                        "free_bytes": free,
                        "total_bytes": d.total_bytes,
                        "free_pct": round(pct, 2),
                        "threshold": limit.text,
                    },
                    now,
                )
            elif owned and h.disks:
                self.judge.good(owned, rule, nid, now)


class HostMemory(HostEvaluator):
    """Less available memory than min_available."""

    kind = "host_memory"
    params = {"min_available": Param(_SPACE, required=True)}

    @classmethod
    def prepare(cls, params: dict[str, Any], defaults: Defaults, where: str, errors: list[str]) -> Derived:
        return _below_100(params, "min_available", where, errors)

    def host(self, nid: str, h: tpb.HostSample, now: int, owned: Owned) -> None:
        if not h.memory_total_bytes:
            return  # not read: neither bad nor good
        pct = 100.0 * h.memory_available_bytes / h.memory_total_bytes
        for rule in self.rules:
            limit = rule.params["min_available"]
            measure = pct if limit.dimension == "percent" else float(h.memory_available_bytes)
            if measure < limit.value:
                self.bad_on(
                    nid,
                    rule,
                    nid,
                    "node",
                    f"{nid}: {pct:.1f}% of memory available (minimum {limit.text})",
                    {
                        "available_bytes": h.memory_available_bytes,
                        "total_bytes": h.memory_total_bytes,
                        "available_pct": round(pct, 2),
                        "threshold": limit.text,
                    },
                    now,
                )
            elif owned:
                self.judge.good(owned, rule, nid, now)
