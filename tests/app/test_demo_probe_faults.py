"""The demo's fault mix includes the faults only probes see, where it runs the probe mesh (issue 29)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from agent.sim.probe_fabric import SimProbeFabric
from agent.sim.probe_fabric import component as plane_component
from controller.heal.scheduler.sim import SimScheduler
from starpulse.app.demo import demo_fabric, demo_probes
from starpulse.app.demo_faults import PROBE_DEMO, FaultPacer, ProbeFault, probe_menu


def _pacer(plane: SimProbeFabric | None, seed: int = 7) -> tuple[FaultPacer, Any]:
    fabric = demo_fabric(4)
    sims: Any = [SimpleNamespace(node_id=n) for n in fabric.nodes()]
    scheduler = SimScheduler(list(fabric.nodes()))
    scheduler.add_job("demo-train", [n for n in fabric.nodes() if not fabric.is_spare(n)])
    controller: Any = SimpleNamespace(healer=None)
    pacer = FaultPacer(fabric, sims, {}, controller, scheduler, lambda: "[t]", seed=seed, plane=plane)
    return pacer, fabric


def test_the_menu_is_the_fault_tables_fabric_probe_kinds() -> None:
    assert [k for k, _ in probe_menu()] == ["switch_silent_drop", "link_loss", "link_delay"]
    assert all(params == PROBE_DEMO[k] for k, params in probe_menu())


def test_with_the_mesh_on_the_second_of_every_four_drawn_faults_acts_on_the_data_plane(capsys: Any) -> None:
    seen: set[str] = set()
    for seed in range(12):
        fabric = demo_fabric(4)
        plane = SimProbeFabric(fabric.leaf_of, fabric.spines_of)
        pacer, fabric = _pacer(plane, seed)
        pacer.injected = 1  # the next drawn fault is the second of four
        pacer.maybe_inject(pacer.next_at)
        assert pacer.probe_faults == 1 and len(pacer.active) == 1
        _, fault, kind, target, _ = pacer.active[0]
        assert isinstance(fault, ProbeFault) and kind in PROBE_DEMO
        seen.add(kind)
        # it acts on the data plane alone: the loss or delay is on the leaf or its cable to a spine
        assert set({**plane.loss, **plane.delay_s}) == {plane_component(target)}
        if kind == "switch_silent_drop":
            assert fabric.kind(target) == "leaf"
        else:
            assert {fabric.kind(end) for end in target.split("<->")} == {"leaf", "spine"}
        pacer.clear_due(pacer.active[0][0])
        assert not plane.loss and not plane.delay_s
    assert seen == set(PROBE_DEMO)  # every kind is drawn
    assert "only the probe mesh" in capsys.readouterr().out


def test_without_the_mesh_no_probe_fault_is_drawn() -> None:
    pacer, _ = _pacer(None)
    assert pacer.probe_menu == []


def test_the_demo_runs_the_mesh_at_the_controllers_thresholds_on_windows_sped_up() -> None:
    probes = demo_probes()
    assert probes.enabled and probes.window_s == 4 and probes.localise_window_s == 20.0
    assert probes.loss_threshold == type(probes)().loss_threshold  # the thresholds are the product's
