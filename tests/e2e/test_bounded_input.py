"""Issue 32 item 5: bounded input, against a real controller on loopback with raw gRPC clients
(and a real agent where the agent's half matters).

Probes, as an imposter or a broken agent would send them:

- an event with 65 attributes, an attribute key of 129 characters, a value of 1,025, an event
  of 64 full attributes (past 16 KiB in all): INVALID_ARGUMENT, nothing stored;
- an event seq, a report seq, a Hello's next_event_seq past SQLite's integer range: refused
  with INVALID_ARGUMENT (not an internal error), the controller serving on;
- an event seq that jumps a million past the stored one (it would make every real event after
  it read as a replay): refused, and the real next event is still stored;
- more events in a minute than a node's write quota: RESOURCE_EXHAUSTED naming the quota, the
  minute recorded in ``ingest_quota``; the real agent's events get through when the minute
  turns (the controller on a FakeClock: no waiting), none lost;
- a report stamped two days ahead of the controller's clock: flagged (metric, node page with
  the skew) and logged with both dates;
- the agent's own oversize event (a kernel line of 10,000 characters, 100 attributes): cut to
  fit before it is buffered, so it is stored instead of ending the stream at every resend.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import structlog

from controller.outputs.web.node import node_json
from controller.service import Controller, ControllerConfig
from starpulse.core.clock import SYSTEM_CLOCK, Clock, FakeClock
from starpulse.core.eventlimits import MAX_ATTRIBUTE_KEY, MAX_ATTRIBUTE_VALUE, MAX_ATTRIBUTES, SQLITE_INT_MAX
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb
from tests.helpers import free_port, make_sim_agent, stream_session, wait_for

NODE = "node-000"


async def _controller(tmp_path: Path, clock: Clock) -> Controller:
    ctl = Controller(
        ControllerConfig(
            listen=f"127.0.0.1:{free_port()}",
            http="127.0.0.1:0",
            db_path=tmp_path / "c.db",
            allowed_nodes=[NODE, "node-001"],
        ),
        clock=clock,
    )
    await ctl.start()
    return ctl


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[Controller]:
    ctl = await _controller(tmp_path, SYSTEM_CLOCK)
    yield ctl
    await ctl.stop()


def _hello(node_id: str = NODE, **fields: int) -> spb.AgentMessage:
    hello = spb.Hello(node_id=node_id, role=ipb.NODE_ROLE_COMPUTE, buffer_epoch="e1", next_event_seq=1)
    for name, value in fields.items():
        setattr(hello, name, value)
    return spb.AgentMessage(hello=hello)


def _event(seq: int, **attributes: str) -> spb.AgentMessage:
    ev = tpb.Event(
        seq=seq,
        timestamp_ms=int(time.time() * 1000),
        kind=tpb.EVENT_KIND_KERNEL,
        severity=tpb.SEVERITY_WARNING,
        component="host",
    )
    ev.attributes.update(attributes)
    return spb.AgentMessage(event=ev)


async def _session(ctl: Controller, *messages: spb.AgentMessage) -> grpc.StatusCode:
    return await stream_session(grpc.aio.insecure_channel(f"127.0.0.1:{ctl.grpc_port}"), *messages)


async def _still_serving(ctl: Controller) -> None:
    code = await _session(ctl, _hello("node-001"), spb.AgentMessage(report=tpb.Report(seq=1, timestamp_ms=1)))
    assert code == grpc.StatusCode.OK


@pytest.mark.parametrize(
    "attributes",
    [
        {f"k{i}": "v" for i in range(MAX_ATTRIBUTES + 1)},
        {"k" * (MAX_ATTRIBUTE_KEY + 1): "v"},
        {"k": "v" * (MAX_ATTRIBUTE_VALUE + 1)},
        {f"k{i}": "v" * (MAX_ATTRIBUTE_VALUE - 8) for i in range(MAX_ATTRIBUTES)},  # each fits; 64 KiB in all
    ],
    ids=["count", "key", "value", "total"],
)
async def test_event_attributes_are_capped(controller: Controller, attributes: dict[str, str]) -> None:
    assert await _session(controller, _hello(), _event(1, **attributes)) == grpc.StatusCode.INVALID_ARGUMENT
    assert controller.store.count_events() == 0
    await _still_serving(controller)


@pytest.mark.parametrize(
    "messages",
    [
        (_hello(), _event(SQLITE_INT_MAX + 1)),
        (_hello(), spb.AgentMessage(report=tpb.Report(seq=SQLITE_INT_MAX + 1, timestamp_ms=1))),
        (_hello(next_event_seq=2**64 - 1),),
        (_hello(oldest_buffered_event_seq=2**64 - 1),),
    ],
    ids=["event_seq", "report_seq", "hello_next_seq", "hello_oldest_seq"],
)
async def test_numbers_past_sqlite_are_refused_clearly(
    controller: Controller, messages: tuple[spb.AgentMessage, ...]
) -> None:
    assert await _session(controller, *messages) == grpc.StatusCode.INVALID_ARGUMENT
    await _still_serving(controller)


async def test_a_forged_seq_jump_cannot_blind_the_node(controller: Controller) -> None:
    code = await _session(controller, _hello(), _event(1), _event(1_000_002))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    # The real next event is still taken, not read as a replay.
    assert await _session(controller, _hello(), _event(2)) == grpc.StatusCode.OK
    assert controller.store.count_events(NODE) == 2


async def test_write_quota_per_node_and_minute(controller: Controller) -> None:
    assert controller.telemetry.quota is not None
    controller.telemetry.quota.events_per_min = 5
    code = await _session(controller, _hello(), *[_event(seq) for seq in range(1, 11)])
    # The controller ends the stream with RESOURCE_EXHAUSTED; a client still writing when the
    # status arrives may see its core's INTERNAL instead (tests.helpers.stream_session).
    assert code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INTERNAL)
    assert controller.metrics.rejected.labels("quota")._value.get() == 1
    assert controller.store.count_events(NODE) == 5
    [(_minute, events, _bytes, refused)] = controller.telemetry.quota.refused_minutes(NODE)
    assert events == 5 and refused == 1
    # Another node has its own quota.
    assert await _session(controller, _hello("node-001"), _event(1)) == grpc.StatusCode.OK


async def test_agent_over_quota_loses_nothing(tmp_path: Path) -> None:
    """The real agent is throttled, keeps its events, and sends them all once the minute turns."""
    clock = FakeClock(start_ms=int(time.time() * 1000))
    ctl = await _controller(tmp_path, clock)
    assert ctl.telemetry.quota is not None
    ctl.telemetry.quota.events_per_min = 3
    agent = make_sim_agent(NODE, tmp_path, [f"127.0.0.1:{ctl.grpc_port}"], interval_s=0.2)
    for i in range(8):
        agent.agent.buffer.append(
            tpb.Event(kind=tpb.EVENT_KIND_KERNEL, severity=tpb.SEVERITY_WARNING, component="host", message=f"e{i}")
        )
    agent.start()
    try:
        await wait_for(lambda: ctl.store.count_events(NODE) == 3, what="the first minute's quota stored")
        await wait_for(lambda: ctl.metrics.rejected.labels("quota")._value.get() >= 1, what="the agent throttled")
        clock.advance(60)
        await wait_for(lambda: ctl.store.count_events(NODE) == 6, what="the next minute's share")
        clock.advance(60)
        await wait_for(lambda: ctl.store.count_events(NODE) == 8, what="every event, none lost")
        assert ctl.registry.nodes[NODE].acked_event_seq == 8
    finally:
        await agent.halt()
        await ctl.stop()


async def test_a_clock_two_days_ahead_is_flagged_with_its_date(controller: Controller) -> None:
    ahead = int(time.time() * 1000) + 2 * 86_400_000
    with structlog.testing.capture_logs() as logs:
        code = await _session(controller, _hello(), spb.AgentMessage(report=tpb.Report(seq=1, timestamp_ms=ahead)))
    assert code == grpc.StatusCode.OK
    rec = controller.registry.nodes[NODE]
    assert rec.clock_skew_ms > 86_400_000
    assert controller.metrics.clock_skewed._value.get() == 1
    [line] = [entry for entry in logs if entry["event"] == "agent_clock_skewed"]
    assert line["agent_time"][:10] != line["controller_time"][:10]  # the dates, not only times of day
    page = node_json(NODE, rec, {}, False, controller.clock.time_ms())
    assert page["clock_skew_s"] > 86_400
    # Back in step: the flag clears.
    now = int(time.time() * 1000)
    assert (
        await _session(controller, _hello(), spb.AgentMessage(report=tpb.Report(seq=2, timestamp_ms=now)))
        == grpc.StatusCode.OK
    )
    assert rec.clock_skew_ms == 0 and controller.metrics.clock_skewed._value.get() == 0


async def test_agent_cuts_its_own_oversize_event_to_fit(controller: Controller, tmp_path: Path) -> None:
    agent = make_sim_agent(NODE, tmp_path, [f"127.0.0.1:{controller.grpc_port}"], interval_s=0.2)
    big = tpb.Event(kind=tpb.EVENT_KIND_KERNEL, severity=tpb.SEVERITY_WARNING, component="host", message="m" * 10_000)
    big.attributes.update({f"a{i:03d}": "v" * 2000 for i in range(100)})
    agent.agent.buffer.append(big)
    agent.start()
    try:
        await wait_for(lambda: controller.store.count_events(NODE) >= 1, what="the cut event stored")
        [row] = controller.store.list_events(NODE)
        assert row.event.message.endswith("…") and len(row.event.attributes) <= MAX_ATTRIBUTES
        assert controller.metrics.rejected.labels("invalid_message")._value.get() == 0
        assert agent.agent.link.connects == 1
    finally:
        await agent.halt()
