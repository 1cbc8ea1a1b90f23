"""A GPU's NVLinks as detection sees them, so that a delta report's absent links cost nothing.

A delta report (``agent.transport.delta``) carries in a GPU's ``nvlinks`` only the links
whose record differs from that GPU's link in the last full report on the stream; an absent
link is exactly as in that full report. So the engine keeps, per GPU, a ``Links`` built
from the last full report (one C-level read per link, and only when the links differ from
the previous full report's: ``links_key``), and a delta report's GPU is that ``Links``
itself when it carries no link (the healthy case: no link is read), or the ``Links`` with
the links it does carry laid over it (``overlay``). A full link list in a delta report (an
agent from before NVLink deltas) simply lays every link over it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, compress
from operator import itemgetter, not_
from typing import Any

_NUMBER = itemgetter(0)
_UP = itemgetter(1)
_COUNTERS = itemgetter(slice(2, None))
_MAX_LAYOUTS = 64  # distinct link numberings (a fleet has a handful); past it, positions are rebuilt per overlay

# link numbers -> (the shared tuple, link number -> position): the numbering of every GPU of a
# kind is the same, so ``numbers`` is one shared tuple, not one per GPU.
_layouts: dict[tuple[int, ...], tuple[tuple[int, ...], dict[int, int]]] = {}
_all_up: dict[int, tuple[bool, ...]] = {}


@dataclass(slots=True, frozen=True)
class Links:
    """One GPU's links: numbers, states and watched error counters, position by position."""

    key: bytes  # links_key of the full report's GPU; b"" for a view that is no full report's
    numbers: tuple[int, ...]  # link number at each position
    ups: tuple[bool, ...]
    down: tuple[int, ...]  # numbers of the links that are down, in position order
    values: tuple[int, ...]  # the watched counters, link by link (the rate names' order)
    width: int  # watched counters per link


def from_rows(key: bytes, rows: Sequence[tuple[Any, ...]], width: int) -> Links:
    """``rows``: (link, up, *watched counters) per link, in report order."""
    numbers = _layout(tuple(map(_NUMBER, rows)))[0]
    ups = tuple(map(_UP, rows))
    down = tuple(compress(numbers, map(not_, ups)))
    if not down and len(ups) <= _MAX_LAYOUTS:
        ups = _all_up.setdefault(len(ups), ups)  # one shared all-up tuple per link count
    values = tuple(chain.from_iterable(map(_COUNTERS, rows))) if width else ()
    return Links(key, numbers, ups, down, values, width)


def overlay(base: Links, rows: Sequence[tuple[Any, ...]]) -> Links | None:
    """``base`` with these links replaced by the rows of the same number; None when a row's
    link is not one of the base's (the link set changed: the rows are no delta of it)."""
    positions = _layout(base.numbers)[1]
    ups = list(base.ups)
    values = list(base.values)
    width = base.width
    for row in rows:
        pos = positions.get(row[0])
        if pos is None:
            return None
        ups[pos] = row[1]
        if width:
            values[pos * width : (pos + 1) * width] = row[2:]
    down = tuple(compress(base.numbers, map(not_, ups)))
    return Links(b"", base.numbers, tuple(ups), down, tuple(values), width)


def _layout(numbers: tuple[int, ...]) -> tuple[tuple[int, ...], dict[int, int]]:
    cached = _layouts.get(numbers)
    if cached is None:
        cached = (numbers, {n: pos for pos, n in enumerate(numbers)})
        if len(_layouts) < _MAX_LAYOUTS:
            _layouts[numbers] = cached
    return cached
