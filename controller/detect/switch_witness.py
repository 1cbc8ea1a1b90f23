"""What each switch's own agent last said about its ports: the leaf's side of a host link.

Several nodes of one leaf losing a link together usually means the leaf; but when the leaf's
own agent (the SONiC switch agent) reports the very ports those nodes hang on up and clean, in
a report the controller took after the nodes' conditions began, the fault is not the leaf's:
the nodes' NICs stay NIC incidents (controller.detect.fabric_grouping asks ``clean_since``).

A port is clean in a report when it is operationally and administratively up, its PFC
watchdog has no stormed queue, and none of its error counters rose since the switch's
previous report of it: a port seen once is up but not yet known clean. Times are the
controller's clock when the report was decided (``now_ms``), the clock the conditions'
``first_seen_ms`` are on; a report is decided within milliseconds of being sampled, so
"decided after the fault" is "sampled after the fault" to that margin. Only the latest report
of a port counts: a port clean a moment ago and down now is down.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from starpulse.v1 import telemetry_pb2 as tpb

# Counters that rise only when frames are lost or damaged on the port (SONiC's COUNTERS_DB names).
ERROR_COUNTERS = (
    "SAI_PORT_STAT_IF_IN_ERRORS",
    "SAI_PORT_STAT_IF_OUT_ERRORS",
    "SAI_PORT_STAT_IF_IN_FEC_NOT_CORRECTABLE_FRAMES",
    "SAI_PORT_STAT_DOT3_STATS_FCS_ERRORS",
)


@dataclass(slots=True)
class _Port:
    seen_ms: int  # when the latest report of the port was decided
    clean: bool  # what that report said
    errors: tuple[int, ...]  # its error counters, to compare the next report with


class SwitchPortWitness:
    """Per switch and port, the latest report's verdict: up and clean, or not."""

    def __init__(self) -> None:
        self._ports: dict[str, dict[str, _Port]] = {}  # switch -> port -> latest

    def saw(self, switch: str, ports: Iterable[tpb.SwitchPortSample], now_ms: int) -> None:
        """A switch's report, decided at ``now_ms``."""
        known = self._ports.setdefault(switch, {})
        for p in ports:
            errors = tuple(p.counters.get(name, 0) for name in ERROR_COUNTERS)
            before = known.get(p.port)
            steady = before is not None and all(a <= b for a, b in zip(errors, before.errors, strict=True))
            up = p.oper_status == "up" and p.admin_status == "up"
            clean = up and steady and "stormed" not in p.pfc_wd_status
            known[p.port] = _Port(now_ms, clean, errors)

    def clean_since(self, switch: str, port: str, since_ms: int) -> bool:
        """True when the switch's latest report of ``port``, decided at or after ``since_ms``, says it is clean."""
        seen = self._ports.get(switch, {}).get(port)
        return seen is not None and seen.clean and seen.seen_ms >= since_ms

    def forget(self, switch: str) -> None:
        self._ports.pop(switch, None)
