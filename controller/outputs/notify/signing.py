"""HMAC-SHA256 signatures on webhook deliveries, so a receiver can tell ours from forgeries
and refuse replays.

The signature covers ``f"{timestamp}."`` followed by the exact body bytes; the timestamp
(unix seconds) travels in its own header. A receiver recomputes the HMAC with the shared
secret, compares in constant time, and refuses timestamps more than ``tolerance_s`` away
from its clock: a captured request cannot be replayed later, and the body cannot be
moved under another timestamp. Within the window, ``X-Starpulse-Delivery`` (the same on
every retry of one notification) lets the receiver drop duplicates and replays alike.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

TIMESTAMP_HEADER = "X-Starpulse-Timestamp"
SIGNATURE_HEADER = "X-Starpulse-Signature"
DELIVERY_HEADER = "X-Starpulse-Delivery"
SCHEME = "sha256="
DEFAULT_TOLERANCE_S = 300


def _key(secret: str | bytes) -> bytes:
    return secret.encode() if isinstance(secret, str) else secret


def sign(secret: str | bytes, timestamp: int, body: bytes) -> str:
    """``sha256=<hex>`` of HMAC-SHA256(secret, f"{timestamp}." + body)."""
    mac = hmac.new(_key(secret), f"{int(timestamp)}.".encode() + body, hashlib.sha256)
    return SCHEME + mac.hexdigest()


def signed_headers(secret: str | bytes | None, timestamp: int, body: bytes, delivery_id: str) -> dict[str, str]:
    """Headers for one attempt: delivery id always; timestamp and signature when a secret is set."""
    headers = {DELIVERY_HEADER: delivery_id}
    if secret:
        headers[TIMESTAMP_HEADER] = str(int(timestamp))
        headers[SIGNATURE_HEADER] = sign(secret, timestamp, body)
    return headers


def _get(headers: Mapping[str, str], name: str) -> str | None:
    """Case-insensitive header lookup that works on plain dicts as well as multidicts."""
    value = headers.get(name)
    if value is not None:
        return value
    low = name.lower()
    return next((v for k, v in headers.items() if k.lower() == low), None)


def verify(
    secret: str | bytes,
    headers: Mapping[str, str],
    body: bytes,
    now: float,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> bool:
    """True only for a correct signature whose timestamp is within ``tolerance_s`` of ``now`` (either way)."""
    ts_text = _get(headers, TIMESTAMP_HEADER)
    sig = _get(headers, SIGNATURE_HEADER)
    if not ts_text or not sig or not sig.startswith(SCHEME):
        return False
    try:
        ts = int(ts_text)
    except ValueError:
        return False
    if abs(now - ts) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, ts, body).encode(), sig.strip().encode())
