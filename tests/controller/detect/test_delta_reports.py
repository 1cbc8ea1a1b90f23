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
from starpulse.core.clock import SYSTEM_CLOCK, FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc
from starpulse.v1 import telemetry_pb2 as tpb
from tests.helpers import free_port, make_sim_agent, wait_for
from tests.support.conditions import compute_node, good_report, make_engine

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
                msg.timestamp_ms = clock.time_ms()
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
        clock = FakeClock(1_000_000)
        det = FailSlowDetector(clock=clock)
        r = good_report(0, nics=1)
        _traffic(r, 1)
        det.observe("node-003", r)
        clock.advance(15)  # one sample_every_s on: the delta is sampled
        delta = tpb.Report(timestamp_ms=clock.time_ms() + 15000, counters_delta=True)
        delta.nics.add(rdma_device="mlx5_0", port=1)
        det.observe("node-003", delta)
        series = det._nodes["node-003"].series.get("nic_gbps")
        assert series is not None and series[-1][1] == 0.0


GPU5 = "node-003/gpu-5"
GPU2 = "node-003/gpu-2"


def _sent_links(r: tpb.Report) -> int:
    return sum(len(g.nvlinks) for g in r.gpus)


class TestNvLinksOnDeltas:
    """A delta report's GPU carries only the links that differ from the last FULL report's."""

    def _run(self, encode: object, steps: int = 60) -> tuple[list, list, int, int]:
        """Feed the same reports whole to one engine and as ``encode`` makes them to another."""
        full_engine, full_clock = make_engine()
        delta_engine, delta_clock = make_engine()
        node = compute_node()
        full_seen: list[list[tuple[str, str, str]]] = []
        delta_seen: list[list[tuple[str, str, str]]] = []
        sent = deltas = 0
        for step in range(steps):
            r = good_report(0, links=4)
            r.seq = step + 1
            _traffic(r, step)
            if 8 <= step < 31:  # link 1 of GPU 5 down across several full reports, then back
                r.gpus[5].nvlinks[1].up = False
            if 20 <= step < 40:  # CRC errors rising on GPU 2's link 3, then flat (the count stays)
                r.gpus[2].nvlinks[3].crc_flit_errors = 500 * (step - 19)
            elif step >= 40:
                r.gpus[2].nvlinks[3].crc_flit_errors = 10_000
            msg = encode(r)  # type: ignore[operator]
            if msg.counters_delta:
                deltas += 1
                sent += _sent_links(msg)
            for engine, clock, seen, m in (
                (full_engine, full_clock, full_seen, r),
                (delta_engine, delta_clock, delta_seen, msg),
            ):
                clock.advance(5)
                m.timestamp_ms = clock.time_ms()
                seen.append(_changes(engine.on_report(node, m)))
                seen[-1] += _changes(engine.tick())
        assert full_engine.rates.last(GPU2, "nvlink-3/crc_flit_errors") == 10_000
        assert delta_engine.rates.last(GPU2, "nvlink-3/crc_flit_errors") == 10_000
        return full_seen, delta_seen, sent, deltas

    def test_same_verdicts_as_full_reports(self) -> None:
        """A link down and NVLink errors open and resolve the same conditions at the same reports.

        Counters are read every counter_interval (every 3rd report here), so a change that a
        skipped full report carried and later deltas leave out must still be seen."""
        encoder = ReportDelta(full_every=5)
        encoder.reset(enabled=True)
        full_seen, delta_seen, sent, deltas = self._run(encoder.encode)
        assert deltas > 40
        assert sent < deltas  # mostly no link at all, against 32 links per report whole
        assert full_seen == delta_seen
        changes = {(kind, rule, comp) for step in full_seen for kind, rule, comp in step}
        assert ("opened", "gpu.nvlink_down", GPU5) in changes
        assert ("resolved", "gpu.nvlink_down", GPU5) in changes
        assert ("opened", "gpu.nvlink_errors", GPU2) in changes

    def test_deltas_from_an_agent_before_nvlink_deltas_carry_every_link(self) -> None:
        """An older agent's delta report has every link: each one simply updates its link."""
        encoder = ReportDelta(full_every=5)
        encoder.reset(enabled=True)

        def old_agent(r: tpb.Report) -> tpb.Report:
            out = encoder.encode(r)
            if out.counters_delta:
                for g, whole in zip(out.gpus, r.gpus, strict=True):
                    del g.nvlinks[:]
                    g.nvlinks.extend(whole.nvlinks)
            return out

        full_seen, delta_seen, sent, deltas = self._run(old_agent)
        assert sent == deltas * 8 * 4
        assert full_seen == delta_seen

    def test_absent_link_is_as_in_the_full_report(self) -> None:
        """Down in a delta opens; a delta without the link means 'as in the full report'.

        The full report had the link up, so a later delta without it says it is up again
        (the agent sends a down link in every delta until a full report carries it down).
        Once a full report has it down, deltas without it keep it down, and a delta with it
        up resolves."""
        engine, clock = make_engine()
        node = compute_node()

        def feed(r: tpb.Report) -> list[ConditionChange]:
            clock.advance(5)
            r.timestamp_ms = clock.time_ms()
            return engine.on_report(node, r)

        def delta(*links: tuple[int, bool]) -> tpb.Report:
            r = good_report(0, links=4)
            r.counters_delta = True
            for g in r.gpus:
                del g.nvlinks[:]
            for link, up in links:
                r.gpus[5].nvlinks.add(
                    link=link,
                    up=up,
                    replay_errors=0,
                    recovery_errors=0,
                    crc_flit_errors=0,
                    crc_data_errors=0,
                    ecc_data_errors=0,
                )
            return r

        feed(good_report(0, links=4))  # full: every link up
        changes = feed(delta((1, False)))
        assert _changes(changes) == [("opened", "gpu.nvlink_down", GPU5)]
        assert engine.get("gpu.nvlink_down", GPU5).evidence == {"links_down": [1], "links": 4}  # type: ignore[union-attr]
        assert feed(delta((1, False))) == []  # still down: stays open
        assert _changes(feed(delta())) == [("resolved", "gpu.nvlink_down", GPU5)]  # absent: up, as in the full

        down = good_report(0, links=4)
        down.gpus[5].nvlinks[1].up = False
        assert _changes(feed(down)) == [("opened", "gpu.nvlink_down", GPU5)]  # full: the base has it down
        for _ in range(3):
            assert feed(delta()) == []  # absent: down, as in the full report
        cond = engine.get("gpu.nvlink_down", GPU5)
        assert cond is not None and cond.count == 4 and cond.evidence["links_down"] == [1]
        assert _changes(feed(delta((1, True)))) == [("resolved", "gpu.nvlink_down", GPU5)]

    def test_a_delta_before_any_full_report(self) -> None:
        """No base yet (the controller asks for a full report): links that are there are all there is."""
        engine, clock = make_engine()
        node = compute_node()
        r = good_report(clock.time_ms(), links=4)
        r.counters_delta = True
        for g in r.gpus:
            if g.index != 5:
                del g.nvlinks[:]  # as a delta leaves them out: unknown, neither bad nor good
        r.gpus[5].nvlinks[3].up = False
        assert _changes(engine.on_report(node, r)) == [("opened", "gpu.nvlink_down", GPU5)]
        assert engine.get("gpu.nvlink_down", GPU5).evidence["links_down"] == [3]  # type: ignore[union-attr]
        assert "node-003/gpu-0" not in engine.view.link_base  # nothing to lay later deltas over

    def test_errors_rising_only_in_deltas_open_the_error_rule(self) -> None:
        """After one full report every report is a delta; the counter moves only there."""
        engine, clock = make_engine()
        node = compute_node()
        encoder = ReportDelta(full_every=1000)
        encoder.reset(enabled=True)
        opened_at = None
        for step in range(20):
            r = good_report(0, links=4)
            r.seq = step + 1
            r.gpus[5].nvlinks[2].crc_data_errors = 300 * step
            msg = encoder.encode(r)
            assert msg.counters_delta == (step > 0)
            if step:
                assert [(g.index, nl.link) for g in msg.gpus for nl in g.nvlinks] == [(5, 2)]
            clock.advance(5)
            msg.timestamp_ms = clock.time_ms()
            if ("opened", "gpu.nvlink_errors", GPU5) in _changes(engine.on_report(node, msg)):
                opened_at = opened_at or step
        assert opened_at is not None
        cond = engine.get("gpu.nvlink_errors", GPU5)
        assert cond is not None and cond.evidence["link"] == 2 and cond.evidence["counter"] == "crc_data_errors"

    def test_a_skipped_full_reports_counters_hold_for_later_deltas(self) -> None:
        """Counters are read every 15 s; a value only a full report in between carried is not lost."""
        engine, clock = make_engine()
        node = compute_node()
        encoder = ReportDelta(full_every=2)
        encoder.reset(enabled=True)
        for step, crc in enumerate((0, 10, 10, 10)):  # full (read), delta, full (not read), delta (read)
            r = good_report(0, links=4)
            r.seq = step + 1
            r.gpus[5].nvlinks[1].crc_flit_errors = crc
            msg = encoder.encode(r)
            assert msg.counters_delta == (step % 2 == 1)
            msg.timestamp_ms = clock.time_ms()
            engine.on_report(node, msg)
            clock.advance(5)
        assert _sent_links(msg) == 0  # the last delta left the link out: as in the full report before
        assert engine.rates.last(GPU5, "nvlink-1/crc_flit_errors") == 10


