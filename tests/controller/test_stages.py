"""Per-stage latency: one trace per event, each stage's share from the one before, shares add up."""

from __future__ import annotations

import pytest

from controller.metrics import ControllerMetrics
from controller.stages import STAGES, StageTracker


class Ticker:
    """A wall clock the test moves by hand."""

    def __init__(self, at: float = 1_000.0) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


def tracker(now: Ticker, **kw: int) -> tuple[StageTracker, ControllerMetrics]:
    metrics = ControllerMetrics()
    observe = lambda stage, s: metrics.event_stage_seconds.labels(stage).observe(s)  # noqa: E731
    return StageTracker(observe, now=now, **kw), metrics


def walk(t: StageTracker, now: Ticker, key: tuple[str, str] = ("xid", "node-001/gpu-2")) -> None:
    """read 1000.000, buffered +1 ms, sent +2 ms, then each controller stage 10 ms apart."""
    t.received("node-001", 7, "xid", "gpu-2", (1_000_000_000, 1_000_001_000, 1_000_003_000))
    for stage in ("condition", "incident", "outbox", "delivered"):
        now.at += 0.010
        if stage == "condition":
            t.conditions_opened("node-001", [7], [key])
        elif stage == "incident":
            t.incident_opened("inc-1", [key])
        elif stage == "outbox":
            t.queued("inc-1")
        else:
            t.delivered("inc-1")


def count(metrics: ControllerMetrics, stage: str) -> float:
    return metrics.registry.get_sample_value("starpulse_event_stage_seconds_count", {"stage": stage}) or 0.0


def total(metrics: ControllerMetrics, stage: str) -> float:
    return metrics.registry.get_sample_value("starpulse_event_stage_seconds_sum", {"stage": stage}) or 0.0


class TestStageTracker:
    def test_every_stage_after_read_is_observed_once_and_the_shares_add_up(self) -> None:
        """A delivered trace: 7 shares on /metrics, summing to delivered - read, and one finished trace."""
        now = Ticker(1_000.010)
        t, metrics = tracker(now)
        walk(t, now)
        assert [count(metrics, s) for s in STAGES[1:]] == [1.0] * 7
        assert count(metrics, "read") == 0
        assert total(metrics, "buffered") == pytest.approx(0.001)
        assert total(metrics, "sent") == pytest.approx(0.002)
        assert total(metrics, "received") == pytest.approx(0.007)
        assert total(metrics, "delivered") == pytest.approx(0.010)
        (done,) = t.done
        assert sum(total(metrics, s) for s in STAGES[1:]) == pytest.approx(done.total_s())
        assert done.total_s() == pytest.approx(now.at - 1_000.0)
        assert t.open_traces() == 0

    def test_an_agent_clock_ahead_counts_as_zero_not_negative(self) -> None:
        """Sent stamped after the controller's receipt: the received share is 0, the total stays exact."""
        now = Ticker(999.0)
        t, metrics = tracker(now)
        t.received("node-001", 1, "xid", "gpu-0", (1_000_000_000, 0, 1_000_002_000))
        assert total(metrics, "received") == 0.0
        assert count(metrics, "buffered") == 0  # no buffered stamp (a replayed event): no share

    def test_events_that_open_no_condition_are_forgotten(self) -> None:
        """An event batch without an opened condition leaves no trace behind."""
        now = Ticker()
        t, _ = tracker(now)
        t.received("node-001", 1, "xid", "gpu-0", (0, 0, 0))
        t.conditions_opened("node-001", [1], [])
        assert t.open_traces() == 0

    def test_traces_waiting_for_a_stage_are_bounded(self) -> None:
        """Beyond max_open the oldest waiting trace is dropped."""
        now = Ticker()
        t, _ = tracker(now, max_open=3)
        for seq in range(10):
            t.received("node-001", seq, "xid", "gpu-0", (0, 0, 0))
        assert t.open_traces() == 3

    def test_an_incident_follows_its_earliest_condition(self) -> None:
        """Two traced conditions in one incident: the trace that arrived first is the one continued."""
        now = Ticker()
        t, _ = tracker(now)
        t.received("node-001", 1, "xid", "gpu-0", (0, 0, 0))
        t.conditions_opened("node-001", [1], [("xid", "node-001/gpu-0")])
        now.at += 1
        t.received("node-001", 2, "xid", "gpu-1", (0, 0, 0))
        t.conditions_opened("node-001", [2], [("xid", "node-001/gpu-1")])
        t.incident_opened("inc-1", [("xid", "node-001/gpu-1"), ("xid", "node-001/gpu-0")])
        t.queued("inc-1")
        t.delivered("inc-1")
        assert [d.component for d in t.done] == ["gpu-0"]
