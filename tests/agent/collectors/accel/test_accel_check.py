"""The one "never healthy for what was not read" rule (agent/collectors/accel/check.py), case by case."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.collectors.accel.check import (
    CONFIRMED,
    LEARNED,
    AcceleratorChecker,
    Expected,
    LearnedError,
    LearnedInventory,
)


def checker(expected: Expected | None = None, learned: LearnedInventory | None = None) -> AcceleratorChecker:
    return AcceleratorChecker("ascend", "ascend", "npu-smi", expected, learned)


class TestJudge:
    @pytest.mark.parametrize(
        ("supported", "error", "found", "expected", "reason"),
        [
            (False, "npu-smi is not on PATH", 0, None, "npu-smi is not on PATH"),
            (True, "npu-smi info: exit 1: dcmi failed", 8, None, "npu-smi info: exit 1: dcmi failed"),
            (False, "", 0, None, "npu-smi: not available"),
            (True, "", 0, None, "npu-smi answered but found no ascend accelerator"),
            (True, "", 7, Expected(8), "npu-smi found 7 ascend accelerators, expected 8 (settings)"),
            (True, "", 8, Expected(8), ""),
            (True, "", 0, Expected(0), ""),
            (False, "npu-smi is not on PATH", 0, Expected(0), ""),  # nothing to read on this node
        ],
    )
    def test_rule(self, supported: bool, error: str, found: int, expected: Expected | None, reason: str) -> None:
        check = checker(expected).judge(supported, error, found)
        assert (check.judged, check.reason) == (not reason, reason)
        assert check.HasField("expected") == (expected is not None)

    def test_a_tool_that_prints_a_page_is_one_line(self) -> None:
        check = checker().judge(True, "npu-smi info: exit 1:\n" + "x " * 400, 0)
        assert "\n" not in check.reason and len(check.reason) <= 300


class TestLearned:
    def test_first_sight_is_learned_then_a_loss_is_caught(self, tmp_path: Path) -> None:
        inv = LearnedInventory(tmp_path / "accelerators.json")
        first = checker(learned=inv).judge(True, "", 8)
        assert first.judged and (first.expected, first.expected_source) == (8, LEARNED)
        later = checker(learned=inv).judge(True, "", 7)  # the next start reads the file
        assert not later.judged and "expected 8 (learned)" in later.reason

    def test_zero_is_never_learned(self, tmp_path: Path) -> None:
        inv = LearnedInventory(tmp_path / "accelerators.json")
        assert not checker(learned=inv).judge(True, "", 0).judged
        assert inv.load() is None

    def test_a_person_confirms_or_corrects(self, tmp_path: Path) -> None:
        inv = LearnedInventory(tmp_path / "accelerators.json")
        with pytest.raises(LearnedError, match="nothing learned yet"):
            inv.confirm()
        inv.learn(7, "ascend")
        assert inv.confirm(8) == Expected(8, "ascend", CONFIRMED)
        assert checker(learned=inv).judge(True, "", 7).reason.endswith("expected 8 (learned, confirmed)")

    def test_a_broken_file_is_one_line_and_monitoring_goes_on(self, tmp_path: Path) -> None:
        path = tmp_path / "accelerators.json"
        path.write_text("{not json")
        with pytest.raises(LearnedError, match=r"accelerators\.json"):
            LearnedInventory(path).load()
        assert checker(learned=LearnedInventory(path)).judge(True, "", 8).judged


class TestChange:
    def test_said_on_change_only_and_resumed_after_a_restart(self) -> None:
        c = checker()
        assert c.change(c.judge(True, "", 8)) is None  # judged, as the controller assumes
        lost = c.change(c.judge(True, "", 0))
        assert lost is not None and lost.severity == "warning" and lost.attributes["judged"] == "false"
        assert c.change(c.judge(True, "", 0)) is None
        restarted = checker()
        restarted.resume(False, lost.attributes["reason"])
        back = restarted.change(restarted.judge(True, "", 8))
        assert back is not None and back.attributes["judged"] == "true" and back.severity == "info"
