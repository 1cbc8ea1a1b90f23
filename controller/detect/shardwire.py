"""Frames between the controller and its detection shards: a 4-byte length, then a pickle.

The two ends are the same program at the same version (the controller spawns its shards
from its own interpreter), so pickle is safe here and carries ``ConditionChange`` objects
as they are. Nothing outside the controller's process tree ever reads or writes these.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import struct
from typing import Any

_HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 30


class ShardWireError(Exception):
    """A frame that cannot be a frame (the other end is not a shard, or it died mid-write)."""


def frame_parts(obj: Any) -> tuple[bytes, bytes]:
    """Header and body apart: a batch of reports is ~1 MB, not worth copying again to join them."""
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)), body


def encode_frame(obj: Any) -> bytes:
    """One frame as one bytes object (small frames: settings, a shard's answers)."""
    return b"".join(frame_parts(obj))


def _check(size: int) -> int:
    if size > MAX_FRAME:
        raise ShardWireError(f"frame of {size} bytes")
    return size


def read_frame_fd(fd: int) -> Any | None:
    """One frame from a blocking file descriptor; None at end of file (the other end closed)."""
    head = _read_exactly(fd, _HEADER.size)
    if head is None:
        return None
    (size,) = _HEADER.unpack(head)
    body = _read_exactly(fd, _check(size))
    if body is None:
        raise ShardWireError("end of file inside a frame")
    return pickle.loads(body)


def write_frame_fd(fd: int, obj: Any) -> None:
    view = memoryview(encode_frame(obj))
    while view:
        written = os.write(fd, view)
        view = view[written:]


async def read_frame(reader: asyncio.StreamReader) -> Any | None:
    """One frame from an asyncio stream; None at end of file."""
    try:
        head = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ShardWireError("end of file inside a frame header") from None
        return None
    (size,) = _HEADER.unpack(head)
    try:
        body = await reader.readexactly(_check(size))
    except asyncio.IncompleteReadError:
        raise ShardWireError("end of file inside a frame") from None
    return pickle.loads(body)


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks: list[bytes] = []
    left = size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            if left == size:
                return None
            raise ShardWireError("end of file inside a frame")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
