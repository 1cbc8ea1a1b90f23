"""The per-report fast paths reach the same verdicts as reading every field.

The condition engine skips per-rule work for a healthy GPU (one read of its state
fields), checks NVLink state in one pass, reads a link once when its counters are due,
and asks HasField only to resolve an open condition; fail-slow asks it only for zeros;
validation checks presence only on failure. These cases sit where a shortcut could
differ from the long way: one link down among 18, an absent field next to a zero one,
watched and unwatched clock bits, a threshold met exactly, a delta report's absent counter.
"""

from __future__ import annotations

import math

import pytest

from controller.detect.failslow import SIGNAL_POWER, SIGNAL_SM_CLOCK, SIGNAL_UTIL, FailSlowConfig, FailSlowDetector
from controller.detect.linkkey import links_key
from controller.ingest.validate import InvalidMessage, validate_report
from starpulse.core.clock import FakeClock
from starpulse.v1 import telemetry_pb2 as tpb
from tests.support.conditions import NODE, RULES, compute_node, good_report, make_engine, opened, resolved

GPU5 = f"{NODE}/gpu-5"
LINKS = 18


def report_18_links(ts: int) -> tpb.Report:
    """A healthy report whose GPUs carry 18 NVLinks each, as an 8-GPU HGX node does."""
    return good_report(ts, links=LINKS)


class TestNvLink:
    @pytest.mark.parametrize("offset_s", [0, 5], ids=["counters-read", "counters-not-due"])
    def test_one_link_down_among_18(self, offset_s: int):
        """Link 11 of 18 down opens gpu.nvlink_down naming link 11, whether or not the counters are read then."""
        engine, clock = make_engine()
        node = compute_node()
        engine.on_report(node, report_18_links(clock.time_ms()))  # first report: counters read
        clock.advance(offset_s or 15)  # 15 s: the counters are due again; 5 s: they are not
        r = report_18_links(clock.time_ms())
        r.gpus[5].nvlinks[11].up = False
        changes = engine.on_report(node, r)
        assert opened(changes) == [("gpu.nvlink_down", GPU5)]
        cond = engine.get("gpu.nvlink_down", GPU5)
        assert cond is not None
        assert cond.evidence == {"links_down": [11], "links": LINKS}
        assert "NVLink 11 down" in cond.message
        clock.advance(5)
        assert resolved(engine.on_report(node, report_18_links(clock.time_ms()))) == [("gpu.nvlink_down", GPU5)]

    def test_link_numbers_not_positions(self):
        """The down link is named by its link number, not its position in the report."""
        engine, clock = make_engine()
        node = compute_node()
        r = report_18_links(clock.time_ms())
        links = r.gpus[5].nvlinks
        for pos, nl in enumerate(links):
            nl.link = 100 + pos
        links[3].up = False
        links[17].up = False
        engine.on_report(node, r)
        cond = engine.get("gpu.nvlink_down", GPU5)
        assert cond is not None
        assert cond.evidence["links_down"] == [103, 117]

    def test_down_and_errors_in_the_same_report(self):
        """A link down and CRC errors on another link, read in one pass: both conditions, right links."""
        engine, clock = make_engine()
        node = compute_node()
        engine.on_report(node, report_18_links(clock.time_ms()))
        clock.advance(15)
        r = report_18_links(clock.time_ms())
        r.gpus[5].nvlinks[2].up = False
        r.gpus[5].nvlinks[17].crc_flit_errors = 10_000
        changes = engine.on_report(node, r)
        assert set(opened(changes)) == {("gpu.nvlink_down", GPU5), ("gpu.nvlink_errors", GPU5)}
        errors = engine.get("gpu.nvlink_errors", GPU5)
        assert errors is not None
        assert errors.evidence["link"] == 17
        assert errors.evidence["counter"] == "crc_flit_errors"
        down = engine.get("gpu.nvlink_down", GPU5)
        assert down is not None
        assert down.evidence["links_down"] == [2]

    def test_absent_counter_is_zero_for_rates(self):
        """A link that stops reporting a counter reads it as 0, as the protobuf default always did."""
        engine, clock = make_engine()
        node = compute_node()
        r = report_18_links(clock.time_ms())
        r.gpus[5].nvlinks[4].crc_flit_errors = 500
        engine.on_report(node, r)
        clock.advance(15)
        r = report_18_links(clock.time_ms())
        r.gpus[5].nvlinks[4].ClearField("crc_flit_errors")  # absent: a reset to 0, not an error burst
        assert engine.on_report(node, r) == []


