"""The report view: a delta report reads as the full report it stands for, before any rule sees it."""

from __future__ import annotations

from agent.transport.delta import ReportDelta
from controller.detect.model import ConditionChange
from controller.detect.view import ReportView
from starpulse.v1 import telemetry_pb2 as tpb
from tests.support.conditions import compute_node, good_report, make_engine

WATCHED = ("counters/symbol_error", "counters/link_downed", "hw_counters/out_of_sequence")
LINK_COUNTERS = ("crc_flit_errors", "crc_data_errors")
NIC5 = "node-003/nic-5"
GPU5 = "node-003/gpu-5"


def _traffic(r: tpb.Report, step: int) -> None:
    for i, n in enumerate(r.nics):
        n.counters["port_xmit_data"] = 1_000_000 * step + i


def _pair(step: int, edit=None) -> tuple[tpb.Report, tpb.Report, tpb.Report]:
    """(the first full report, a later report whole, the same report as a delta against the first)."""
    encoder = ReportDelta(full_every=1000)
    encoder.reset(enabled=True)
    first = good_report(0, links=4)
    _traffic(first, 0)
    encoder.encode(first)
    r = good_report(0, links=4)
    _traffic(r, step)
    if edit is not None:
        edit(r)
    delta = encoder.encode(r)
    assert delta.counters_delta
    return first, r, delta


def _read(view: ReportView, report: tpb.Report) -> tuple[list, list]:
    view.begin(report)
    nics = [view.nic_counters(f"node-003/nic-{i}", s) for i, s in enumerate(report.nics)]
    links = [view.links(f"node-003/gpu-{g.index}", g) for g in report.gpus]
    return nics, links


class TestView:
    def test_a_delta_reads_as_its_full_report(self) -> None:
        """Counters and links of a delta, laid over the last full report, equal the full report's own."""

        def edit(r: tpb.Report) -> None:
            r.nics[5].counters["symbol_error"] = 40
            r.gpus[5].nvlinks[2].up = False
            r.gpus[5].nvlinks[3].crc_flit_errors = 7

        first, full, delta = _pair(3, edit)
        by_delta, by_full = ReportView(WATCHED, LINK_COUNTERS), ReportView(WATCHED, LINK_COUNTERS)
        _read(by_delta, first)
        nics_d, links_d = _read(by_delta, delta)
        nics_f, links_f = _read(by_full, full)
        assert nics_d == nics_f
        assert nics_d[5] == (40, 0, 0)
        assert [(v.numbers, v.ups, v.down, v.values) for v in links_d] == [
            (v.numbers, v.ups, v.down, v.values) for v in links_f
        ]
        assert links_d[5].down == (2,)

    def test_untouched_parts_are_the_base_itself(self) -> None:
        """A port whose delta carries none of the watched counters, and a GPU whose delta carries no
        link, are their base objects: no counter or link is read again."""
        first, _, delta = _pair(2)
        view = ReportView(WATCHED, LINK_COUNTERS)
        nics_first, links_first = _read(view, first)
        assert all(not g.nvlinks for g in delta.gpus)  # traffic moved, nothing watched did
        nics, links = _read(view, delta)
        assert all(a is b for a, b in zip(nics, nics_first, strict=True))
        assert all(a is b for a, b in zip(links, links_first, strict=True))

    def test_a_delta_before_any_full_report_is_what_it_carries(self) -> None:
        """No base yet: a counter the delta leaves out is unknown (None), its links are all there is."""
        _, _, delta = _pair(2, lambda r: r.nics[0].counters.__setitem__("symbol_error", 5))
        view = ReportView(WATCHED, LINK_COUNTERS)
        nics, links = _read(view, delta)
        assert nics[0] == (5, None, None)
        assert links == [None] * 8
        assert view.link_base == {} and view.nic_base == {}

    def test_forget_drops_a_nodes_bases(self) -> None:
        first, _, _ = _pair(1)
        view = ReportView(WATCHED, LINK_COUNTERS)
        _read(view, first)
        assert view.link_base and view.nic_base
        view.forget("node-003")
        assert view.link_base == {} and view.nic_base == {}


def _changes(changes: list[ConditionChange]) -> list[tuple[str, str, str]]:
    return [(c.kind, c.condition.rule, c.condition.component) for c in changes]


class TestVerdicts:
    def test_the_same_verdicts_from_deltas_as_from_full_reports(self) -> None:
        """Faults of every report part come and go: an engine fed deltas says what one fed the
        whole reports says, report by report (field rules, counters, links, flags)."""
        full_engine, full_clock = make_engine()
        delta_engine, delta_clock = make_engine()
        node = compute_node()
        encoder = ReportDelta(full_every=5)
        encoder.reset(enabled=True)
        full_seen, delta_seen = [], []
        for step in range(48):
            r = good_report(0, links=4)
            r.seq = step + 1
            _traffic(r, step)
            if 4 <= step < 20:
                r.nics[5].counters["symbol_error"] = 900 * (step - 3)
            if step >= 20:
                r.nics[5].counters["symbol_error"] = 900 * 16
            if 6 <= step < 14:
                r.nics[2].phys_state_code = 6  # nic.link_error_recovery (nic_field)
            if 10 <= step < 26:
                r.gpus[5].remap_pending = True  # gpu.remap_pending (gpu_field)
            if 12 <= step < 30:
                r.gpus[3].nvlinks[1].up = False
            if step >= 16:
                r.gpus[1].nvlinks[0].crc_data_errors = 400 * min(step - 15, 10)
            if 22 <= step < 27:
                r.nics[7].state_code, r.nics[7].state = 1, "DOWN"
            msg = encoder.encode(r)
            for engine, clock, seen, m in (
                (full_engine, full_clock, full_seen, r),
                (delta_engine, delta_clock, delta_seen, msg),
            ):
                clock.advance(5)
                m.timestamp_ms = clock.time_ms()
                seen.append(_changes(engine.on_report(node, m)) + _changes(engine.tick()))
        assert encoder.delta_sent > 30
        assert full_seen == delta_seen
        rules = {rule for step in full_seen for kind, rule, _ in step if kind == "opened"}
        assert rules >= {
            "nic.phy_errors",
            "nic.link_error_recovery",
            "gpu.remap_pending",
            "gpu.nvlink_down",
            "gpu.nvlink_errors",
            "nic.port_down",
        }
