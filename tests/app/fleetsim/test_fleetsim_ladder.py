"""The simulator plays the repair ladder's agent round trips: MTTR to the pool emerges from it.

Each rung takes the mix's time for the agent's answer (a reset a minute, a reboot ten), bounded
by the policy's limit for that rung; the validation passes once the rung reached is what puts
the fault right (scan, then the evidence's quiet time), and otherwise fails when the scan's wait
for the fault to clear runs out, which climbs to the next rung or to retired (RMA) and the
hardware repair. The rungs, limits and validation are the default policy's, through the
controller's own RepairLoop; the times below are worked out by hand from them.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from controller.heal.guards import GuardConfig
from controller.heal.ladder import RepairPolicy
from controller.heal.scheduler.sim import SimScheduler
from controller.settings import ControllerConfig, HealSettings
from starpulse.app.fleetsim.engine import Fault, JobSpec, SimResult, SimSettings, simulate
from starpulse.app.fleetsim.mix import MixError, load_mix

POLICY = RepairPolicy()  # the default ladder and validation (default_policy.yaml says the same)
QUIET_S = POLICY.validation("gpu_fault").evidence_quiet_s  # 120 s
CLEAR_S = POLICY.validation("gpu_fault").clear_within_s  # 300 s
RESET_S, REBOOT_S, SCAN_S, HARDWARE_S = 60.0, 600.0, 30.0, 7200.0


def _mix(tmp_path: Path, fixed_by: str, reboot_s: float = REBOOT_S, rule: str = "gpu.xid.reboot") -> Path:
    path = tmp_path / "mix.yaml"
    path.write_text(
        "source: test\ndays: 1\ngpus: 1000\n"
        "ladder:\n"
        f"  reset_gpu: {{value: {RESET_S}, source: t}}\n"
        f"  reboot: {{value: {reboot_s}, source: t}}\n"
        f"  scan: {{value: {SCAN_S}, source: t}}\n"
        "  fixed_by: {reboot: 1}\n  fixed_by_source: t\n"
        "causes:\n"
        f"  - {{name: f, cause: gpu, count: 1, rule: {rule}, component: gpu, repair_h: {HARDWARE_S / 3600}, "
        f"repair_source: t, fixed_by: {fixed_by}, fixed_by_source: t}}\n"
    )
    return path


def _run(tmp_path: Path, mix: Path) -> tuple[SimResult, list[tuple[str, str]], list[str]]:
    job = JobSpec("llm", 8, restart_overhead_s=100.0)
    base = ControllerConfig(heal=HealSettings(SimScheduler([]), guards=GuardConfig(max_fleet_share=1.0)))
    db = tmp_path / "sim.db"
    result = simulate(SimSettings(8, 2, 1.0, (job,), planned=False), load_mix(mix), base,
                      trace=[Fault(3600.0, "node-003", "f")], db_path=db)  # fmt: skip
    conn = sqlite3.connect(db)
    try:
        states = [
            (str(to), str(reason))
            for to, reason in conn.execute(
                "SELECT to_state, reason FROM heal_transitions WHERE node = 'node-003' ORDER BY at_ms, id"
            )
            if to not in ("suspect", "cordoned")  # the eviction's first steps
        ]
        sql = (
            "SELECT json_extract(e.value, '$.step') FROM heal_repairs, json_each(heal_repairs.evidence) AS e "
            "WHERE node = 'node-003'"
        )
        steps = [r[0] for r in conn.execute(sql)]
    finally:
        conn.close()
    return result, states, steps


def _mttr(result: SimResult) -> float:
    pool = result.report["mttr"]["fault_to_node_back_in_pool"]
    assert pool["count"] == 1 and pool["still_out"] == 0
    return float(pool["mean_s"])


def test_a_reboot_that_puts_it_right_returns_the_node_after_the_reboot_and_validation(tmp_path: Path) -> None:
    result, states, steps = _run(tmp_path, _mix(tmp_path, "{reboot: 1}"))
    assert _mttr(result) == pytest.approx(REBOOT_S + SCAN_S + QUIET_S, abs=1.0)
    assert [s for s, _ in states] == ["draining", "evicted", "repairing", "validating", "in_service"]
    assert states[2][1] == "reboot: rung 2 of gpu_fault"  # the policy's action for this Xid starts it there
    # (in service, not a spare: one of the two spares replaced it, so the pool is at its target of 1)
    assert steps == ["reboot", "return"]
    assert result.repairs == {"returned after reboot": 1}


def test_a_fault_only_hardware_fixes_climbs_to_retired_and_the_hardware_repair(tmp_path: Path) -> None:
    result, states, steps = _run(tmp_path, _mix(tmp_path, "{hardware: 1}"))
    # the reboot answers, the validation waits CLEAR_S for the fault to clear, then the ladder's end
    assert _mttr(result) == pytest.approx(REBOOT_S + CLEAR_S + HARDWARE_S, abs=1.0)
    assert [s for s, _ in states][:6] == ["draining", "evicted", "repairing", "validating", "retired", "repairing"]
    assert steps[:3] == ["reboot", "scan", "retire"]
    assert result.repairs == {"retired (RMA)": 1, "back from RMA": 1}


def test_a_reboot_past_the_policys_limit_is_the_next_rung(tmp_path: Path) -> None:
    limit = POLICY.timeout_s("reboot")  # 20 min
    result, states, steps = _run(tmp_path, _mix(tmp_path, "{reboot: 1}", reboot_s=limit + 600))
    assert [s for s, _ in states][2:4] == ["repairing", "retired"]  # no validation: the reboot never ended
    assert _mttr(result) == pytest.approx(limit + HARDWARE_S, abs=1.0)
    assert steps[:2] == ["reboot", "retire"]


def test_a_reset_that_does_not_help_climbs_one_rung_to_the_reboot(tmp_path: Path) -> None:
    """A DBE: the policy starts at the GPU reset; the fault needs a reboot."""
    result, states, steps = _run(tmp_path, _mix(tmp_path, "{reboot: 1}", rule="gpu.ecc_dbe"))
    assert _mttr(result) == pytest.approx(RESET_S + CLEAR_S + REBOOT_S + SCAN_S + QUIET_S, abs=1.0)
    assert [s for s, _ in states] == ["draining", "evicted", "repairing", "validating", "repairing", "validating",
                                      "in_service"]  # fmt: skip
    assert steps == ["reset_gpu", "scan", "reboot", "return"]


def test_the_packaged_mix_sources_every_ladder_number() -> None:
    ladder = load_mix().ladder
    assert ladder is not None
    assert set(ladder.sources) >= {"reset_gpu", "reboot", "scan", "fixed_by"}
    assert all(ladder.sources.values())
    assert abs(sum(p for _, p in ladder.default_fixed_by) - 1) < 1e-9


def test_a_bad_ladder_names_the_file_and_the_key(tmp_path: Path) -> None:
    path = _mix(tmp_path, "{reboot: 0.5, hardware: 0.4}")
    with pytest.raises(MixError, match=r"mix\.yaml: causes\[0\]\.fixed_by: the probabilities must add up to 1"):
        load_mix(path)
    path.write_text(path.read_text().replace("{reboot: 0.5, hardware: 0.4}", "{rma: 1}"))
    with pytest.raises(MixError, match=r"causes\[0\]\.fixed_by\.rma: not one of"):
        load_mix(path)
    path = _mix(tmp_path, "{reboot: 1}")
    path.write_text(path.read_text().replace("  reboot: {value: 600.0, source: t}\n", "  reboot: 600\n"))
    with pytest.raises(MixError, match=r"ladder\.reboot must be a mapping with value and source"):
        load_mix(path)


def test_a_node_the_policy_sends_to_rma_skips_the_ladder_and_comes_back_after_the_hardware_repair(
    tmp_path: Path,
) -> None:
    result, states, _ = _run(tmp_path, _mix(tmp_path, "{hardware: 1}", rule="gpu.xid.contact_support"))
    assert _mttr(result) == pytest.approx(HARDWARE_S, abs=1.0)
    assert [s for s, _ in states][:3] == ["draining", "evicted", "retired"]
    assert result.repairs == {"retired by the policy (RMA)": 1, "back from RMA": 1}