# -- over the wire ---------------------------------------------------------------------------
@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[Controller]:
    ctl = Controller(
        ControllerConfig(listen=f"127.0.0.1:{free_port()}", http="127.0.0.1:0", db_path=tmp_path / "c.db"),
        clock=SYSTEM_CLOCK,
    )
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

    async def test_an_nvlink_down_in_deltas_opens_and_its_return_resolves(
        self, tmp_path: Path, controller: Controller
    ) -> None:
        """A real agent streams deltas only; a link that goes down travels in them and opens
        gpu.nvlink_down with the report's evidence; back up, the deltas leave it out again (as in
        the full report: up) and the condition resolves."""
        a = make_sim_agent("node-000", tmp_path, [f"127.0.0.1:{controller.grpc_port}"], interval_s=0.1)
        a.agent.link.delta.full_every = 100_000  # one full report, then deltas
        engine = controller.detection.engine
        comp = "node-000/gpu-3"
        a.start()
        try:
            await wait_for(lambda: a.agent.link.delta.delta_sent >= 2, what="delta reports")
            fulls = a.agent.link.delta.full_sent
            a.sim.inject("gpu_nvlink_down", "gpu-3", link=4)

            def confirmed() -> bool:  # by a report (the agent's NVLink-down event opens it early)
                cond = engine.get("gpu.nvlink_down", comp)
                return cond is not None and cond.evidence.get("links_down") == [4]

            await wait_for(confirmed, what="gpu.nvlink_down from delta reports")
            a.sim.clear("gpu_nvlink_down", "gpu-3")
            await wait_for(lambda: engine.get("gpu.nvlink_down", comp) is None, what="resolved by delta reports")
            assert a.agent.link.delta.full_sent == fulls  # no full report carried either change
        finally:
            await a.halt()
