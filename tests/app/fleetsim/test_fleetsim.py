"""`starpulse simulate`: the fleet simulator on the controller's own decision code.

A one-day smoke run; a hand-made trace whose job accounting is worked out by hand; the
short version of the check against Kokolis et al.'s closed form and the Young/Daly optimum
(the full one: bench/fleetsim.py); the mix file's errors.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from controller.heal.guards import GuardConfig
from controller.heal.scheduler.sim import SimScheduler
from controller.settings import ControllerConfig, HealSettings
from starpulse.app import cli
from starpulse.app.cli.fleetsim import _swept, spare_count
from starpulse.app.fleetsim.engine import Fault, JobSpec, SimSettings, simulate
from starpulse.app.fleetsim.mix import MixError, load_mix

GENEROUS = GuardConfig(max_evictions_per_window=1000, max_fleet_share=1.0)  # no guard in the way


def _mix(tmp_path: Path, repair_h: float = 1.0, count: int = 100, days: float = 1.0, gpus: int = 1000) -> Path:
    """A one-cause mix: a GPU fault (Xid 79: evict, reboot) at ``count`` per ``days`` x ``gpus``."""
    path = tmp_path / "mix.yaml"
    path.write_text(
        f"source: test\ndays: {days}\ngpus: {gpus}\ncauses:\n"
        f"  - {{name: xid79, cause: gpu, count: {count}, rule: gpu.xid.reboot, component: gpu, "
        f"repair_h: {repair_h}, repair_source: test}}\n"
    )
    return path


def _base(guards: GuardConfig = GENEROUS) -> ControllerConfig:
    return ControllerConfig(heal=HealSettings(SimScheduler([]), guards=guards))


def test_a_one_day_smoke_run_goes_through_the_controllers_decisions() -> None:
    settings = SimSettings(nodes=32, spares=4, days=1.0, jobs=(JobSpec("llm", 24),), rate_scale=60.0, seed=3)
    result = simulate(settings, load_mix(), _base())
    body = result.to_dict()
    assert sum(result.faults.values()) > 5
    assert 0.0 < result.ettr < 1.0
    assert result.decisions and all(d["incident"].startswith("inc-") for d in result.decisions)
    incidents = sum(n for cause, n in result.faults.items() if cause not in ("software_job", "hang"))
    # the report read from the run's own database counts the incidents the controller opened
    assert result.report["faults"]["total"] >= incidents
    assert body["faults_per_1000_gpu_days"] > 0
    assert result.evictions >= 1 and result.spares_used >= 1
    assert json.dumps(body)  # plain data


def test_a_hand_made_trace_gives_the_hand_worked_ettr(tmp_path: Path) -> None:
    """One job of 8 nodes, checkpoint every 1,000 s (w = 0), u0 = 100 s; a GPU fault at 5,500 s
    on one of its nodes: 500 s of work lost, then detection's grouping window and u0 until it
    runs again on a spare. Over a day: ETTR = (86,400 - 500 - window - 100) / 86,400."""
    job = JobSpec("llm", 8, checkpoint_interval_s=1000.0, checkpoint_write_s=0.0, restart_overhead_s=100.0)
    settings = SimSettings(nodes=8, spares=2, days=1.0, jobs=(job,), planned=False)
    mix = load_mix(_mix(tmp_path, repair_h=2.0))
    result = simulate(settings, mix, _base(), trace=[Fault(5500.0, "node-003", "xid79")])
    cfg = ControllerConfig().detection.correlation
    window = min(cfg.node_window_s, cfg.settle_s)  # a GPU condition waits the node-local grouping window
    assert result.jobs["llm"]["interruptions"] == 1
    assert result.jobs["llm"]["lost_compute_s"] == pytest.approx(500.0)
    assert result.jobs["llm"]["ettr"] == pytest.approx((86400 - 500 - window - 100) / 86400, abs=1e-6)
    assert (result.evictions, result.spares_used, result.evictions_without_spare) == (1, 1, 0)
    (decision,) = [d for d in result.decisions if d["outcome"] != "already_out_of_service"]  # its updates: no-ops
    assert (decision["kind"], decision["node"], decision["action"], decision["outcome"]) == (
        "gpu_fault", "node-003", "reboot", "ok"
    )  # fmt: skip
    # the repair (2 h, from the mix) ends through the repair loop's return: node back, incident resolved
    assert result.report["mttr"]["fault_to_node_back_in_pool"]["mean_s"] == pytest.approx(7200.0, abs=1.0)


def test_without_a_spare_the_job_waits_for_the_repaired_node(tmp_path: Path) -> None:
    job = JobSpec("llm", 8, checkpoint_interval_s=1000.0, checkpoint_write_s=0.0, restart_overhead_s=100.0)
    settings = SimSettings(nodes=8, spares=0, days=1.0, jobs=(job,), planned=False)
    result = simulate(
        settings, load_mix(_mix(tmp_path, repair_h=2.0)), _base(), trace=[Fault(5500.0, "node-003", "xid79")]
    )
    assert result.evictions_without_spare == 1
    assert result.jobs["llm"]["waited_s"] == pytest.approx(7200.0, abs=5.0)  # the repair, less the window
    assert result.capacity_wait_share == pytest.approx(result.jobs["llm"]["waited_s"] / 86400)


def _closed_form(n_nodes: int, r_f_per_s: float, u0: float, dt: float, w: float) -> float:
    """Kokolis et al.: E[ETTR] ~ (1 - N r_f (u0 + dt/2)) / (1 + w/dt)."""
    return (1 - n_nodes * r_f_per_s * (u0 + dt / 2)) / (1 + w / dt)


def test_lost_time_agrees_with_the_closed_form_within_ten_percent(tmp_path: Path) -> None:
    """With its assumptions met (spares enough, fixed restart overhead, one failure rate), the
    simulated 1 - ETTR is within 10 % of the closed form's (three settings: bench/fleetsim.py)."""
    nodes, per_node_day, days, dt, u0, w = 64, 0.2, 20.0, 900.0, 300.0, 30.0  # ~ 250 job failures
    mix = load_mix(_mix(tmp_path, repair_h=0.5, count=int(per_node_day * 1000 * 100), days=100.0, gpus=8000))
    job = JobSpec("llm", nodes, checkpoint_interval_s=dt, checkpoint_write_s=w, restart_overhead_s=u0)
    result = simulate(SimSettings(nodes, spares=16, days=days, jobs=(job,), planned=False, seed=7), mix, _base())
    cfg = ControllerConfig().detection.correlation
    expected = _closed_form(nodes, per_node_day / 86400, u0 + min(cfg.node_window_s, cfg.settle_s), dt, w)
    assert result.jobs["llm"]["interruptions"] > 200
    assert result.jobs["llm"]["waited_s"] == 0.0  # the assumption holds: no capacity shortage
    assert abs((1 - result.ettr) - (1 - expected)) / (1 - expected) < 0.10


