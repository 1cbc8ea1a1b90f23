"""Validation diagnostics: dcgmi's verdict read from recorded real outputs, exit status and patterns."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.heal.diagnostics import dcgmi_verdict, judge
from controller.heal.ladder import RepairPolicy
from controller.heal.policy import PolicyError, policy_from_dict

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "dcgmi"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_real_json_output_with_nulls_and_a_leading_warning_passes() -> None:
    v = dcgmi_verdict(fixture("dcgm-3.1.0-r-json-pass.txt"))
    assert v.passed and v.detail == "dcgmi: 17 passed"  # 9 deployment tests + software on 8 GPUs


def test_real_json_output_with_one_failure_fails_naming_the_test() -> None:
    # The recorded output with one GPU's software result changed to FAIL (no failing one is public in full).
    text = fixture("dcgm-3.1.0-r-json-pass.txt").replace('"gpu_ids" : 5,\n\t\t\t\t\t\t\t"status" : "PASS"',
                                                        '"gpu_ids" : 5,\n\t\t\t\t\t\t\t"status" : "FAIL"')  # fmt: skip
    v = dcgmi_verdict(text)
    assert not v.passed and v.detail == "dcgmi: 1 failed: software (GPU 5)"


@pytest.mark.parametrize(("name", "count"), [("dcgm-4.2.3-r2-table-head.txt", 5), ("dcgm-3.3.1-r2-table-head.txt", 7)])
def test_real_table_outputs_pass_and_metadata_is_not_a_test(name: str, count: int) -> None:
    v = dcgmi_verdict(fixture(name))
    assert v.passed and v.detail == f"dcgmi: {count} passed"


def test_table_failure_and_warning() -> None:
    # The 4.2.3 table with GPU2 failing, then with a warning only (recorded output, one status changed).
    text = fixture("dcgm-4.2.3-r2-table-head.txt")
    failed = dcgmi_verdict(text.replace("GPU2: Pass     ", "GPU2: Fail     "))
    assert not failed.passed and "software (GPU 2)" in failed.detail
    warned = dcgmi_verdict(text.replace("GPU1: Pass     ", "GPU1: Warn     "))
    assert warned.passed and "1 warned: software (GPU 1)" in warned.detail


def test_dcgm4_test_summary_and_nothing_run() -> None:
    memory = '{"name": "memory", "test_summary": {"status": "Fail"}}'
    doc = '{"DCGM Diagnostic": {"test_categories": [{"tests": [' + memory + "]}]}}"
    assert not dcgmi_verdict(doc).passed
    skipped = (
        '{"DCGM GPU Diagnostic": {"test_categories": [{"tests": [{"name": "pcie", "results": [{"status": "Skip"}]}]}]}}'
    )
    v = dcgmi_verdict(skipped)
    assert not v.passed and "nothing proven" in v.detail
    assert not judge("dcgmi", False, "").passed


def test_exit_status_and_regex() -> None:
    assert judge("exit_ok", True, "burn-in ok").passed
    failed = judge("exit_ok", False, "gpu_burn timed out after 600s")
    assert not failed.passed and "timed out" in failed.detail
    assert judge("regex:Avg bus bandwidth\\s*:\\s*[1-9]", True, "# Avg bus bandwidth    : 171.4").passed
    assert not judge("regex:Avg bus bandwidth", True, "NCCL WARN no device").passed


def test_repair_section_is_checked_with_one_line_per_problem() -> None:
    repair = {
        "ladders": {"gpu_fault": ["reset_gpu", "reboot"], "nic_fault": ["jiggle", "retire"]},
        "timeouts": {"reboot": "soon"},
        "validation": {"default": {"diagnostics": [{"name": "Bad Name", "pass": "maybe"}]}},
        "return_to": "attic",
        "extra": 1,
    }
    with pytest.raises(PolicyError) as err:
        policy_from_dict({"version": 1, "kinds": {"gpu_fault": {"action": "evict"}}, "repair": repair}, "p.yaml")
    assert sorted(err.value.errors) == [
        "p.yaml: repair.extra: unknown key",
        "p.yaml: repair.ladders.nic_fault[0]: must be one of none, reset_gpu, reboot, retire, got 'jiggle'",
        "p.yaml: repair.return_to: must be one of spare, service, got 'attic'",
        "p.yaml: repair.timeouts.reboot: cannot read 'soon' as a quantity (expected a duration like '60s', "
        "'10m', '500ms')",
        "p.yaml: repair.validation.default.diagnostics[0].name: must be a string matching "
        "^[a-z][a-z0-9_]{0,39}$, got 'Bad Name'",
    ]


def test_repair_checks_across_keys_once_the_shape_is_right() -> None:
    repair = {
        "ladders": {"gpu_fault": ["reset_gpu", "reboot"]},
        "validation": {
            "default": {"diagnostics": [{"name": "nccl", "pass": "maybe"}, {"name": "x", "pass": "regex:("}]}
        },
    }
    with pytest.raises(PolicyError) as err:
        policy_from_dict({"version": 1, "kinds": {"gpu_fault": {"action": "evict"}}, "repair": repair}, "p.yaml")
    assert [line.split(": ")[1] for line in err.value.errors] == [
        "repair.validation.default.diagnostics[0].pass",
        "repair.validation.default.diagnostics[1].pass",
    ]
    del repair["validation"]  # the ladder's own check is the repair section's: it runs once its keys read
    with pytest.raises(PolicyError) as err:
        policy_from_dict({"version": 1, "kinds": {"gpu_fault": {"action": "evict"}}, "repair": repair}, "p.yaml")
    assert err.value.errors == [
        "p.yaml: repair.ladders.gpu_fault: the last rung must be 'retire', so a node that never passes is taken out"
    ]


def test_repair_section_overlays_the_defaults() -> None:
    repair = {"ladders": {"nic_fault": ["none", "retire"]}, "timeouts": {"reboot": "30m"}, "lemon": {"window": "1d"}}
    p = policy_from_dict({"version": 1, "kinds": {"gpu_fault": {"action": "evict"}}, "repair": repair}).repair
    assert p.ladder("nic_fault") == ("none", "retire") and p.ladder("gpu_fault") == ("reset_gpu", "reboot", "retire")
    assert p.timeouts_s == {"reset_gpu": 600.0, "reboot": 1800.0} and p.lemon.window_s == 86400.0


def test_first_rung_honours_the_request_and_the_lemon_score() -> None:
    p = RepairPolicy()
    assert p.first_rung("gpu_fault", "reset_gpu", 0) == 0
    assert p.first_rung("gpu_fault", "reboot", 0) == 1
    assert p.first_rung("gpu_fault", "reset_gpu", 1) == 1  # came back recently: skip the reset
    assert p.first_rung("gpu_fault", None, 9) == 2  # never past retire
    assert p.ladder("straggler") == ("reboot", "retire")


def test_empty_repair_keys_keep_their_defaults_as_before() -> None:
    """`ladders:` or `validation:` left empty in YAML (null) was accepted before the schema: it still is."""
    repair = {"ladders": None, "validation": None, "timeouts": None, "lemon": None}
    p = policy_from_dict({"version": 1, "kinds": {"gpu_fault": {"action": "evict"}}, "repair": repair}).repair
    assert p == RepairPolicy()
