"""The probe packet: a request and its reply share one layout, padded to the plan's size.

The reply carries the responder's own processing time (receive to send, in its clock), so
the prober takes it out of the round trip: what is left is the network's, and a slow host
shows as a large ``responder_us``, not as network delay. ``epoch`` is random per responder
start: a change tells the prober its peer restarted, so the probes it missed are not loss.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = b"SPRB"
REQUEST = 0
REPLY = 1
TRACE = 2  # a TTL-limited probe: it expires at a switch; a responder it reaches ignores it
_LAYOUT = struct.Struct("!4sBIQQI")  # magic, kind, seq, sent_ns (prober's clock), processing_ns, epoch
HEADER = _LAYOUT.size
# The hot path packs and reads the header in place (no bytes made per packet): a request's
# seq and sent time at SEQ_AT, a reply's kind at KIND_AT and processing time and epoch at TAIL_AT.
KIND_AT, SEQ_AT, TAIL_AT = 4, 5, 17
unpack_header = _LAYOUT.unpack_from  # (buffer) -> (magic, kind, seq, sent_ns, processing_ns, epoch)
_SEQ_SENT = struct.Struct("!IQ")
_KIND = struct.Struct("!B")
_TAIL = struct.Struct("!QI")


def template(size: int) -> bytearray:
    """A request of ``size`` bytes to stamp and send again and again (``stamp_request``)."""
    return bytearray(encode(Probe(REQUEST, 0, 0), size))


def stamp_request(buf: bytearray, seq: int, sent_ns: int) -> None:
    """Set a template's seq and sent time."""
    _SEQ_SENT.pack_into(buf, SEQ_AT, seq, sent_ns)


def turn_into_reply(buf: bytearray | memoryview, processing_ns: int, epoch: int) -> None:
    """Make the request in ``buf`` its reply in place (what ``reply_to`` returns, without copies)."""
    _KIND.pack_into(buf, KIND_AT, REPLY)
    _TAIL.pack_into(buf, TAIL_AT, processing_ns, epoch)


@dataclass(frozen=True, slots=True)
class Probe:
    kind: int
    seq: int
    sent_ns: int
    processing_ns: int = 0
    epoch: int = 0


def encode(probe: Probe, size: int) -> bytes:
    """The probe padded with zeros to ``size`` bytes (at least its header)."""
    head = _LAYOUT.pack(MAGIC, probe.kind, probe.seq, probe.sent_ns, probe.processing_ns, probe.epoch)
    return head + bytes(max(0, size - HEADER))


def decode(data: bytes) -> Probe | None:
    """A probe, or None for anything else that reached the port."""
    if len(data) < HEADER or data[:4] != MAGIC:
        return None
    _, kind, seq, sent_ns, processing_ns, epoch = _LAYOUT.unpack_from(data)
    if kind not in (REQUEST, REPLY):
        return None
    return Probe(kind, seq, sent_ns, processing_ns, epoch)


def reply_to(data: bytes, processing_ns: int, epoch: int) -> bytes:
    """The reply to a request: the same bytes (size, seq, sent time) with kind, processing time and epoch set."""
    _, _, seq, sent_ns, _, _ = _LAYOUT.unpack_from(data)
    return _LAYOUT.pack(MAGIC, REPLY, seq, sent_ns, processing_ns, epoch) + data[HEADER:]


def trace_seq(data: bytes) -> int | None:
    """The seq of a trace probe (as an ICMP error quotes it back), None for anything else."""
    if len(data) < HEADER or data[:4] != MAGIC:
        return None
    _, kind, seq, _, _, _ = _LAYOUT.unpack_from(data)
    return int(seq) if kind == TRACE else None
