"""The fail-slow step bench (bench/failslow_step.py) measures a comparison that finds something:
its slow nodes are flagged where they have peers, and nobody is where nobody has any (bench.scale's
controller), so a near-zero step there is the absence of work, not a broken harness."""

from __future__ import annotations

import pytest

from bench.failslow_step import run


@pytest.mark.parametrize("shape", ["blocks", "job", "declared"])
def test_with_peers_the_slow_nodes_are_flagged(shape: str) -> None:
    figures = run(shape, nodes=200, evaluations=3)
    assert figures["open_conditions"] >= 1
    assert figures["steps_per_evaluation"] >= 1


def test_without_peers_nobody_is_compared() -> None:
    assert run("none", nodes=200, evaluations=3)["open_conditions"] == 0
