"""One localisation of the probe window the detection shards hold: the two rounds over the shard wire.

Why: with shards, each shard sums its own nodes' probe results (controller.detect.probe_sums),
so the controller's event loop no longer touches every result (~14,000 a second at 10,000
nodes). A localisation asks every shard for its snapshot (per component), merges them and,
only when the vote's first round has a suspect, asks for the detail of the keys through the
components that can still be blamed; the shards hold their windows between the two
questions. Merging and voting run in a worker thread, so the loop goes on deciding reports
meanwhile (they share the GIL, but the loop is never stopped for the whole localisation).
"""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import structlog

from controller.detect.probe_sums import KeyRecord, SumsSnapshot
from controller.detect.probes import Blame, ProbeLocaliser
from controller.detect.shard_worker import OP_PROBE_FABRIC, OP_PROBE_KEYS, OP_PROBE_RELEASE, OP_PROBE_SNAPSHOT
from controller.detect.shards import DetectShards
from controller.fabric.model import Fabric

log = structlog.get_logger(__name__)


class ShardWindowMissing(Exception):
    """A shard answered a snapshot without a window (its settings lack the probe mesh, or it failed)."""


def send_fabric(shards: DetectShards, fabric: Fabric) -> None:
    """The wiring changed (learned from LLDP): every shard works its keys' paths out again on this copy."""
    shards.tell((OP_PROBE_FABRIC, fabric))


async def localise_in_shards(loc: ProbeLocaliser, shards: DetectShards) -> list[Blame]:
    """The blames for the window the shards hold (``loc`` keeps no window of its own)."""
    blobs: list[bytes | None] = await shards.ask((OP_PROBE_SNAPSHOT, loc.request()))
    released = False
    try:
        snaps: list[SumsSnapshot] = await asyncio.to_thread(_unpickled, blobs)
        question = await asyncio.to_thread(loc.merge, snaps)
        records: list[KeyRecord] = []
        sample: list[float] = []
        if question is not None:
            answers = await shards.ask((OP_PROBE_KEYS, question.comps, question.every))
            shards.tell((OP_PROBE_RELEASE,))
            released = True
            parts: list[tuple[list[KeyRecord], list[float]]] = await asyncio.to_thread(_unpickled, answers)
            for part, some in parts:
                records += part
                sample += some
        else:
            shards.tell((OP_PROBE_RELEASE,))
            released = True
        return await asyncio.to_thread(loc.conclude, records, sample)
    finally:
        if not released:
            shards.tell((OP_PROBE_RELEASE,))


def _unpickled(blobs: list[bytes | None]) -> list[Any]:
    """The shards' answers (pickled apart by the shard: unpickled here, in a worker thread)."""
    if any(b is None for b in blobs):
        raise ShardWindowMissing("a detection shard had no probe window to answer from")
    return [pickle.loads(b) for b in blobs if b is not None]
