"""Quantities as operators write them: '10/s', '85C', '400Gb/s', '10m', '-10dBm'.

Rules, the healing policy and settings all take thresholds and durations in one notation,
read here into the dimension's canonical unit so that no file reader converts by hand.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class BadValue(ValueError):
    """One value's problem, without the file/rule/key context (the caller adds that)."""


_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_QUANTITY = re.compile(rf"^\s*({_NUM})\s*([^\s\d].*?)?\s*$")

# unit -> (dimension, factor to the canonical unit)
_UNITS: dict[str, tuple[str, float]] = {
    # time, canonical seconds
    "ms": ("time", 0.001),
    "s": ("time", 1.0),
    "sec": ("time", 1.0),
    "m": ("time", 60.0),
    "min": ("time", 60.0),
    "h": ("time", 3600.0),
    "d": ("time", 86400.0),
    # rate, canonical per second
    "/s": ("rate", 1.0),
    "/sec": ("rate", 1.0),
    "/m": ("rate", 1 / 60),
    "/min": ("rate", 1 / 60),
    "/h": ("rate", 1 / 3600),
    # count (a bare number)
    "": ("count", 1.0),
    # percent, canonical percent
    "%": ("percent", 1.0),
    # temperature, canonical Celsius
    "C": ("temperature", 1.0),
    "°C": ("temperature", 1.0),
    # optical power, canonical dBm
    "dBm": ("power_dbm", 1.0),
    # bytes
    "B": ("bytes", 1.0),
    "KB": ("bytes", 1e3),
    "MB": ("bytes", 1e6),
    "GB": ("bytes", 1e9),
    "TB": ("bytes", 1e12),
    "KiB": ("bytes", 2.0**10),
    "MiB": ("bytes", 2.0**20),
    "GiB": ("bytes", 2.0**30),
    "TiB": ("bytes", 2.0**40),
    # link bandwidth, canonical Gb/s
    "Mb/s": ("bandwidth", 0.001),
    "Mbps": ("bandwidth", 0.001),
    "Gb/s": ("bandwidth", 1.0),
    "Gbps": ("bandwidth", 1.0),
    "Tb/s": ("bandwidth", 1000.0),
}

_EXAMPLES = {
    "time": "a duration like '60s', '10m', '500ms'",
    "rate": "a rate like '10/s' or '5/min'",
    "count": "a count like '3'",
    "percent": "a percentage like '5%'",
    "temperature": "a temperature like '85C'",
    "power_dbm": "an optical power like '-10dBm'",
    "bytes": "a size like '10GiB'",
    "bandwidth": "a bandwidth like '400Gb/s'",
}


@dataclass(frozen=True, slots=True)
class Quantity:
    """A parsed threshold: value in the dimension's canonical unit (s, /s, %, C, dBm, B, Gb/s)."""

    value: float
    dimension: str
    text: str  # as written, for messages and evidence

    @property
    def unit(self) -> str:
        return _CANONICAL[self.dimension]


_CANONICAL = {
    "time": "s",
    "rate": "/s",
    "count": "",
    "percent": "%",
    "temperature": "C",
    "power_dbm": "dBm",
    "bytes": "B",
    "bandwidth": "Gb/s",
}


def parse_quantity(raw: Any, dimensions: tuple[str, ...]) -> Quantity:
    """Parse '10/s', 3, or {value: 10, unit: '/s'} into one of ``dimensions``; BadValue otherwise."""
    expected = " or ".join(_EXAMPLES[d] for d in dimensions)
    if isinstance(raw, Mapping):
        extra = set(raw) - {"value", "unit"}
        if extra or "value" not in raw:
            got = sorted(raw)
            raise BadValue(f"a quantity mapping needs exactly 'value' and 'unit', got {got} (expected {expected})")
        value, unit = raw["value"], str(raw.get("unit", "") or "")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BadValue(f"'value' must be a number, got {value!r} (expected {expected})")
        text = f"{value}{unit}"
    elif isinstance(raw, bool):
        raise BadValue(f"expected {expected}, got {raw!r}")
    elif isinstance(raw, int | float):
        value, unit, text = raw, "", str(raw)
    elif isinstance(raw, str):
        m = _QUANTITY.match(raw)
        if m is None:
            raise BadValue(f"cannot read {raw!r} as a quantity (expected {expected})")
        value, unit, text = float(m.group(1)), (m.group(2) or ""), raw.strip()
    else:
        raise BadValue(f"expected {expected}, got {type(raw).__name__} {raw!r}")
    known = _UNITS.get(unit)
    if known is None:
        raise BadValue(f"bad unit {unit!r} in {text!r} (expected {expected})")
    dimension, factor = known
    if dimension not in dimensions:
        raise BadValue(f"{text!r} is a {dimension.replace('_dbm', '')}, expected {expected}")
    return Quantity(float(value) * factor, dimension, text)


def format_duration(seconds: float) -> str:
    """A span as a person reads it in a reason or a chip: '45 s', '12 min', '2 h 5 min', '3 d 4 h'.

    Messages used to print raw seconds ('within 3600s', 'last action 2017.5s ago'); an
    operator reading why the breaker opened should not have to divide by 60.
    """
    s = max(0.0, float(seconds))
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.0f} s"
    m = s / 60
    if m < 120:
        return f"{m:.0f} min"
    h, rest_m = divmod(round(m), 60)
    if h < 48:
        return f"{h} h" + (f" {rest_m} min" if rest_m else "")
    d, rest_h = divmod(h, 24)
    return f"{d} d" + (f" {rest_h} h" if rest_h else "")
