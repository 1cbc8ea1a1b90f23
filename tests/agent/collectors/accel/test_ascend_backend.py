"""The Ascend backend: npu-smi parsers over recorded real outputs and generated ones, fault levels, collector.

The recorded outputs are read in place from ../shared/fixtures/vendors/ascend (skipped, with
the reason, where that folder is absent); the generated ones come from FakeNpuSmi, so the same
behaviour is covered without them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.collectors.accel import ascend_faults as faults
from agent.collectors.accel.ascend import AscendNpuCollector
from agent.collectors.accel.ascend_parse import parse_npu_health, parse_npu_smi_info
from agent.collectors.accel.base import AcceleratorBackend
from agent.sim.fake_npu_smi import FakeNpuSmi
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

SHARED = Path(__file__).resolve().parents[5] / "shared" / "fixtures" / "vendors" / "ascend"
FAULT_CODES = SHARED / "fault-codes.mindcluster.json"


def recorded(pattern: str) -> list[Path]:
    if not SHARED.is_dir():
        return []
    return sorted(SHARED.glob(pattern))


def needs_shared() -> None:
    if not SHARED.is_dir():
        pytest.skip(f"recorded Ascend outputs not here: {SHARED}")


@pytest.mark.parametrize("path", recorded("npu-smi-info.*.txt"), ids=lambda p: p.name)
def test_npu_smi_info_recorded(path: Path) -> None:
    """Every chip of each recorded table: ids, model, bus id, health raw and graded, HBM where listed."""
    want = json.loads(path.with_suffix(".expect.json").read_text())
    chips = parse_npu_smi_info(path.read_text())
    assert len(chips) == want["chip_count"]
    for chip, dev in zip(chips, want["devices"], strict=True):
        assert (chip.npu_id, chip.chip_id, chip.model, chip.bus_id) == (
            dev["npu_id"],
            dev["chip_id"],
            dev["model"],
            dev["bus_id"],
        )
        assert (chip.health_raw, chip.health) == (dev["health_raw"], dev["health"])
        if "hbm_total_mb" in dev:
            assert (chip.hbm_used_mb, chip.hbm_total_mb) == (dev["hbm_used_mb"], dev["hbm_total_mb"])


@pytest.mark.parametrize("path", recorded("npu-smi-health.*.txt"), ids=lambda p: p.name)
def test_npu_smi_health_recorded(path: Path) -> None:
    want = json.loads(path.with_suffix(".expect.json").read_text())
    health = parse_npu_health(path.read_text())
    assert (health.health_raw, health.health) == (want["health_raw"], want["health"])
    assert health.error_codes == want["error_codes"]
    assert health.error_information == want.get("error_information", [])


def test_recorded_alarm_codes_map_to_the_expected_action() -> None:
    """The recorded 910A alarm: MindCluster levels from the table read in place, the worst one's action."""
    needs_shared()
    path = SHARED / "npu-smi-health.910A-alarm-3codes.txt"
    want = json.loads(path.with_suffix(".expect.json").read_text())
    levels = faults.load_fault_levels(FAULT_CODES)
    health = parse_npu_health(path.read_text())
    assert {c: faults.level_of(c, levels, health.health) for c in health.error_codes} == want["mindcluster_levels"]
    actions = [faults.action_of(c, levels, health.health) for c in health.error_codes]
    assert faults.worst_action(actions) == want["suggested_action"]


def test_every_level_in_the_table_has_an_action() -> None:
    needs_shared()
    levels = faults.load_fault_levels(FAULT_CODES)
    assert len(levels) > 800 and set(levels.values()) <= set(faults.LEVEL_ACTION)


def test_a_broken_table_is_one_line_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "codes.json"
    bad.write_text('{"codes": [{"code": "80E01801", "mindcluster_level": "Nonsense"}]}')
    with pytest.raises(faults.FaultCodeError) as err:
        faults.load_fault_levels(bad)
    assert str(bad) in str(err.value) and "Nonsense" in str(err.value) and "\n" not in str(err.value)


def test_unknown_codes_follow_the_documented_rule() -> None:
    assert faults.level_of("DEADBEEF", {}, "warning") == "NotHandleFault"
    assert faults.action_of("DEADBEEF", {}, "critical") == "contact_support"


