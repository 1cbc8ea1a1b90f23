"""What every starpulse gRPC client does alike: channel options, reconnect backoff, and
following a standby controller's hint to the leader.

The agent's link and the relay's upstream are both clients of the controller; neither owns
this, so it lives on the shared floor.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import grpc
import structlog

log = structlog.get_logger(__name__)

# A standby controller refuses the stream with FAILED_PRECONDITION and names the leader here.
LEADER_METADATA_KEY = "starpulse-leader"

CLIENT_CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_send_message_length", 4 * 1024 * 1024),
    ("grpc.max_receive_message_length", 4 * 1024 * 1024),
]


def follow_leader_hint(targets: list[str], target: str, err: grpc.aio.AioRpcError) -> int | None:
    """Where to go after a standby's refusal: the index of the leader it named in ``targets``
    (appended when new), or None when it named none, or named the one just tried."""
    leader = ""
    for key, value in err.trailing_metadata() or ():
        if key == LEADER_METADATA_KEY:
            leader = value if isinstance(value, str) else value.decode()
    if not leader or leader == target:
        return None
    if leader not in targets:
        log.warning("controller_leader_not_configured", leader=leader, configured=list(targets))
        targets.append(leader)
    return targets.index(leader)


@dataclass
class Backoff:
    """Exponential backoff with full jitter, so 10,000 agents do not reconnect in step."""

    initial_s: float = 0.5
    max_s: float = 30.0
    multiplier: float = 2.0
    attempt: int = 0

    def next_delay(self, rng: random.Random) -> float:
        ceiling = min(self.max_s, self.initial_s * (self.multiplier**self.attempt))
        self.attempt += 1
        return rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempt = 0
