"""Rule parameters and their parsers: how a rules file's values become typed ones.

Every parser takes the value as YAML gave it and returns the typed value or raises
``BadValue`` with what was expected; the loader (controller.detect.rules) adds the file,
the rule and the key. An evaluator lists its parameters as ``Param``s, so a kind's
parameters are checked at load, never when a report arrives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starpulse.core import vocab
from starpulse.core.units import BadValue, Quantity, parse_quantity
from starpulse.v1 import telemetry_pb2 as tpb

# Event kinds by the name rules files use ("xid", "nic_link_down", ...).
EVENT_KINDS: dict[str, int] = {
    name.removeprefix("EVENT_KIND_").lower(): value
    for name, value in tpb.EventKind.items()
    if value != tpb.EVENT_KIND_UNSPECIFIED
}

# nvmlClocksEventReason* bits by NVML's name, as rules files write them.
CLOCK_REASON_BITS: dict[str, int] = {r.name: r.bit for r in vocab.CLOCK_EVENT_REASONS["nvidia"]}


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter of a rule kind: its parser, whether a rule must give it, its default."""

    parse: Callable[[Any], Any]
    required: bool = False
    default: Any = None


def quantity(*dimensions: str, positive: bool = False) -> Callable[[Any], Quantity]:
    def parse(raw: Any) -> Quantity:
        q = parse_quantity(raw, dimensions)
        if positive and q.value <= 0:
            raise BadValue(f"{q.text!r} must be greater than zero")
        return q

    return parse


def integer(minimum: int = 0) -> Callable[[Any], int]:
    def parse(raw: Any) -> int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise BadValue(f"expected an integer, got {raw!r}")
        if raw < minimum:
            raise BadValue(f"must be at least {minimum}, got {raw}")
        return raw

    return parse


def boolean(raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise BadValue(f"expected true or false, got {raw!r}")
    return raw


def text(raw: Any) -> str:
    if not isinstance(raw, str) or not raw:
        raise BadValue(f"expected a non-empty string, got {raw!r}")
    return raw


def one_of(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        if raw not in choices:
            raise BadValue(f"unknown value {raw!r} (expected one of {', '.join(choices)})")
        return str(raw)

    return parse


def list_of(item: Callable[[Any], Any], *, non_empty: bool = True) -> Callable[[Any], tuple[Any, ...]]:
    def parse(raw: Any) -> tuple[Any, ...]:
        if isinstance(raw, str | int):
            raw = [raw]
        if not isinstance(raw, list):
            raise BadValue(f"expected a list, got {raw!r}")
        if non_empty and not raw:
            raise BadValue("expected a non-empty list")
        return tuple(item(x) for x in raw)

    return parse


def event_kind(raw: Any) -> int:
    if raw not in EVENT_KINDS:
        raise BadValue(f"unknown event kind {raw!r} (expected one of {', '.join(EVENT_KINDS)})")
    return EVENT_KINDS[raw]


def clock_reason(raw: Any) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0:
        return raw
    if raw in CLOCK_REASON_BITS:
        return CLOCK_REASON_BITS[raw]
    known = ", ".join(CLOCK_REASON_BITS)
    raise BadValue(f"unknown clock event reason {raw!r} (expected a bit value or one of {known})")


# Shared by many kinds.
EVENTS = Param(list_of(event_kind))  # state rules: these events open the condition before a report confirms it
THRESHOLD = Param(quantity("rate", "count", positive=True), required=True)
WINDOW = Param(quantity("time", positive=True))
