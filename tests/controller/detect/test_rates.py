"""Counter deltas and rates: resets, saturation, windows, bounded memory."""

from __future__ import annotations

import pytest

from controller.detect.rates import DEFAULT_SATURATION, U8, U16, U32, CounterRate


class TestCounterRate:
    def test_first_sample_is_a_baseline(self):
        """The first value of a counter yields no sample: there is nothing to subtract yet."""
        cr = CounterRate()
        assert cr.update("node-1/nic-0", "counters/symbol_error", 1_000, 5) is None
        assert cr.last("node-1/nic-0", "counters/symbol_error") == 5

    def test_rate_per_second(self):
        """Delta over the sampling interval, per second."""
        cr = CounterRate()
        cr.update("n/nic-0", "hw_counters/out_of_sequence", 0, 100)
        r = cr.update("n/nic-0", "hw_counters/out_of_sequence", 5_000, 150)
        assert r is not None
        assert (r.delta, r.interval_s, r.rate, r.reset, r.saturated) == (50, 5.0, 10.0, False, False)

    @pytest.mark.parametrize(
        ("before", "after", "delta"),
        [
            (1_000, 7, 7),  # driver reload: counting again from zero
            (1_000, 0, 0),  # cleared and quiet
            (U32 - 1, 3, 3),  # a wide counter that restarted is still a reset, not a wrap
        ],
    )
    def test_reset_is_delta_since_reset(self, before, after, delta):
        """A value that goes down is a reset: the new value is the delta, never negative or huge."""
        cr = CounterRate()
        cr.update("n/nic-0", "hw_counters/packet_seq_err", 0, before)
        r = cr.update("n/nic-0", "hw_counters/packet_seq_err", 1_000, after)
        assert r is not None
        assert r.reset is True
        assert r.delta == delta
        assert r.rate == pytest.approx(float(delta))

    @pytest.mark.parametrize(
        ("counter", "saturation"),
        [
            ("counters/symbol_error", U16),
            ("counters/port_rcv_errors", U16),
            ("counters/link_downed", U8),
            ("counters/link_error_recovery", U8),
            ("counters/port_xmit_wait", U32),
            ("hw_counters/out_of_sequence", DEFAULT_SATURATION),
        ],
    )
    def test_saturation_table(self, counter, saturation):
        """Saturation values come from a table by counter name, with a 64-bit default."""
        assert CounterRate().saturation_of(counter) == saturation

    def test_reaching_saturation_is_flagged(self):
        """A 16-bit counter hitting 0xFFFF reports saturated: its delta is a lower bound."""
        cr = CounterRate()
        cr.update("n/nic-0", "counters/symbol_error", 0, 0xFF00)
        r = cr.update("n/nic-0", "counters/symbol_error", 1_000, U16)
        assert r is not None
        assert r.saturated is True
        assert r.delta == U16 - 0xFF00

    def test_stuck_at_saturation_is_not_a_zero_rate(self):
        """A counter stuck at its maximum keeps saying saturated, so rules report 'at least'."""
        cr = CounterRate()
        cr.update("n/nic-0", "counters/link_downed", 0, U8)
        r = cr.update("n/nic-0", "counters/link_downed", 5_000, U8)
        assert r is not None
        assert (r.delta, r.saturated) == (0, True)
        assert cr.window_sum("n/nic-0", "counters/link_downed", 60, 5_000) == (0, True)

    def test_custom_saturation_table(self):
        """Callers can pass their own table and default."""
        cr = CounterRate(saturation={"x": 10}, default_saturation=100)
        cr.update("e", "x", 0, 1)
        r = cr.update("e", "x", 1_000, 10)
        assert r is not None and r.saturated
        cr.update("e", "y", 0, 1)
        r = cr.update("e", "y", 1_000, 99)
        assert r is not None and not r.saturated

    def test_non_advancing_timestamp_rebases(self):
        """A duplicate or backwards timestamp gives no sample and becomes the new baseline."""
        cr = CounterRate()
        cr.update("e", "c", 5_000, 10)
        assert cr.update("e", "c", 5_000, 20) is None
        assert cr.update("e", "c", 4_000, 30) is None
        r = cr.update("e", "c", 6_000, 35)
        assert r is not None and r.delta == 5

    def test_window_sum_slides(self):
        """Deltas count only while inside the window, stamped with now_ms when given."""
        cr = CounterRate()
        cr.update("e", "c", 0, 0, now_ms=0)
        cr.update("e", "c", 10_000, 2, now_ms=10_000)
        cr.update("e", "c", 20_000, 5, now_ms=20_000)
        assert cr.window_sum("e", "c", 60, 20_000) == (5, False)
        assert cr.window_sum("e", "c", 5, 20_000) == (3, False)
        assert cr.window_sum("e", "c", 60, 75_000) == (3, False)
        assert cr.window_sum("e", "c", 60, 90_000) == (0, False)
        assert cr.window_sum("e", "unknown", 60, 90_000) == (0, False)

    def test_window_uses_controller_clock(self):
        """now_ms stamps the window independently of the agent's clock."""
        cr = CounterRate()
        cr.update("e", "c", 1_000_000, 0, now_ms=50)
        cr.update("e", "c", 1_005_000, 4, now_ms=5_050)
        assert cr.window_sum("e", "c", 10, 6_000) == (4, False)

    def test_window_memory_bounded(self):
        """Only max_window_entries non-zero deltas are kept per counter."""
        cr = CounterRate(max_window_entries=8)
        for i in range(100):
            cr.update("e", "c", i * 1000, i)
        assert cr.window_sum("e", "c", 3600, 100_000)[0] == sum(range(92, 100)) - sum(range(91, 99))

    def test_counters_per_entity_bounded(self):
        """New counters past max_counters_per_entity are ignored rather than growing memory."""
        cr = CounterRate(max_counters_per_entity=3)
        for i in range(10):
            cr.update("e", f"c{i}", 0, 1)
        assert len(cr) == 3
        assert cr.update("e", "c9", 1_000, 5) is None

    def test_forget_node_drops_everything_under_it(self):
        """forget('node-3') drops node-3's NICs and GPU links, not node-30's."""
        cr = CounterRate()
        for entity in ("node-3/nic-0", "node-3/gpu-1/nvlink-2", "node-30/nic-0", "leaf-b0-r3:Ethernet8"):
            cr.update(entity, "c", 0, 1)
        assert cr.forget("node-3") == 2
        assert sorted(cr.entities()) == ["leaf-b0-r3:Ethernet8", "node-30/nic-0"]
        assert cr.forget("leaf-b0-r3") == 1
        assert cr.forget("node-30/nic-0") == 1
        assert len(cr) == 0