class TestGpuState:
    def test_absent_optional_flag_is_neither_bad_nor_good(self):
        """An open remap_pending stays open while the GPU omits the flag, and resolves when it says False."""
        engine, clock = make_engine()
        node = compute_node()
        r = good_report(clock.time_ms())
        r.gpus[5].remap_pending = True
        assert opened(engine.on_report(node, r)) == [("gpu.remap_pending", GPU5)]
        for _ in range(3):
            clock.advance(5)
            r = good_report(clock.time_ms())
            r.gpus[5].ClearField("remap_pending")
            assert engine.on_report(node, r) == []
        clock.advance(5)
        assert resolved(engine.on_report(node, good_report(clock.time_ms()))) == [("gpu.remap_pending", GPU5)]

    def test_absent_recovery_action_is_not_zero(self):
        """Recovery action 2 opens; an absent field keeps it open; an explicit 0 resolves it."""
        engine, clock = make_engine()
        node = compute_node()
        r = good_report(clock.time_ms())
        r.gpus[5].recovery_action = 2
        assert opened(engine.on_report(node, r)) == [("gpu.recovery_action", GPU5)]
        clock.advance(5)
        r = good_report(clock.time_ms())
        r.gpus[5].ClearField("recovery_action")
        assert engine.on_report(node, r) == []
        clock.advance(5)
        assert resolved(engine.on_report(node, good_report(clock.time_ms()))) == [("gpu.recovery_action", GPU5)]

    def test_unwatched_clock_bits_open_nothing_and_absent_resolves_nothing(self):
        """Idle + SW power cap (unwatched) is healthy; HW slowdown opens; an absent field does not count as good."""
        engine, clock = make_engine()
        node = compute_node()
        r = good_report(clock.time_ms())
        r.gpus[5].clock_event_reasons = 0x1 | 0x4 | 0x2 | 0x100  # none of the watched reasons
        assert engine.on_report(node, r) == []
        clock.advance(5)
        r = good_report(clock.time_ms())
        r.gpus[5].clock_event_reasons = 0x8 | 0x4
        assert opened(engine.on_report(node, r)) == [("gpu.hw_slowdown", GPU5)]
        for _ in range(3):  # resolve_after 2: absent reports must not count toward it
            clock.advance(5)
            r = good_report(clock.time_ms())
            r.gpus[5].ClearField("clock_event_reasons")
            assert engine.on_report(node, r) == []
        assert engine.get("gpu.hw_slowdown", GPU5) is not None
        clock.advance(5)
        assert engine.on_report(node, good_report(clock.time_ms())) == []  # first good report of 2
        clock.advance(5)
        assert resolved(engine.on_report(node, good_report(clock.time_ms()))) == [("gpu.hw_slowdown", GPU5)]

    def test_lost_gpu_skips_the_other_rules(self):
        """A lost GPU opens gpu.lost only, even with a recovery action and a slowdown bit in the same sample."""
        engine, clock = make_engine()
        node = compute_node()
        r = good_report(clock.time_ms())
        g = r.gpus[5]
        g.lost = True
        g.recovery_action = 2
        g.clock_event_reasons = 0x40
        g.nvlinks[0].up = False
        assert opened(engine.on_report(node, r)) == [("gpu.lost", GPU5)]

    def test_missing_gpu_resolves_when_back(self):
        """gpu.missing opens for an absent GPU and resolves once it is reported again (nothing else open)."""
        engine, clock = make_engine()
        node = compute_node()
        r = good_report(clock.time_ms())
        del r.gpus[5]
        assert opened(engine.on_report(node, r)) == [("gpu.missing", GPU5)]
        after = RULES.get("gpu.missing").resolve_after
        for n in range(1, after + 1):
            clock.advance(5)
            expect = [("gpu.missing", GPU5)] if n == after else []
            assert resolved(engine.on_report(node, good_report(clock.time_ms()))) == expect