def test_the_best_checkpoint_interval_sits_near_young_daly(tmp_path: Path) -> None:
    """sqrt(2 w / (N r_f)) (~ 800 s here) beats a quarter of it and four times it."""
    nodes, per_node_day, w = 16, 1.0, 60.0
    mix = load_mix(_mix(tmp_path, repair_h=0.5, count=int(per_node_day * 1000 * 100), days=100.0, gpus=8000))
    best = math.sqrt(2 * w / (nodes * per_node_day / 86400))
    ettr = {}
    for dt in (best / 4, best, best * 4):
        job = JobSpec("llm", nodes, checkpoint_interval_s=dt, checkpoint_write_s=w, restart_overhead_s=300.0)
        ettr[dt] = simulate(SimSettings(nodes, 16, 6.0, (job,), planned=False, seed=11), mix, _base()).ettr
    assert ettr[best] > ettr[best / 4] + 0.03 and ettr[best] > ettr[best * 4] + 0.03


def test_a_bad_mix_names_the_file_and_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("days: 1\ngpus: 8\ncauses:\n  - {name: x, count: 1, rule: gpu.xid.reboot, component: disk}\n")
    with pytest.raises(MixError, match=r"bad\.yaml: causes\[0\]\.component"):
        load_mix(bad)
    bad.write_text("days: 1\ngpus: 8\ncauses:\n  - {name: x, count: 1, rule: none, repair_h: 0}\n")
    with pytest.raises(MixError, match=r"causes\[0\]\.repair_source is required"):
        load_mix(bad)


def test_the_packaged_mix_is_llama_3s_table() -> None:
    mix = load_mix()
    assert (mix.unplanned, mix.planned, mix.days, mix.gpus) == (419, 47, 54, 16384)
    assert mix.rate_per_gpu_day() * 1000 == pytest.approx(0.4736, abs=1e-4)
    assert all(c.repair_source for c in mix.causes)