class TestCounterGroups:
    NAMES = ("counters/symbol_error", "hw_counters/out_of_sequence")

    def test_unchanged_group_is_cheap_none(self):
        """A group whose values did not move returns None: no per-counter work."""
        cr = CounterRate()
        assert cr.update_group("n/nic-0", 0, self.NAMES, (1, 2)) == {}
        assert cr.update_group("n/nic-0", 5_000, self.NAMES, (1, 2)) is None

    def test_changed_group_uses_group_interval(self):
        """After quiet samples, a change is a rate over the interval since the previous group sample."""
        cr = CounterRate()
        cr.update_group("n/nic-0", 0, self.NAMES, (1, 2))
        cr.update_group("n/nic-0", 5_000, self.NAMES, (1, 2))
        out = cr.update_group("n/nic-0", 10_000, self.NAMES, (11, 2))
        assert out is not None
        assert out["counters/symbol_error"].delta == 10
        assert out["counters/symbol_error"].rate == pytest.approx(2.0)
        assert out["hw_counters/out_of_sequence"].delta == 0

    def test_saturated_group_stays_on_full_path(self):
        """A group holding a saturated counter never takes the fast path, so windows keep saying saturated."""
        cr = CounterRate()
        cr.update_group("n/nic-0", 0, self.NAMES, (U16, 0))
        out = cr.update_group("n/nic-0", 5_000, self.NAMES, (U16, 0))
        assert out is not None and out["counters/symbol_error"].saturated
        assert cr.window_sum("n/nic-0", "counters/symbol_error", 60, 5_000) == (0, True)

    def test_absent_counter_is_skipped(self):
        """A counter missing from this sample (None) is left alone."""
        cr = CounterRate()
        cr.update_group("n/nic-0", 0, self.NAMES, (1, None))
        out = cr.update_group("n/nic-0", 1_000, self.NAMES, (3, None))
        assert out is not None and set(out) == {"counters/symbol_error"}
