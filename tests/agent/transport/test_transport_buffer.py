"""The agent's on-disk event buffer and storm suppression."""

from __future__ import annotations

from pathlib import Path

from agent.transport.buffer import EventBuffer
from agent.transport.storm import StormSuppressor
from starpulse.core.clock import FakeClock
from starpulse.core.findings import Finding
from starpulse.v1 import telemetry_pb2 as tpb


def _event(msg: str) -> tpb.Event:
    return Finding("xid", "gpu-0", "fatal", "reboot", msg, "nvml", xid=79).to_event()


class TestEventBuffer:
    def test_sequence_is_contiguous_and_survives_reopen(self, tmp_path: Path) -> None:
        """Sequence numbers continue after the agent restarts, and unacked events are still there."""
        path = tmp_path / "buf.db"
        buf = EventBuffer(path)
        seqs = [buf.append(_event(f"e{i}")).seq for i in range(5)]
        assert seqs == [1, 2, 3, 4, 5]
        epoch = buf.epoch
        buf.close()
        again = EventBuffer(path)
        assert again.epoch == epoch
        assert [e.message for e in again.pending(0)] == ["e0", "e1", "e2", "e3", "e4"]
        assert again.append(_event("e5")).seq == 6

    def test_ack_forgets_only_acked_events(self, tmp_path: Path) -> None:
        """Acking seq N removes events ≤ N; later ones wait for their ack."""
        buf = EventBuffer(tmp_path / "b.db")
        for i in range(4):
            buf.append(_event(str(i)))
        assert buf.ack(2) == 2
        assert [e.seq for e in buf.pending(0)] == [3, 4]
        assert buf.oldest_seq() == 3

    def test_repeated_and_early_acks_still_forget_later_events(self, tmp_path: Path) -> None:
        """A re-ack is a no-op; an ack past the newest event does not shield events appended later."""
        buf = EventBuffer(tmp_path / "b.db")
        for i in range(3):
            buf.append(_event(str(i)))
        assert buf.ack(2) == 2
        assert buf.ack(2) == 0
        assert buf.ack(9) == 1  # the controller claims more than was appended (e.g. after a restore)
        for i in range(3, 7):
            buf.append(_event(str(i)))
        assert [e.seq for e in buf.pending(0)] == [4, 5, 6, 7]
        assert buf.ack(5) == 2
        assert buf.ack(5) == 0
        assert [e.seq for e in buf.pending(0)] == [6, 7]

    def test_overflow_drops_oldest_and_counts(self, tmp_path: Path) -> None:
        """A full buffer keeps the newest max_events and counts what it dropped."""
        buf = EventBuffer(tmp_path / "b.db", max_events=3)
        for i in range(5):
            buf.append(_event(str(i)))
        assert [e.seq for e in buf.pending(0)] == [3, 4, 5]
        assert buf.dropped_total == 2
        assert buf.oldest_seq() == 3

    def test_new_file_gets_new_epoch(self, tmp_path: Path) -> None:
        """A recreated buffer is a new epoch, so the controller cannot confuse it with a replay."""
        assert EventBuffer(tmp_path / "a.db").epoch != EventBuffer(tmp_path / "b.db").epoch


class TestStormSuppressor:
    def test_identical_findings_beyond_burst_become_one_summary(self) -> None:
        """10,000 identical XIDs pass `burst` times, then one summary carries the count."""
        clock = FakeClock(monotonic_s=0.0)
        storms = StormSuppressor(window_s=60, burst=5, clock=clock.monotonic)
        passed = [
            f
            for f in (
                storms.admit(Finding("xid", "gpu-1", "critical", "reset_gpu", "Xid 95", "kmsg", xid=95))
                for _ in range(10_000)
            )
            if f is not None
        ]
        assert len(passed) == 5
        assert storms.flush() == []  # window still open
        clock.advance(61)
        summaries = storms.flush()
        assert len(summaries) == 1
        assert summaries[0].attributes["suppressed"] == "9995"

    def test_different_components_are_not_merged(self) -> None:
        """Storm keys include the component: GPU 1 and GPU 2 each get their own burst."""
        storms = StormSuppressor(window_s=60, burst=1, clock=FakeClock(monotonic_s=0.0).monotonic)
        a = storms.admit(Finding("xid", "gpu-1", "critical", "reset_gpu", "x", "kmsg", xid=95))
        b = storms.admit(Finding("xid", "gpu-2", "critical", "reset_gpu", "x", "kmsg", xid=95))
        assert a is not None and b is not None

    def test_same_fault_from_two_sources_is_one_event(self) -> None:
        """NVML's Xid event and the kernel log's Xid line for one GPU become one event."""
        clock = FakeClock(monotonic_s=0.0)
        storms = StormSuppressor(window_s=60, burst=5, coalesce_s=5, clock=clock.monotonic)
        nvml = storms.admit(Finding("xid", "gpu-3", "fatal", "reboot", "Xid 79", "nvml", xid=79))
        clock.advance(0.2)
        kmsg = storms.admit(Finding("xid", "gpu-3", "fatal", "reboot", "NVRM: Xid 79", "kmsg", xid=79))
        clock.advance(9.8)  # 10 s after the first
        later = storms.admit(Finding("xid", "gpu-3", "fatal", "reboot", "NVRM: Xid 79", "kmsg", xid=79))
        assert nvml is not None and kmsg is None and later is not None
        assert storms.coalesced_total == 1
