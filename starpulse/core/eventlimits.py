"""How large an event may be: one definition for the agent's buffer and the controller's ingest.

The controller refuses an event past these limits (INVALID_ARGUMENT), and an agent resends
what was not acked after every reconnect: an event the agent produced past them would end
its stream again and again, and the node would be silenced by its own kernel log. So the
agent fits every event to the same limits before it buffers it (``fit_event``: text cut,
attributes past the count dropped), and the controller checks them (``event_problem``).
Sequence numbers must also fit SQLite's signed 64-bit integer, where they are stored.
"""

from __future__ import annotations

from typing import Final

from starpulse.v1 import telemetry_pb2 as tpb

MAX_COMPONENT: Final = 256  # characters
MAX_MESSAGE: Final = 4096  # characters
MAX_ATTRIBUTES: Final = 64
MAX_ATTRIBUTE_KEY: Final = 128  # characters
MAX_ATTRIBUTE_VALUE: Final = 1024  # characters
MAX_EVENT_BYTES: Final = 16 * 1024  # the whole event, serialised
SQLITE_INT_MAX: Final = 2**63 - 1  # sequence numbers are stored as SQLite INTEGER
CUT_MARK: Final = "…"


def event_problem(event: tpb.Event) -> str | None:
    """Why the controller refuses ``event`` (None: within every limit). Cheap: one size read first."""
    if event.seq > SQLITE_INT_MAX:
        return f"event seq {event.seq} is past the largest storable ({SQLITE_INT_MAX})"
    if len(event.component) > MAX_COMPONENT:
        return f"event {event.seq} component is {len(event.component)} characters (max {MAX_COMPONENT})"
    if len(event.message) > MAX_MESSAGE:
        return f"event {event.seq} message is {len(event.message)} characters (max {MAX_MESSAGE})"
    attributes = event.attributes
    if len(attributes) > MAX_ATTRIBUTES:
        return f"event {event.seq} has {len(attributes)} attributes (max {MAX_ATTRIBUTES})"
    for key, value in attributes.items():
        if len(key) > MAX_ATTRIBUTE_KEY:
            return f"event {event.seq} attribute key {key[:32]!r}… is {len(key)} characters (max {MAX_ATTRIBUTE_KEY})"
        if len(value) > MAX_ATTRIBUTE_VALUE:
            return f"event {event.seq} attribute {key!r} is {len(value)} characters (max {MAX_ATTRIBUTE_VALUE})"
    size = event.ByteSize()
    if size > MAX_EVENT_BYTES:
        return f"event {event.seq} is {size} bytes (max {MAX_EVENT_BYTES})"
    return None


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - len(CUT_MARK)] + CUT_MARK


def fit_event(event: tpb.Event) -> list[str]:
    """Fit ``event`` to the limits in place; returns what was cut (empty: nothing), for a log line.

    Text is cut with a mark; attributes past the count, or with an over-long key, are dropped
    (in key order, so the same event is always cut the same way); if it is still too large,
    the message and then the attributes give way.
    """
    cuts: list[str] = []
    if len(event.component) > MAX_COMPONENT:
        event.component = _cut(event.component, MAX_COMPONENT)
        cuts.append("component")
    if len(event.message) > MAX_MESSAGE:
        event.message = _cut(event.message, MAX_MESSAGE)
        cuts.append("message")
    attributes = event.attributes
    for key in sorted(attributes):
        if len(key) > MAX_ATTRIBUTE_KEY:
            del attributes[key]
            cuts.append(f"attribute key {key[:32]!r}")
        elif len(attributes[key]) > MAX_ATTRIBUTE_VALUE:
            attributes[key] = _cut(attributes[key], MAX_ATTRIBUTE_VALUE)
            cuts.append(f"attribute {key!r}")
    if len(attributes) > MAX_ATTRIBUTES:
        for key in sorted(attributes)[MAX_ATTRIBUTES:]:
            del attributes[key]
        cuts.append(f"attributes past {MAX_ATTRIBUTES}")
    if event.ByteSize() > MAX_EVENT_BYTES:
        event.message = _cut(event.message, 512)
        cuts.append("message (event size)")
        while event.ByteSize() > MAX_EVENT_BYTES and attributes:
            del attributes[sorted(attributes)[-1]]
        cuts.append("attributes (event size)")
    return cuts