class TestGenerated:
    def test_generated_table_parses_like_a_recorded_one(self) -> None:
        fake = FakeNpuSmi(npu_count=8)
        fake.inject(3, "80E18005", health="Warning")
        chips = parse_npu_smi_info(fake.render_info())
        assert [c.npu_id for c in chips] == list(range(8))
        assert chips[3].health == "warning" and chips[0].health == "ok"
        assert chips[0].bus_id == f"0000:{fake.npus[0].bus:02X}:00.0"
        assert (chips[0].hbm_used_mb, chips[0].hbm_total_mb) == (2818, 32768)
        assert parse_npu_health(fake.render_health(3)).error_codes == ["80E18005"]

    def test_collector_inventory_samples_and_fault_findings(self) -> None:
        fake = FakeNpuSmi(npu_count=4)
        levels = {"80E18005": "RestartNPU", "80E01809": "NotHandleFault"}
        collector = AscendNpuCollector(fake)
        collector._levels = levels  # the table is Huawei's: a two-row one of our own here
        assert isinstance(collector, AcceleratorBackend) and collector.supported()
        inv = ipb.Inventory()
        collector.describe(inv)
        assert (inv.gpus[0].vendor, inv.gpus[0].model, inv.gpus[0].interconnect) == ("ascend", "Ascend 910B4", "hccs")
        report = tpb.Report()
        assert collector.collect(report) == []
        assert report.gpus[0].vendor_health == "OK" and report.gpus[0].temperature_c == 36
        assert not any(c[2:4] == ["-t", "health"] for c in fake.calls)  # healthy chips: one call per cycle

        fake.inject(2, "80E18005")
        fake.inject(2, "80E01809")
        findings = collector.collect(tpb.Report())
        assert [(f.kind, f.component, f.vendor, f.vendor_code, f.action, f.severity) for f in findings] == [
            ("accel_fault", "gpu-2", "ascend", "80E18005", "reset_gpu", "critical"),
            ("accel_fault", "gpu-2", "ascend", "80E01809", "none", "info"),
        ]
        assert findings[0].to_event().vendor_code == "80E18005"
        assert collector.collect(tpb.Report()) == []  # the same codes: reported once
        fake.clear(2)
        assert collector.collect(tpb.Report()) == []
        fake.inject(2, "80E18005")
        assert [f.vendor_code for f in collector.collect(tpb.Report())] == ["80E18005"]  # back: a new fault


# -- HCCS links (npu-smi info -t hccs), judged like any vendor's interconnect links -----------------

HCCS = Path(__file__).resolve().parents[3] / "fixtures" / "ascend" / "npu-smi"


def test_hccs_fixtures_parse_into_links() -> None:
    from agent.collectors.accel.ascend_parse import parse_hccs

    ok = parse_hccs((HCCS / "hccs.910B3-ok.txt").read_text())
    assert (ok.health_raw, len(ok.links), ok.links_down) == ("OK", 7, 0)
    assert {(link.lanes, link.errors, link.retries) for link in ok.links} == {("1111", 0, 0)}
    bad = parse_hccs((HCCS / "hccs.910B3-lane-down.txt").read_text())
    assert (bad.health_raw, bad.links_down) == ("NOK", 1)
    (down,) = [link for link in bad.links if not link.up]
    assert (down.link, down.lanes, down.errors, down.retries) == (2, "0000", 41, 17)
    assert not parse_hccs("").links


def test_hccs_links_fill_the_interconnect_fields() -> None:
    """Link state and errors in links/links_down, as AMD's XGMI: NVIDIA's nvlinks stay NVIDIA's."""
    fake = FakeNpuSmi(npu_count=4)
    collector = AscendNpuCollector(fake)
    inv = ipb.Inventory()
    collector.describe(inv)
    assert {(g.interconnect, g.link_count) for g in inv.gpus} == {("hccs", 7)}
    healthy = tpb.Report()
    collector.collect(healthy)
    assert {(len(g.links), g.links_down, len(g.nvlinks)) for g in healthy.gpus} == {(7, 0, 0)}
    fake.hccs_down(3, 4, errors=9)
    report = tpb.Report()
    assert collector.collect(report) == []  # a state the controller judges from every report, not an event
    gpu = report.gpus[3]
    assert gpu.links_down == 1 and [(lk.link, lk.errors) for lk in gpu.links if not lk.up] == [(4, 9)]
    assert report.gpus[2].links_down == 0


def test_hccs_link_down_opens_gpu_link_down_on_the_controller() -> None:
    """The report of a real collector, judged by the real condition engine with the default rules."""
    from controller.detect.conditions import ConditionEngine
    from controller.detect.rules import load_rules
    from controller.ingest.registry import NodeRecord
    from starpulse.core.clock import FakeClock

    fake = FakeNpuSmi(npu_count=4)
    collector = AscendNpuCollector(fake)
    inv = ipb.Inventory()
    collector.describe(inv)
    node = NodeRecord(node_id="node-004", role=ipb.NODE_ROLE_COMPUTE, state="online", first_seen_ms=0, last_seen_ms=0)
    node.inventory = inv
    clock = FakeClock(1_000_000)
    engine = ConditionEngine(load_rules(), clock=clock)

    def judged(seq: int) -> list[tuple[str, str]]:
        report = tpb.Report(seq=seq, timestamp_ms=clock.time_ms())
        collector.collect(report)
        changes = engine.on_report(node, report)
        clock.advance(1)
        return [(c.kind, *c.condition.key) for c in changes]

    assert judged(1) == []
    fake.hccs_down(1, 0)
    assert ("opened", "gpu.link_down", "node-004/gpu-1") in judged(2)
    fake.hccs_up(1, 0)
    assert ("resolved", "gpu.link_down", "node-004/gpu-1") in judged(3)


def test_an_npu_smi_without_hccs_is_asked_once() -> None:
    """An npu-smi (or chip) that has no HCCS query: no links, and not asked again every cycle."""
    fake = FakeNpuSmi(npu_count=2)
    asked: list[list[str]] = []

    def run(argv: list[str]) -> str:
        if "hccs" in argv:
            asked.append(argv)
            from agent.collectors.base import CollectorUnsupported

            raise CollectorUnsupported("npu-smi info -t hccs: exit 1: not supported")
        return fake(argv)

    collector = AscendNpuCollector(run)
    for _ in range(3):
        report = tpb.Report()
        collector.collect(report)
        assert {(len(g.links), g.HasField("links_down")) for g in report.gpus} == {(0, False)}
    assert len(asked) == 2