class TestThresholdBoundary:
    @pytest.mark.parametrize(("errors", "fires"), [(5, False), (6, True)])
    def test_rate_threshold_is_inclusive(self, errors: int, fires: bool):
        """nic.phy_errors is 0.1/s over 60 s: 6 symbol errors in the window fire, 5 do not."""
        engine, clock = make_engine()
        node = compute_node()
        engine.on_report(node, good_report(clock.time_ms()))
        clock.advance(15)
        r = good_report(clock.time_ms())
        r.nics[5].counters["symbol_error"] = errors
        assert (("nic.phy_errors", f"{NODE}/nic-5") in opened(engine.on_report(node, r))) is fires

    def test_delta_report_absent_counter_keeps_the_full_value(self):
        """In a delta report an absent counter is the last full report's value: no reset, no burst."""
        engine, clock = make_engine()
        node = compute_node()
        r = good_report(clock.time_ms())
        r.nics[5].counters["symbol_error"] = 1_000
        engine.on_report(node, r)
        for _ in range(4):  # counter reads every 15 s, all from deltas that omit symbol_error
            clock.advance(15)
            d = good_report(clock.time_ms())
            d.counters_delta = True
            del d.nics[5].counters["symbol_error"]
            assert engine.on_report(node, d) == []
        clock.advance(15)
        d = good_report(clock.time_ms())
        d.counters_delta = True
        d.nics[5].counters["symbol_error"] = 1_006  # +6 in the window: exactly the threshold
        assert opened(engine.on_report(node, d)) == [("nic.phy_errors", f"{NODE}/nic-5")]


class TestFailSlowSignals:
    def test_absent_is_skipped_and_zero_is_kept(self):
        """A GPU that does not report utilization is left out of the mean; one that reports 0 % is in it."""
        clock = FakeClock(1_000_000)
        det = FailSlowDetector(FailSlowConfig(), clock=clock)
        r = tpb.Report(seq=1, timestamp_ms=clock.time_ms())
        r.gpus.add(index=0, utilization_gpu_pct=90.0, power_w=300.0, sm_clock_mhz=1800)
        r.gpus.add(index=1, utilization_gpu_pct=0.0, power_w=0.0, sm_clock_mhz=0)  # present zeros
        r.gpus.add(index=2)  # absent: none of the three
        det.observe("node-1", r)
        series = det._nodes["node-1"].series
        assert series[SIGNAL_UTIL][-1][1] == pytest.approx(45.0)
        assert series[SIGNAL_POWER][-1][1] == pytest.approx(150.0)
        assert series[SIGNAL_SM_CLOCK][-1][1] == pytest.approx(900.0)

    def test_all_absent_gives_no_sample(self):
        clock = FakeClock(1_000_000)
        det = FailSlowDetector(FailSlowConfig(), clock=clock)
        r = tpb.Report(seq=1, timestamp_ms=clock.time_ms())
        r.gpus.add(index=0)
        det.observe("node-1", r)
        assert SIGNAL_UTIL not in det._nodes["node-1"].series


class TestValidation:
    def test_absent_numbers_are_valid(self):
        r = tpb.Report(seq=1)
        r.gpus.add(index=0)
        validate_report(r)

    @pytest.mark.parametrize("fld", ["temperature_c", "power_w", "utilization_gpu_pct", "power_limit_w"])
    def test_non_finite_gpu_field_is_named(self, fld: str):
        r = tpb.Report(seq=1)
        r.gpus.add(index=0, temperature_c=50.0)
        g = r.gpus.add(index=3)
        setattr(g, fld, math.nan)
        with pytest.raises(InvalidMessage, match=rf"gpus\[3\]\.{fld} is not a finite number"):
            validate_report(r)

    def test_first_bad_field_is_named(self):
        """Two bad fields: the message names the first in the documented order, as before."""
        r = tpb.Report(seq=1)
        r.gpus.add(index=1, power_w=math.inf, power_limit_w=math.nan)
        with pytest.raises(InvalidMessage, match=r"gpus\[1\]\.power_w is not a finite number \(inf\)"):
            validate_report(r)

    def test_non_finite_nic_rate(self):
        r = tpb.Report(seq=1)
        r.nics.add(rdma_device="mlx5_2", rate_gbps=math.inf)
        with pytest.raises(InvalidMessage, match=r"nic mlx5_2\.rate_gbps is not a finite number \(inf\)"):
            validate_report(r)


