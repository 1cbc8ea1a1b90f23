"""The one reconnect rule of every starpulse client: which failure moves on to the next controller.

The decision table, the loop's waits on a FakeClock, and both clients (the agent's link and the
relay's upstream) against real gRPC servers on loopback.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent.transport.buffer import EventBuffer
from agent.transport.link import ControllerLink
from relay.upstream import Upstream
from starpulse.core.clock import SYSTEM_CLOCK, FakeClock
from starpulse.core.grpc_client import (
    FAIL_OVER_CODES,
    LEADER_METADATA_KEY,
    Backoff,
    Move,
    NotAccepted,
    Reconnector,
    after_failure,
    read,
    send,
)
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc
from tests.helpers import wait_for


def rpc_error(code: grpc.StatusCode, leader: str | None = None) -> grpc.aio.AioRpcError:
    trailing = grpc.aio.Metadata((LEADER_METADATA_KEY, leader)) if leader is not None else grpc.aio.Metadata()
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, details="refused")


SAME_CODES = [
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.ABORTED,
]


class TestAfterFailure:
    """The decision table, by how a stream ended."""

    @pytest.mark.parametrize("code", sorted(FAIL_OVER_CODES, key=lambda c: c.name))
    def test_a_controller_that_is_not_serving_is_left_for_the_next(self, code: grpc.StatusCode) -> None:
        """Down, unreachable, crashed handler, no answer in time, wrong service: next controller."""
        assert after_failure(rpc_error(code)) is Move.NEXT

    def test_the_fail_over_codes_are_exactly_these(self) -> None:
        """The documented set, so a change to it is a change to this test too."""
        assert {c.name for c in FAIL_OVER_CODES} == {"UNAVAILABLE", "UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED"}

    @pytest.mark.parametrize("code", SAME_CODES, ids=lambda c: c.name)
    def test_a_live_controller_that_refused_the_stream_is_tried_again(self, code: grpc.StatusCode) -> None:
        """It answered about this stream; only the leader accepts, so another would send us back."""
        assert after_failure(rpc_error(code)) is Move.SAME

    def test_a_standby_refusal_goes_to_the_leader(self) -> None:
        assert after_failure(rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "10.0.0.2:7000")) is Move.LEADER

    @pytest.mark.parametrize("exc", [NotAccepted("no Welcome"), TimeoutError()], ids=repr)
    def test_a_target_that_never_accepted_the_stream_is_left(self, exc: Exception) -> None:
        assert after_failure(exc) is Move.NEXT

    @pytest.mark.parametrize("exc", [ConnectionError("the controller ended the stream"), ValueError("bug")], ids=repr)
    def test_other_failures_retry_the_same_controller(self, exc: Exception) -> None:
        assert after_failure(exc) is Move.SAME


class TestReconnectorMoves:
    """Where the next session goes after each kind of failure."""

    def test_next_walks_the_list_round(self) -> None:
        r = Reconnector(["a", "b"], seed=1, clock=SYSTEM_CLOCK)
        r.failed("a", rpc_error(grpc.StatusCode.UNAVAILABLE))
        assert r.target == "b"
        r.failed("b", rpc_error(grpc.StatusCode.UNAVAILABLE))
        assert r.target == "a"

    def test_same_stays(self) -> None:
        r = Reconnector(["a", "b"], seed=1, clock=SYSTEM_CLOCK)
        assert r.failed("a", rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED)) is Move.SAME
        assert r.target == "a"

    def test_a_named_leader_not_in_the_list_is_added_and_the_backoff_restarts(self) -> None:
        r = Reconnector(["standby"], backoff=Backoff(attempt=4), seed=1, clock=SYSTEM_CLOCK)
        assert r.failed("standby", rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "leader")) is Move.LEADER
        assert r.targets == ["standby", "leader"] and r.target == "leader"
        assert r.backoff.attempt == 0

    def test_a_refusal_naming_no_leader_moves_on(self) -> None:
        r = Reconnector(["a", "b"], seed=1, clock=SYSTEM_CLOCK)
        assert r.failed("a", rpc_error(grpc.StatusCode.FAILED_PRECONDITION)) is Move.NEXT
        assert r.target == "b"

    def test_a_refusal_naming_itself_moves_on(self) -> None:
        r = Reconnector(["a", "b"], seed=1, clock=SYSTEM_CLOCK)
        assert r.failed("a", rpc_error(grpc.StatusCode.FAILED_PRECONDITION, "a")) is Move.NEXT
        assert r.target == "b"

    def test_no_targets_is_refused(self) -> None:
        with pytest.raises(ValueError, match="at least one controller"):
            Reconnector([], clock=SYSTEM_CLOCK)


class TestReconnectorLoop:
    """The loop: a session per attempt, a jittered, growing wait between them on the injected clock."""

    async def test_waits_grow_with_jitter_and_restart_after_an_accepted_session(self) -> None:
        clock = FakeClock()
        r = Reconnector(["a", "b"], backoff=Backoff(initial_s=1.0, max_s=4.0), seed=7, clock=clock)
        tried: list[tuple[str, float]] = []
        script: list[Callable[[], None]] = [
            lambda: _raise(rpc_error(grpc.StatusCode.UNAVAILABLE)),
            lambda: _raise(rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED)),
            lambda: _raise(rpc_error(grpc.StatusCode.UNAVAILABLE)),
            r.accepted,  # accepted, then the stream ends
        ]
        stop = False
        ended = 0

        async def session(target: str) -> None:
            nonlocal stop
            tried.append((target, clock.monotonic()))
            step = script[len(tried) - 1]
            if len(tried) == len(script):
                stop = True
            step()

        def on_end() -> None:
            nonlocal ended
            ended += 1

        task = asyncio.create_task(r.run(session, stopping=lambda: stop, ended=on_end))
        await clock.run_for(20.0)
        await task
        assert [t for t, _ in tried] == ["a", "b", "b", "a"]
        waits = [later - earlier for (_, earlier), (_, later) in itertools.pairwise(tried)]
        # full jitter in [ceiling/2, ceiling], the ceiling doubling from 1 s up to 4 s
        for wait, ceiling in zip(waits, [1.0, 2.0, 4.0], strict=True):
            assert ceiling / 2 <= wait <= ceiling
        assert ended == 4
        assert r.backoff.attempt == 0  # the accepted session restarted it

    async def test_nothing_starts_while_paused(self) -> None:
        clock = FakeClock()
        r = Reconnector(["a"], seed=1, clock=clock)
        paused = True
        tried: list[str] = []

        async def session(target: str) -> None:
            tried.append(target)

        task = asyncio.create_task(
            r.run(session, stopping=lambda: bool(tried), ended=lambda: None, paused=lambda: paused)
        )
        await clock.run_for(5.0)
        assert tried == []
        paused = False
        await clock.run_for(1.0)
        await task
        assert tried == ["a"]


def _raise(exc: Exception) -> None:
    raise exc


class Refusing:
    """A controller that ends every agent or relay stream with one status, noting the call.

    It reads the client's hello first, as the controller and the standby do. Ending the stream
    before that races the client's hello write: a status that reaches the client while the
    write is in flight fails the write, and gRPC's Python client then reports its own
    ``INTERNAL "Internal error from Core"`` instead of the status sent (so UNKNOWN, which
    moves on, became INTERNAL, which stays: the flake this test had under load).
    """

    def __init__(self, name: str, arrivals: list[str], code: grpc.StatusCode, leader: str = "") -> None:
        self.name, self.arrivals, self.code, self.leader = name, arrivals, code, leader

    async def Connect(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        self.arrivals.append(self.name)
        await context.read()  # the hello: the client's write is done before the refusal is sent
        metadata = ((LEADER_METADATA_KEY, self.leader),) if self.leader else ()
        await context.abort(self.code, f"{self.name} refuses", trailing_metadata=metadata)


@asynccontextmanager
async def serving(servicer: Any) -> AsyncIterator[str]:
    server = grpc.aio.server()
    sgrpc.add_TelemetryServicer_to_server(servicer, server)
    sgrpc.add_RelayServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


FAST = {"initial_s": 0.01, "max_s": 0.02}


def agent_link(targets: list[str], tmp_path: Path) -> ControllerLink:
    return ControllerLink(
        targets,
        lambda: spb.Hello(node_id="node-000"),
        EventBuffer(tmp_path / "buf.db"),
        backoff=Backoff(**FAST),
        seed=1,
    )


def relay_upstream(targets: list[str], tmp_path: Path) -> Upstream:
    return Upstream(targets, "relay-a", on_down=lambda _d: None, on_lost=lambda: None, backoff=Backoff(**FAST), seed=1)


@pytest.mark.parametrize("client", [agent_link, relay_upstream], ids=["agent", "relay"])
class TestOverLoopback:
    """Both clients, real streams refused by real servers: where the second attempt goes."""

    @pytest.mark.parametrize(
        ("code", "second"),
        [
            (grpc.StatusCode.UNAVAILABLE, "b"),
            (grpc.StatusCode.UNKNOWN, "b"),
            (grpc.StatusCode.RESOURCE_EXHAUSTED, "a"),
            (grpc.StatusCode.PERMISSION_DENIED, "a"),
            (grpc.StatusCode.FAILED_PRECONDITION, "b"),  # no leader named: the next one
        ],
        ids=lambda v: getattr(v, "name", v),
    )
    async def test_the_second_attempt_follows_the_rule(
        self, client: Callable[[list[str], Path], Any], code: grpc.StatusCode, second: str, tmp_path: Path
    ) -> None:
        arrivals: list[str] = []
        async with (
            serving(Refusing("a", arrivals, code)) as a,
            serving(Refusing("b", arrivals, grpc.StatusCode.RESOURCE_EXHAUSTED)) as b,
        ):
            c = client([a, b], tmp_path)
            task = asyncio.create_task(c.run())
            try:
                await wait_for(lambda: len(arrivals) >= 2, what="two attempts")
            finally:
                await c.stop()
                await asyncio.wait_for(task, 10)
        assert arrivals[:2] == ["a", second]

    async def test_a_standby_sends_the_client_to_the_leader_it_names(
        self, client: Callable[[list[str], Path], Any], tmp_path: Path
    ) -> None:
        arrivals: list[str] = []
        async with (
            serving(Refusing("leader", arrivals, grpc.StatusCode.RESOURCE_EXHAUSTED)) as leader,
            serving(Refusing("standby", arrivals, grpc.StatusCode.FAILED_PRECONDITION, leader)) as standby,
            serving(Refusing("other", arrivals, grpc.StatusCode.RESOURCE_EXHAUSTED)) as other,
        ):
            c = client([standby, other], tmp_path)
            task = asyncio.create_task(c.run())
            try:
                await wait_for(lambda: len(arrivals) >= 2, what="two attempts")
            finally:
                await c.stop()
                await asyncio.wait_for(task, 10)
        assert arrivals[:2] == ["standby", "leader"]
        assert c.targets == [standby, other, leader]


class Ending:
    """A controller that reads the hello and ends the stream cleanly (status OK)."""

    async def Connect(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await context.read()


class TestSendOnAnEndedStream:
    """A write after the controller ended the stream fails with the controller's status, not gRPC's
    "RPC already finished" (which the rule would read as a fault of ours and stay)."""

    async def test_the_refusal_comes_back_with_its_code_and_leader(self) -> None:
        arrivals: list[str] = []
        standby = Refusing("standby", arrivals, grpc.StatusCode.FAILED_PRECONDITION, "10.0.0.2:7000")
        async with serving(standby) as a, grpc.aio.insecure_channel(a) as channel:
            call = sgrpc.TelemetryStub(channel).Connect()
            await send(call, spb.AgentMessage(hello=spb.Hello(node_id="node-000")))
            with pytest.raises(grpc.aio.AioRpcError):
                await call.read()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await send(call, spb.AgentMessage(hello=spb.Hello(node_id="node-000")))
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert after_failure(info.value) is Move.LEADER
        assert (LEADER_METADATA_KEY, "10.0.0.2:7000") in tuple(info.value.trailing_metadata() or ())

    async def test_a_stream_ended_with_ok_is_a_connection_error(self) -> None:
        server = grpc.aio.server()
        sgrpc.add_TelemetryServicer_to_server(Ending(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = sgrpc.TelemetryStub(channel).Connect()
                await send(call, spb.AgentMessage(hello=spb.Hello(node_id="node-000")))
                assert await call.read() is grpc.aio.EOF
                assert await call.code() == grpc.StatusCode.OK
                with pytest.raises(ConnectionError, match="ended the stream"):
                    await send(call, spb.AgentMessage(hello=spb.Hello(node_id="node-000")))
        finally:
            await server.stop(None)


class EndingMidStream:
    """A controller that welcomes the stream, reads a few messages and ends it with UNAVAILABLE
    and a leader hint while the client keeps writing (a live stream ended: replaced, rate-limited,
    its ack writer failed)."""

    async def Connect(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await context.read()
        await context.write(spb.ControllerMessage(welcome=spb.Welcome()))
        for _ in range(3):
            await context.read()
        await context.abort(
            grpc.StatusCode.UNAVAILABLE, "ended mid-stream", trailing_metadata=((LEADER_METADATA_KEY, "10.0.0.9:1"),)
        )


class TestAStreamEndedMidWrite:
    """gRPC's Python client sets ``INTERNAL "Internal error from Core"`` over the peer's status
    when a write is in flight as the stream ends (almost every time in this shape: 295 of 300 in
    ``bench.refusal_race``); ``send`` and ``read`` hand back the peer's own status instead."""

    async def test_every_ending_comes_back_as_the_status_sent(self) -> None:
        seen: list[tuple[grpc.StatusCode, str, tuple[Any, ...]]] = []
        async with serving(EndingMidStream()) as address:
            for _ in range(20):
                async with grpc.aio.insecure_channel(address) as channel:
                    call = sgrpc.TelemetryStub(channel).Connect()
                    await send(call, spb.AgentMessage(hello=spb.Hello(node_id="node-000")))
                    assert (await read(call)).HasField("welcome")
                    report = spb.AgentMessage()
                    report.report.seq = 1
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        while True:
                            await send(call, report)
                    seen.append((info.value.code(), info.value.details() or "", tuple(info.value.trailing_metadata())))
                    with pytest.raises(grpc.aio.AioRpcError) as later:
                        await read(call)  # a read after it: the same status
                    assert later.value.code() == grpc.StatusCode.UNAVAILABLE
        hint = (LEADER_METADATA_KEY, "10.0.0.9:1")
        assert seen == [(grpc.StatusCode.UNAVAILABLE, "ended mid-stream", (hint,))] * 20
