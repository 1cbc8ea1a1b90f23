"""Delta reports: the agent sends only NIC counters that changed since the last full report."""

from __future__ import annotations

import pytest

from agent.transport.delta import MAPS, ReportDelta
from starpulse.v1 import telemetry_pb2 as tpb


def report(seq: int, symbol_error: int = 0, xmit: int = 0, ports: int = 2) -> tpb.Report:
    r = tpb.Report(seq=seq, timestamp_ms=1000 * seq)
    r.gpus.add(index=0, uuid="GPU-0", power_w=300.0 + seq)
    for i in range(ports):
        n = r.nics.add(rdma_device=f"mlx5_{i}", port=1, netdev=f"ibp{i}", state_code=4, rate_gbps=400)
        n.counters["symbol_error"] = symbol_error if i == 1 else 0
        n.counters["port_xmit_data"] = xmit + i
        n.counters["link_downed"] = 0
        n.hw_counters["out_of_sequence"] = 7
        n.netdev_stats["rx_bytes"] = 100
        n.ethtool_stats["rx_prio3_pause"] = 5
    return r


def merged(base: tpb.Report, delta: tpb.Report) -> tpb.Report:
    """What the controller may rely on: base counters overlaid with the delta's."""
    out = tpb.Report()
    out.CopyFrom(delta)
    out.counters_delta = False
    for nic, was in zip(out.nics, base.nics, strict=True):
        for name in MAPS:
            full = dict(getattr(was, name))
            full.update(getattr(nic, name))
            m = getattr(nic, name)
            m.clear()
            m.update(full)
    return out


