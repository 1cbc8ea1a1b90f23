"""The background loss test: the Poisson tail against a direct sum, and through the decision core
on a fake clock, an even background loss over the fleet opens nothing while a lossy leaf on top
of it is still blamed (issue 29, no cry wolf)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from controller.detect.probe_background import poisson_tail_at_most, stands_out
from tests.controller.test_probe_localise import Mesh


def _tail(k: int, lam: float) -> float:
    """P(X >= k), X ~ Poisson(lam), as one minus the head (a direct sum, for the check)."""
    return 1.0 - sum(math.exp(-lam) * lam**i / math.factorial(i) for i in range(k))


@pytest.mark.parametrize(("k", "lam"), [(3, 0.8), (8, 0.8), (6, 2.4), (15, 2.4), (30, 12.0), (60, 30.0)])
def test_the_tail_test_agrees_with_a_direct_sum(k: int, lam: float) -> None:
    tail = _tail(k, lam)
    assert poisson_tail_at_most(k, lam, tail * 1.01)
    assert not poisson_tail_at_most(k, lam, tail * 0.99)


def test_losses_at_the_background_rate_never_stand_out_and_no_background_lets_any_loss_stand_out() -> None:
    assert not stands_out(6, 1000, 0.006, 1e-6)  # exactly what the background predicts
    assert not stands_out(12, 800, 0.003, 1e-6)  # a few over, by chance among thousands of NICs
    assert stands_out(40, 800, 0.003, 1e-6)  # 5 % against 0.3 %
    assert stands_out(6, 800, 0.0, 1e-6)
    assert stands_out(1300, 100_000, 0.01, 1e-6) and not stands_out(1010, 100_000, 0.01, 1e-6)  # a leaf's counts


def _background(mesh: Mesh, share: float) -> None:
    """Every NIC's cable drops ``share`` per crossing: an even background on every path."""
    for nic in [n for n in mesh.fabric.graph.nodes if mesh.fabric.kind(n) == "nic"]:
        mesh.sim.inject_loss(nic, share)


def test_an_even_background_loss_opens_nothing_and_is_reported_once_as_the_fabrics(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path)
    mesh.run(30)
    _background(mesh, 0.0015)  # ~0.6 % per probe (two NICs, there and back): over the absolute threshold
    mesh.run(600)
    assert mesh.incidents() == []
    probes = mesh.core.detection.probes
    assert probes is not None and probes.background_loss is not None
    assert 0.004 < probes.background_loss < 0.008
    metric = mesh.core.metrics.probe_background_loss._value.get()
    assert metric == pytest.approx(probes.background_loss)


def test_a_one_percent_leaf_on_a_background_is_still_blamed(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path)
    mesh.run(30)
    _background(mesh, 0.0005)  # ~0.2 % per probe
    mesh.sim.inject_loss("leaf-b1-r0", 0.01)
    mesh.run(60)
    incidents = mesh.incidents()
    assert [(i.kind, i.root_cause) for i in incidents] == [("switch_fault", "leaf-b1-r0")]
