"""Delta reports at the controller: detection sees the same thing as with full reports."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from agent.transport.delta import ReportDelta
from controller.detect.failslow import FailSlowDetector
from controller.detect.model import ConditionChange
from controller.detect.rates import CounterRate
from controller.service import Controller, ControllerConfig
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc
from starpulse.v1 import telemetry_pb2 as tpb
from tests.controller.test_conditions import Clock, compute_node, good_report, make_engine
from tests.helpers import free_port, make_sim_agent, wait_for

NIC5 = "node-003/nic-5"


def _traffic(r: tpb.Report, step: int) -> None:
    """Traffic counters move every report, as on a busy node."""
    for i, n in enumerate(r.nics):
        n.counters["port_xmit_data"] = 1_000_000 * step + i
        n.counters["port_rcv_data"] = 2_000_000 * step + i


def _changes(changes: list[ConditionChange]) -> list[tuple[str, str, str]]:
    return [(c.kind, c.condition.rule, c.condition.component) for c in changes]


class TestDetectionOnDeltas:
    def test_same_verdicts_as_full_reports(self) -> None:
        """Symbol errors rising on one port open and resolve the same conditions at the same reports.

        The controller reads counters only every counter_interval, so it skips some full
        reports; an absent counter in a later delta must still mean the skipped full
        report's value, not the last value the controller happened to read.
        """
        full_engine, full_clock = make_engine()
        delta_engine, delta_clock = make_engine()
        node = compute_node()
        encoder = ReportDelta(full_every=5)
        encoder.reset(enabled=True)
        full_seen: list[list[tuple[str, str, str]]] = []
        delta_seen: list[list[tuple[str, str, str]]] = []
        for step in range(60):
            r = good_report(0)
            r.seq = step + 1
            _traffic(r, step)
            if 10 <= step < 20:  # a burst of physical-layer errors on nic 5
                r.nics[5].counters["symbol_error"] = 1000 * (step - 9)
            elif step >= 20:
                r.nics[5].counters["symbol_error"] = 10_000
            for engine, clock, seen, msg in (
                (full_engine, full_clock, full_seen, r),
                (delta_engine, delta_clock, delta_seen, encoder.encode(r)),
            ):
                clock.advance(5)
                msg.timestamp_ms = clock.now
                seen.append(_changes(engine.on_report(node, msg)))
                seen[-1] += _changes(engine.tick())
        assert encoder.delta_sent > 40
        assert full_seen == delta_seen
        opened = {(rule, comp) for step in full_seen for kind, rule, comp in step if kind == "opened"}
        assert any(comp == NIC5 for _, comp in opened)
        assert full_engine.rates.last(NIC5, "counters/symbol_error") == 10_000
        assert delta_engine.rates.last(NIC5, "counters/symbol_error") == 10_000


class TestRatesAbsentValues:
    NAMES = ("counters/symbol_error", "counters/port_xmit_data")

    def test_absent_value_is_unchanged_and_cheap(self) -> None:
        """A delta leaves quiet counters out: nothing moved, the cheap None path, last value kept."""
        cr = CounterRate()
        cr.update_group("n/nic-0", 0, self.NAMES, (4, 100))
        assert cr.update_group("n/nic-0", 5_000, self.NAMES, (None, None)) is None
        out = cr.update_group("n/nic-0", 10_000, self.NAMES, (None, 200))
        # the quiet sample at 5 s counts: 100 more over the 5 s since it
        assert out is not None and out["counters/port_xmit_data"].rate == pytest.approx(20.0)
        assert "counters/symbol_error" not in out  # no sample for what was not sent
        assert cr.last("n/nic-0", "counters/symbol_error") == 4

    def test_counters_are_not_one_object_each(self) -> None:
        """10,000 nodes x ~1,000 counters must not mean 10 million objects for the GC to walk."""
        cr = CounterRate()
        names = tuple(f"nvlink-{i}/replay_errors" for i in range(90))
        for n in range(50):
            cr.update_group(f"node-{n}/gpu-0", 0, names, tuple(range(90)))
            cr.update_group(f"node-{n}/gpu-0", 5_000, names, tuple(range(90)))
        assert len(cr) == 50 * 90
        assert not cr._tracks  # no per-counter tracks for grouped counters


class TestFailSlowOnDeltas:
    def test_idle_port_in_a_delta_is_zero_not_unknown(self) -> None:
        """port_xmit/rcv_data absent from a delta means 'unchanged since the full report': 0 Gb/s."""
        clock = Clock()
        det = FailSlowDetector(clock_ms=clock)
        r = good_report(0, nics=1)
        _traffic(r, 1)
        det.observe("node-003", r)
        clock.advance(5)
        delta = tpb.Report(timestamp_ms=clock.now + 5000, counters_delta=True)
        delta.nics.add(rdma_device="mlx5_0", port=1)
        det.observe("node-003", delta)
        series = det._nodes["node-003"].series.get("nic_gbps")
        assert series is not None and series[-1][1] == 0.0


# -- over the wire ---------------------------------------------------------------------------
@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[Controller]:
    ctl = Controller(ControllerConfig(listen=f"127.0.0.1:{free_port()}", http="127.0.0.1:0", db_path=tmp_path / "c.db"))
    await ctl.start()
    yield ctl
    await ctl.stop()


class TestWire:
    async def test_welcome_offers_deltas_and_a_delta_first_asks_for_a_full_report(self, controller: Controller) -> None:
        """A stream whose first report is a delta is still used, and the ack asks for a full report."""
        async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.grpc_port}") as ch:
            call = sgrpc.TelemetryStub(ch).Connect()
            hello = spb.Hello(node_id="node-000", role=ipb.NODE_ROLE_COMPUTE, buffer_epoch="e", next_event_seq=1)
            await call.write(spb.AgentMessage(hello=hello))
            first = await call.read()
            assert first.welcome.accepts_delta_reports
            delta = good_report(1, nics=2)
            delta.seq, delta.counters_delta = 1, True
            await call.write(spb.AgentMessage(report=delta))
            ack = await call.read()
            assert ack.HasField("ack") and ack.ack.full_report_needed and ack.ack.report_seq == 1
            assert controller.registry.nodes["node-000"].latest_report is not None
            full = good_report(2, nics=2)
            full.seq = 2
            await call.write(spb.AgentMessage(report=full))
            await call.done_writing()
            while (msg := await call.read()) is not grpc.aio.EOF:
                assert not msg.ack.full_report_needed

    async def test_agent_streams_deltas_and_the_controller_keeps_up(
        self, tmp_path: Path, controller: Controller
    ) -> None:
        """A real agent sends full reports then deltas; the controller records every one of them."""
        a = make_sim_agent("node-000", tmp_path, [f"127.0.0.1:{controller.grpc_port}"], interval_s=0.1)
        a.agent.link.delta.full_every = 4
        a.start()
        try:
            await wait_for(lambda: a.agent.link.delta.delta_sent >= 6, what="delta reports")
            await wait_for(
                lambda: controller.metrics.reports._value.get() >= a.agent.link.reports_sent - 1,
                what="every report recorded",
            )
            assert a.agent.link.delta.full_sent >= 2
        finally:
            await a.halt()

    async def test_reports_are_acked_sparingly_events_at_once(self, controller: Controller) -> None:
        """Report-only acks go out at most every report_ack_interval_s; an event is acked straight away."""
        assert controller.config.report_ack_interval_s >= 5
        async with grpc.aio.insecure_channel(f"127.0.0.1:{controller.grpc_port}") as ch:
            call = sgrpc.TelemetryStub(ch).Connect()
            hello = spb.Hello(node_id="node-001", role=ipb.NODE_ROLE_COMPUTE, buffer_epoch="e", next_event_seq=1)
            await call.write(spb.AgentMessage(hello=hello))
            assert (await call.read()).HasField("welcome")
            for seq in (1, 2, 3, 4, 5):
                r = good_report(seq, nics=1)
                r.seq = seq
                await call.write(spb.AgentMessage(report=r))
            ev = tpb.Event(seq=1, timestamp_ms=1, kind=tpb.EVENT_KIND_XID, severity=tpb.SEVERITY_CRITICAL, xid=79)
            await call.write(spb.AgentMessage(event=ev))
            acks = []
            while not acks or acks[-1].event_seq < 1:
                acks.append((await call.read()).ack)
            await call.done_writing()
        assert acks[-1].event_seq == 1 and acks[-1].report_seq == 5
        assert len(acks) <= 2  # the first report's ack, perhaps, then the event's
