"""What every starpulse gRPC client does alike: channel options, the reconnect loop with its
backoff, and which failure moves on to the next controller.

The agent's link and the relay's upstream are both clients of the controller; neither owns
this, so it lives on the shared floor, and both reconnect by the one rule in ``after_failure``.
"""

from __future__ import annotations

import asyncio
import enum
import random
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import structlog

from starpulse.core.clock import Clock

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


class NotAccepted(ConnectionError):
    """The target closed the stream before accepting it (no Welcome, no relay accept)."""


class Move(enum.Enum):
    """Where a client goes after a stream failed (see ``after_failure``)."""

    SAME = "same"  # the same controller again, after the backoff
    NEXT = "next"  # the next controller in the list, after the backoff
    LEADER = "leader"  # the leader a standby named (the next one when it named none), backoff restarted


# The controller is not serving at this address (down, unreachable, shutting down, a relay with
# no controller behind it, a crashed handler, no answer in time, not this service at all):
# another controller may be.
FAIL_OVER_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


def after_failure(exc: BaseException) -> Move:
    """The one reconnect rule of every starpulse client, by how the stream ended.

    - FAILED_PRECONDITION: a standby refused and names the leader: ``LEADER``.
    - A code in ``FAIL_OVER_CODES``, or a target that never accepted the stream (``NotAccepted``,
      or no answer within the accept wait: ``TimeoutError``): ``NEXT``.
    - Any other status (RESOURCE_EXHAUSTED, CANCELLED, INVALID_ARGUMENT, PERMISSION_DENIED,
      UNAUTHENTICATED, NOT_FOUND, INTERNAL, ...): the controller is alive and answered about this
      stream. Only the leader accepts streams, so another controller would send us back to it:
      ``SAME``, after the backoff.
    - Any other exception (a stream ended cleanly after it was accepted, a fault on our side): ``SAME``.
    """
    if isinstance(exc, grpc.aio.AioRpcError):
        code = exc.code()
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            return Move.LEADER
        return Move.NEXT if code in FAIL_OVER_CODES else Move.SAME
    if isinstance(exc, NotAccepted | TimeoutError):
        return Move.NEXT
    return Move.SAME


# What gRPC's Python client reports in place of the peer's status when a write loses the race
# with the peer ending the stream: the write's failure is set as the call's status, over the
# peer's, which is then gone from the call.
CORE_INTERNAL_DETAILS = "Internal error from Core"
# call -> the status it first ended with (code, details, trailing metadata), kept by ``_watch``
_first_status: weakref.WeakKeyDictionary[Any, tuple[grpc.StatusCode, str, Any]] = weakref.WeakKeyDictionary()
_watched: weakref.WeakSet[Any] = weakref.WeakSet()  # calls whose done callback keeps it


async def send(call: grpc.aio.StreamStreamCall, message: object) -> None:
    """``call.write(message)``, failing with the status the peer ended the stream with.

    A write to a stream the peer has already ended raises gRPC's ``InvalidStateError`` ("RPC
    already finished"), which says nothing about how it ended; the reconnect rule needs the
    status (a standby's FAILED_PRECONDITION, a dying controller's UNAVAILABLE), so that is
    raised instead. A stream the peer ended with OK is ``ConnectionError``.

    A write in flight as the peer ends the stream (a controller ending a live stream: replaced,
    rate-limited, its writer failed) fails inside gRPC's core, and the client then overwrites
    the peer's status with ``INTERNAL "Internal error from Core"`` (295 of 300 such endings in
    ``bench.refusal_race``'s mid-stream case). The first status the call ended with is kept as
    it arrives (``_watch``, from the first ``send`` on), and that one is raised instead.
    """
    _watch(call)
    try:
        await call.write(message)
    except asyncio.InvalidStateError:
        if not call.done():
            raise
        code = await call.code()
        if code == grpc.StatusCode.OK:
            raise ConnectionError("the controller ended the stream") from None
        raise grpc.aio.AioRpcError(
            code, await call.initial_metadata(), await call.trailing_metadata(), details=await call.details()
        ) from None
    except grpc.aio.AioRpcError as err:
        raise await peer_status(call, err) from None


async def read(call: grpc.aio.StreamStreamCall) -> Any:
    """``call.read()``, failing with the status the peer ended the stream with (as ``send``): a read
    after a write lost the race sees gRPC core's INTERNAL too."""
    _watch(call)
    try:
        return await call.read()
    except grpc.aio.AioRpcError as err:
        raise await peer_status(call, err) from None