class TestReportDelta:
    def test_disabled_sends_every_report_whole(self) -> None:
        """A controller that does not accept deltas gets the very report, unchanged."""
        enc = ReportDelta()
        enc.reset(enabled=False)
        for seq in (1, 2, 3):
            r = report(seq, xmit=seq)
            assert enc.encode(r) is r

    def test_first_full_then_only_changed_counters(self) -> None:
        """After the first (full) report, a port's maps carry only what moved; the rest is complete."""
        enc = ReportDelta()
        enc.reset(enabled=True)
        first = report(1, xmit=10)
        assert enc.encode(first) is first and not first.counters_delta
        second = report(2, xmit=20, symbol_error=3)
        out = enc.encode(second)
        assert out.counters_delta and out is not second
        assert dict(out.nics[0].counters) == {"port_xmit_data": 20}
        assert dict(out.nics[1].counters) == {"port_xmit_data": 21, "symbol_error": 3}
        assert not out.nics[0].hw_counters and not out.nics[0].netdev_stats and not out.nics[0].ethtool_stats
        assert out.gpus[0].power_w == 302.0 and out.nics[1].rate_gbps == 400 and out.seq == 2
        assert merged(first, out) == second
        assert len(second.nics[0].counters) == 3  # the agent's own report is left alone

    def test_deltas_are_against_the_last_full_report(self) -> None:
        """A change stays in every delta until the next full report, so a lost report loses nothing."""
        enc = ReportDelta()
        enc.reset(enabled=True)
        enc.encode(report(1))
        enc.encode(report(2, symbol_error=5))
        third = enc.encode(report(3, symbol_error=5))
        assert third.counters_delta and third.nics[1].counters["symbol_error"] == 5

    def test_full_report_every_n(self) -> None:
        enc = ReportDelta(full_every=3)
        enc.reset(enabled=True)
        kinds = [enc.encode(report(seq, xmit=seq)).counters_delta for seq in range(1, 8)]
        assert kinds == [False, True, True, False, True, True, False]
        assert (enc.full_sent, enc.delta_sent) == (3, 4)

    def test_controller_request_and_new_stream_force_a_full_report(self) -> None:
        enc = ReportDelta()
        enc.reset(enabled=True)
        enc.encode(report(1))
        assert enc.encode(report(2)).counters_delta
        enc.force_full()
        assert not enc.encode(report(3)).counters_delta
        assert enc.encode(report(4)).counters_delta
        enc.reset(enabled=True)
        assert not enc.encode(report(5)).counters_delta

    @pytest.mark.parametrize(
        "change",
        ["port_added", "port_removed", "counter_added", "counter_removed", "counter_renamed", "port_renamed"],
    )
    def test_layout_change_sends_a_full_report(self, change: str) -> None:
        """A delta cannot say 'this counter is gone': any change of ports or counter names goes out whole."""
        enc = ReportDelta()
        enc.reset(enabled=True)
        enc.encode(report(1))
        r = report(2, ports=3 if change == "port_added" else 1 if change == "port_removed" else 2)
        if change == "counter_added":
            r.nics[0].hw_counters["new_counter"] = 1
        elif change == "counter_removed":
            del r.nics[0].hw_counters["out_of_sequence"]
        elif change == "counter_renamed":  # same number of counters, other names (last port, last map)
            del r.nics[1].ethtool_stats["rx_prio3_pause"]
            r.nics[1].ethtool_stats["rx_prio4_pause"] = 5
        elif change == "port_renamed":
            r.nics[1].rdma_device = "mlx5_9"
        out = enc.encode(r)
        assert out is r and not out.counters_delta
        again = tpb.Report()
        again.CopyFrom(r)
        again.seq = 3
        assert enc.encode(again).counters_delta  # the new layout is the base now

    def test_encode_into_matches_encode_and_leaves_the_report_alone(self) -> None:
        """The link's path (one copy into its AgentMessage) sends exactly what encode() gives."""
        from starpulse.v1 import service_pb2 as spb

        enc, into = ReportDelta(full_every=4), ReportDelta(full_every=4)
        enc.reset(enabled=True)
        into.reset(enabled=True)
        for seq in range(1, 10):
            r = report(seq, xmit=seq, symbol_error=seq // 3)
            r.nics[0].hw_counters["out_of_sequence"] = 7 + seq // 5
            kept = tpb.Report()
            kept.CopyFrom(r)
            msg = spb.AgentMessage()
            is_delta = into.encode_into(r, msg.report)
            expected = enc.encode(r)
            assert msg.report == expected and is_delta == expected.counters_delta
            assert r == kept
        assert (into.full_sent, into.delta_sent) == (3, 6)
        off = ReportDelta()
        msg = spb.AgentMessage()
        assert not off.encode_into(report(1), msg.report) and msg.report == report(1)

    def test_full_every_must_be_positive(self) -> None:
        with pytest.raises(ValueError):
            ReportDelta(full_every=0)


# -- NVLinks ---------------------------------------------------------------------------------
def linked(seq: int, gpus: int = 2, links: int = 4) -> tpb.Report:
    """``report(seq)`` with ``gpus`` GPUs of ``links`` healthy NVLinks each."""
    r = report(seq)
    del r.gpus[:]
    for i in range(gpus):
        g = r.gpus.add(index=i, uuid=f"GPU-{i}", power_w=300.0 + seq)
        for n in range(links):
            g.nvlinks.add(link=n, up=True, replay_errors=0, recovery_errors=0, crc_flit_errors=0)
    return r


def merged_links(base: tpb.Report, delta: tpb.Report) -> dict[int, list[tpb.NvLinkSample]]:
    """What the controller may rely on: each GPU's base links, replaced by the delta's of the same number."""
    out: dict[int, list[tpb.NvLinkSample]] = {}
    for g, was in zip(delta.gpus, base.gpus, strict=True):
        sent = {nl.link: nl for nl in g.nvlinks}
        out[g.index] = [sent.get(nl.link, nl) for nl in was.nvlinks]
    return out


class TestNvLinkDelta:
    def test_unchanged_links_are_left_out_changed_ones_sent_whole(self) -> None:
        """A delta carries only the links whose record differs from the full report's, field for field."""
        enc = ReportDelta()
        enc.reset(enabled=True)
        first = linked(1)
        assert not enc.encode(first).counters_delta
        second = linked(2)
        second.gpus[0].nvlinks[2].up = False  # state
        second.gpus[1].nvlinks[0].replay_errors = 7  # a counter
        second.gpus[1].nvlinks[3].ClearField("crc_flit_errors")  # a counter's presence (0 -> absent)
        out = enc.encode(second)
        assert out.counters_delta
        assert [nl.link for nl in out.gpus[0].nvlinks] == [2]
        assert not out.gpus[0].nvlinks[0].up
        assert [nl.link for nl in out.gpus[1].nvlinks] == [0, 3]
        assert out.gpus[1].nvlinks[0] == second.gpus[1].nvlinks[0]  # the whole record, not a diff
        assert not out.gpus[1].nvlinks[1].HasField("crc_flit_errors")
        assert out.gpus[0].power_w == 302.0  # the rest of the GPU sample is complete
        assert merged_links(first, out) == {g.index: list(g.nvlinks) for g in second.gpus}
        assert len(second.gpus[0].nvlinks) == 4  # the agent's own report is left alone

    def test_quiet_links_cost_nothing_on_the_wire(self) -> None:
        enc = ReportDelta()
        enc.reset(enabled=True)
        enc.encode(linked(1, gpus=8, links=18))
        out = enc.encode(linked(2, gpus=8, links=18))
        assert out.counters_delta and len(out.gpus) == 8
        assert all(len(g.nvlinks) == 0 for g in out.gpus)

    def test_a_link_down_after_the_full_report_is_in_every_delta(self) -> None:
        """Against the last FULL report: the down link goes out until a full report carries it."""
        enc = ReportDelta(full_every=4)
        enc.reset(enabled=True)
        enc.encode(linked(1))
        kinds = []
        for seq in range(2, 7):
            r = linked(seq)
            r.gpus[1].nvlinks[1].up = False
            out = enc.encode(r)
            kinds.append((out.counters_delta, [nl.link for nl in out.gpus[1].nvlinks]))
        # seq 2-4: deltas with link 1; seq 5: full (the down link is in the base now); seq 6: nothing
        assert kinds == [(True, [1]), (True, [1]), (True, [1]), (False, [0, 1, 2, 3]), (True, [])]

    @pytest.mark.parametrize("change", ["link_added", "link_removed", "link_renumbered", "gpu_added", "gpu_removed"])
    def test_link_set_change_sends_a_full_report(self, change: str) -> None:
        """A delta cannot say 'this link is gone': a GPU or a link coming or going goes out whole."""
        enc = ReportDelta()
        enc.reset(enabled=True)
        enc.encode(linked(1))
        r = linked(2, gpus=3 if change == "gpu_added" else 1 if change == "gpu_removed" else 2)
        if change == "link_added":
            r.gpus[1].nvlinks.add(link=4, up=True)
        elif change == "link_removed":
            del r.gpus[1].nvlinks[3]
        elif change == "link_renumbered":  # same count, other numbers, records otherwise equal
            r.gpus[1].nvlinks[3].link = 9
        out = enc.encode(r)
        assert out is r and not out.counters_delta
        again = tpb.Report()
        again.CopyFrom(r)
        again.seq = 3
        out = enc.encode(again)
        assert out.counters_delta and all(not g.nvlinks for g in out.gpus)  # the new layout is the base

    def test_gpu_renumbered_sends_a_full_report(self) -> None:
        enc = ReportDelta()
        enc.reset(enabled=True)
        enc.encode(linked(1))
        r = linked(2)
        r.gpus[1].index = 5
        assert not enc.encode(r).counters_delta

    def test_force_full_sends_every_link(self) -> None:
        enc = ReportDelta()
        enc.reset(enabled=True)
        enc.encode(linked(1))
        assert all(not g.nvlinks for g in enc.encode(linked(2)).gpus)
        enc.force_full()
        out = enc.encode(linked(3))
        assert not out.counters_delta and [len(g.nvlinks) for g in out.gpus] == [4, 4]
        assert all(not g.nvlinks for g in enc.encode(linked(4)).gpus)