class TestLinkKey:
    def test_equal_links_equal_keys_whatever_else_changed(self):
        a = report_18_links(1).gpus[5]
        b = report_18_links(2).gpus[5]
        b.temperature_c, b.power_w, b.clock_event_reasons = 91.0, 700.0, 0x40
        assert links_key(a) == links_key(b)

    @pytest.mark.parametrize(
        "change",
        [
            lambda g: setattr(g.nvlinks[7], "up", False),
            lambda g: setattr(g.nvlinks[17], "ecc_data_errors", 1),
            lambda g: g.nvlinks[0].ClearField("replay_errors"),  # absent, not 0
            lambda g: g.nvlinks.add(link=18, up=True),
        ],
        ids=["link-down", "counter", "absent-counter", "extra-link"],
    )
    def test_any_link_change_changes_the_key(self, change):
        a = report_18_links(1).gpus[5]
        b = report_18_links(1).gpus[5]
        change(b)
        assert links_key(a) != links_key(b)

    def test_record_boundaries_count(self):
        """[{link 1}, {up}] and [{link 1, up}, {}] carry the same bytes in a row, but are different links."""
        a, b = tpb.GpuSample(), tpb.GpuSample()
        a.nvlinks.add(link=1)
        a.nvlinks.add(up=True)
        b.nvlinks.add(link=1, up=True)
        b.nvlinks.add()
        assert links_key(a) != links_key(b)


class TestUnchangedLinksSkipTheRead:
    def run_due_reports(self, engine, clock, node, count: int, mutate=None) -> list:
        out = []
        for i in range(count):
            clock.advance(15)  # every report reads the NVLink counters
            r = report_18_links(clock.time_ms())
            if mutate is not None:
                mutate(r, i)
            out.append(engine.on_report(node, r))
        return out

    def test_errors_after_quiet_reads_are_seen(self):
        """After several identical counter reads, errors on one link open gpu.nvlink_errors at once."""
        engine, clock = make_engine()
        node = compute_node()
        engine.on_report(node, report_18_links(clock.time_ms()))
        assert self.run_due_reports(engine, clock, node, 3) == [[], [], []]

        def errors(r: tpb.Report, i: int) -> None:
            r.gpus[5].nvlinks[9].crc_data_errors = 1_000 * (i + 1)

        changes = self.run_due_reports(engine, clock, node, 1, errors)[0]
        assert opened(changes) == [("gpu.nvlink_errors", GPU5)]
        cond = engine.get("gpu.nvlink_errors", GPU5)
        assert cond is not None
        assert cond.evidence["link"] == 9

    def test_link_down_after_quiet_reads_and_back(self):
        """A link down on a counter read after identical ones opens; the same bytes again keep it open."""
        engine, clock = make_engine()
        node = compute_node()
        engine.on_report(node, report_18_links(clock.time_ms()))
        self.run_due_reports(engine, clock, node, 2)

        def down(r: tpb.Report, i: int) -> None:
            r.gpus[5].nvlinks[13].up = False

        first, second = self.run_due_reports(engine, clock, node, 2, down)
        assert opened(first) == [("gpu.nvlink_down", GPU5)]
        assert second == []  # unchanged links, down still: no resolve, no reopen
        cond = engine.get("gpu.nvlink_down", GPU5)
        assert cond is not None
        assert cond.count == 2
        assert cond.evidence["links_down"] == [13]
        assert resolved(self.run_due_reports(engine, clock, node, 1)[0]) == [("gpu.nvlink_down", GPU5)]

    def test_saturated_counter_is_read_every_time(self):
        """A counter stuck at its maximum is read on every counter read although the links are unchanged:
        its window gets a 'saturated' entry each time, as update_group's full path gives it."""
        engine, clock = make_engine()
        node = compute_node()

        def stuck(r: tpb.Report, i: int) -> None:
            r.gpus[5].nvlinks[2].crc_flit_errors = 0xFFFF_FFFF_FFFF_FFFF

        self.run_due_reports(engine, clock, node, 4, stuck)  # first sight, then 3 unchanged reads
        window = engine.rates._groups[GPU5].windows["nvlink-2/crc_flit_errors"]
        assert [(delta, saturated) for _, delta, saturated in window] == [(0, True)] * 3
        assert engine.rates.window_sum(GPU5, "nvlink-2/crc_flit_errors", 60, clock.time_ms()) == (0, True)