async def peer_status(call: grpc.aio.StreamStreamCall, err: grpc.aio.AioRpcError) -> Exception:
    """``err`` as the peer sent it: gRPC core's INTERNAL stands for the status the call first
    ended with, where ``_watch`` kept one (a clean end, OK, is ``ConnectionError``); anything
    else is ``err`` itself. For a stream's reader too: its read sees the overwritten status."""
    first = _first_status.get(call)
    if err.code() != grpc.StatusCode.INTERNAL or err.details() != CORE_INTERNAL_DETAILS or first is None:
        return err
    code, details, trailing = first
    if code == grpc.StatusCode.INTERNAL and details == CORE_INTERNAL_DETAILS:
        return err
    if code == grpc.StatusCode.OK:
        return ConnectionError("the controller ended the stream")
    return grpc.aio.AioRpcError(code, await call.initial_metadata(), trailing, details=details)


def _watch(call: grpc.aio.StreamStreamCall) -> None:
    """Keep the status ``call`` first ends with, read in its done callback (which gRPC runs as
    the status is set, before a failed write can overwrite it)."""
    if call in _watched:
        return
    _watched.add(call)

    def keep(done: Any) -> None:
        code, details, trailing = _ready(done.code()), _ready(done.details()), _ready(done.trailing_metadata())
        if isinstance(code, grpc.StatusCode) and done not in _first_status:
            _first_status[done] = (code, details or "", trailing)

    call.add_done_callback(keep)


def _ready(coro: Coroutine[Any, Any, Any]) -> Any:
    """The value of a call's accessor coroutine that has nothing to wait for (its status is set),
    taken at once, in a callback that cannot await; None where it would have to wait."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    except Exception:  # a call in a state this does not know: keep nothing, as if it had to wait
        return None
    coro.close()
    return None


class Reconnector:
    """Runs a client's sessions one after another, choosing each one's controller by ``after_failure``.

    ``targets`` is shared with the owner and grows when a standby names a leader not in it;
    the backoff restarts when a session says it was accepted (``accepted()``) and when a
    standby points at the leader (not a failure of the controllers). Waits go through ``clock``.
    """

    def __init__(
        self,
        targets: Sequence[str],
        backoff: Backoff | None = None,
        seed: int | None = None,
        *,
        clock: Clock,
        name: str = "agent",
    ) -> None:
        if not targets:
            raise ValueError("at least one controller address is needed")
        self.targets = list(targets)
        self.backoff = backoff or Backoff()
        self.index = 0
        self.name = name  # which client this is, in the log events
        self._rng = random.Random(seed)
        self._clock = clock

    @property
    def target(self) -> str:
        """The controller the next session goes to."""
        return self.targets[self.index % len(self.targets)]

    def accepted(self) -> None:
        """The session's stream was accepted: the next failure starts the backoff over."""
        self.backoff.reset()

    def failed(self, target: str, exc: Exception) -> Move:
        """Apply the rule to a session that ended with ``exc``: move on (or not); returns the move made."""
        move = after_failure(exc)
        if isinstance(exc, grpc.aio.AioRpcError):
            log.warning(
                "client_stream_failed", client=self.name, target=target, code=exc.code().name, detail=exc.details()
            )
            if move is Move.LEADER:
                index = follow_leader_hint(self.targets, target, exc)
                if index is not None:
                    self.index = index
                    self.backoff.reset()  # not a failure of the controllers: go straight to the leader
                    log.info("client_follow_leader", client=self.name, standby=target, leader=self.targets[index])
                    return move
                move = Move.NEXT  # a refusal that names no leader (or the one just tried)
        elif move is Move.NEXT:  # the target did not accept the stream: expected, no traceback
            log.warning("client_stream_not_accepted", client=self.name, target=target, error=repr(exc))
        else:
            log.exception("client_stream_error", client=self.name, target=target)
        if move is Move.NEXT:
            self.index += 1
        return move

    async def run(
        self,
        session: Callable[[str], Awaitable[None]],
        stopping: Callable[[], bool],
        ended: Callable[[], None],
        paused: Callable[[], bool] = lambda: False,
    ) -> None:
        """Run ``session(target)`` until ``stopping()``; ``ended()`` after each, however it ended.

        While ``paused()`` no session starts (a simulated cut network); it is polled every 0.2 s
        with a plain sleep: an owner's wake-up event is set by every new report, and waiting on a
        set event returns without yielding, which would spin the event loop.
        """
        while not stopping():
            if paused():
                await self._clock.sleep(0.2)
                continue
            target = self.target
            try:
                await session(target)
            except asyncio.CancelledError:
                if stopping():
                    break
                raise
            except Exception as exc:
                self.failed(target, exc)
            finally:
                ended()
            if stopping():
                break
            delay = self.backoff.next_delay(self._rng)
            log.info("client_reconnect_wait", client=self.name, delay_s=round(delay, 2))
            await self._clock.sleep(delay)