def test_the_command_sweeps_and_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["simulate", "--nodes", "16", "--spares", "2", "--days", "1", "--sweep", "spares=0,2", "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "starpulse.v1/simulation"
    assert [r["sweep"] for r in doc["runs"]] == [{"spares": "0"}, {"spares": "2"}]


def test_the_command_refuses_a_bad_sweep_and_a_missing_policy(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["simulate", "--sweep", "colour=red"])
    assert "KEY one of" in capsys.readouterr().err
    assert cli.main(["simulate", "--nodes", "8", "--days", "1", "--policy", "/nonexistent.yaml"]) == 2
    assert "--policy /nonexistent.yaml" in capsys.readouterr().err


def test_guards_from_the_settings_are_the_ones_applied(tmp_path: Path) -> None:
    """A budget of one eviction per hour refuses the second of two faults ten minutes apart."""
    tight = dataclasses.replace(GENEROUS, max_evictions_per_window=1, window_s=3600.0)
    job = JobSpec("llm", 8, restart_overhead_s=100.0)
    trace = [Fault(1000.0, "node-001", "xid79"), Fault(1600.0, "node-002", "xid79")]
    result = simulate(SimSettings(8, 2, 1.0, (job,), planned=False), load_mix(_mix(tmp_path)), _base(tight), trace)
    acted = [(d["node"], d["outcome"]) for d in result.decisions if d["outcome"] != "already_out_of_service"]
    assert acted == [("node-001", "ok"), ("node-002", "budget")]
    assert result.refused == {"budget": 1}


def test_a_budget_share_sweep_sets_the_guards_share(tmp_path: Path) -> None:
    """--sweep budget_share=0.04%: the guards' max_evictions_share, written as a share or a fraction."""
    settings = SimSettings(8, 2, 1.0, (JobSpec("llm", 8),), planned=False)
    for text in ("0.04%", "0.0004"):
        _, base = _swept(settings, _base(GENEROUS), "budget_share", text)
        assert base.heal.guards.max_evictions_share == pytest.approx(0.0004)
    with pytest.raises(ValueError, match="share of the fleet"):
        _swept(settings, _base(GENEROUS), "budget_share", "150%")


def test_spares_default_to_the_policys_share_and_take_a_share(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 28 item 6: without --spares the fleet keeps the policy's spare share (1.2 %: 1 spare
    at 16 nodes, 4 at 256); a sweep or --spares takes a share of the working nodes too."""
    assert [spare_count(v, 256) for v in ("0", "3", "0.8%", "2%", "0%")] == [0, 3, 3, 6, 0]
    with pytest.raises(ValueError, match=r"share like 0\.8%"):
        spare_count("many", 256)
    code = cli.main(["simulate", "--nodes", "16", "--days", "0.5", "--sweep", "spares=0%,25%", "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["settings"]["spares"] for r in doc["runs"]] == [0, 4]
    assert cli.main(["simulate", "--nodes", "16", "--days", "0.5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["runs"][0]["settings"]["spares"] == 1
    with pytest.raises(SystemExit):
        cli.main(["simulate", "--spares", "lots"])
    assert "--spares" in capsys.readouterr().err


def test_the_default_breaker_opens_on_a_mass_event_not_on_independent_faults(tmp_path: Path) -> None:
    """Issue 28 item 6 through the simulator with the default guards: 64 working nodes + 1 spare
    trip at 8 faulty nodes in 5 minutes. Six faults an hour apart: none refused by the breaker;
    13 nodes (a fifth) within a minute: it opens, and holds what the budget would have let by."""
    job = JobSpec("llm", 64, restart_overhead_s=100.0)
    settings = SimSettings(64, 1, 1.0, (job,), planned=False)
    mix = load_mix(_mix(tmp_path, repair_h=0.5))
    apart = [Fault(1000.0 + 3600.0 * i, f"node-{i:03d}", "xid79") for i in range(6)]
    calm = simulate(settings, mix, _base(GuardConfig()), apart)
    assert calm.breaker_trips == 0 and "breaker_open" not in calm.refused and calm.evictions == 6
    burst = [Fault(1000.0 + 4.0 * i, f"node-{i:03d}", "xid79") for i in range(13)]
    mass = simulate(settings, mix, _base(GuardConfig()), burst)
    assert mass.breaker_trips == 1 and mass.refused["breaker_open"] >= 1
    assert mass.evictions <= GuardConfig().max_evictions_per_window
