"""One table says what a failed NVML read means, whether the error was raised or returned in a field element."""

from __future__ import annotations

from typing import Any

import pynvml
import pytest
import structlog

from agent.collectors.gpu import NvmlGpuCollector
from agent.collectors.nvml_errors import Outcome, sort_code, sort_error
from agent.sim.fake_nvml import FakeNvml
from starpulse.v1 import telemetry_pb2 as tpb

CASES = [
    (pynvml.NVML_ERROR_NOT_SUPPORTED, False, Outcome.ABSENT),
    (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, False, Outcome.ABSENT),
    (pynvml.NVML_ERROR_INVALID_ARGUMENT, False, Outcome.OTHER),
    (pynvml.NVML_ERROR_INVALID_ARGUMENT, True, Outcome.ABSENT),  # an NVLink index this device does not have
    (pynvml.NVML_ERROR_NOT_SUPPORTED, True, Outcome.ABSENT),
    (pynvml.NVML_ERROR_GPU_IS_LOST, False, Outcome.LOST),
    (pynvml.NVML_ERROR_GPU_IS_LOST, True, Outcome.LOST),
    (pynvml.NVML_ERROR_RESET_REQUIRED, False, Outcome.RESET_REQUIRED),
    (pynvml.NVML_ERROR_RESET_REQUIRED, True, Outcome.RESET_REQUIRED),
    (pynvml.NVML_ERROR_NO_PERMISSION, False, Outcome.OTHER),
    (pynvml.NVML_ERROR_UNKNOWN, True, Outcome.OTHER),
    (pynvml.NVML_ERROR_TIMEOUT, False, Outcome.OTHER),
]


@pytest.mark.parametrize(("code", "link", "outcome"), CASES)
def test_a_code_and_the_error_raised_for_it_mean_the_same(code: int, link: bool, outcome: Outcome) -> None:
    raised = pynvml.NVMLError(code)  # pynvml hands back its subclass for the code, as NVML calls raise it
    assert type(raised) is not pynvml.NVMLError
    assert sort_code(code, link=link) is outcome
    assert sort_error(raised, link=link) is outcome


def test_a_non_nvml_error_is_other() -> None:
    assert sort_error(RuntimeError("boom")) is Outcome.OTHER


@pytest.mark.parametrize("batch_fields", [True, False], ids=["field-element", "raised"])
@pytest.mark.parametrize(
    "code",
    [
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_RESET_REQUIRED,
        pynvml.NVML_ERROR_GPU_IS_LOST,
    ],
)
def test_the_collector_reads_a_failure_the_same_either_way(
    monkeypatch: pytest.MonkeyPatch, code: int, batch_fields: bool
) -> None:
    """GPU 1's PCIe replay counter fails: absent, and lost / reset-required / logged as the table says."""
    fake = FakeNvml(gpu_count=2, seed=3)
    single, field_values = fake.nvmlDeviceGetPcieReplayCounter, fake.nvmlDeviceGetFieldValues

    def replay_counter(handle: Any) -> int:
        if handle.gpu == 1:
            raise pynvml.NVMLError(code)
        return int(single(handle))

    def fields(handle: Any, field_ids: Any) -> Any:
        values = field_values(handle, field_ids)
        for fv in values:
            if handle.gpu == 1 and fv.fieldId == pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER:
                fv.nvmlReturn = code
        return values

    monkeypatch.setattr(fake, "nvmlDeviceGetPcieReplayCounter", replay_counter)
    monkeypatch.setattr(fake, "nvmlDeviceGetFieldValues", fields)
    c = NvmlGpuCollector(fake, batch_fields=batch_fields)
    assert c.supported()
    report = tpb.Report()
    try:
        with structlog.testing.capture_logs() as logs:
            c.collect(report)
    finally:
        c.close()
    ok, failed = report.gpus
    outcome = sort_code(code)
    assert ok.HasField("pcie_replay_count") and not ok.lost and not ok.reset_required
    assert not failed.HasField("pcie_replay_count")
    assert failed.lost == (outcome is Outcome.LOST)
    assert failed.reset_required == (outcome is Outcome.RESET_REQUIRED)
    warned = [e for e in logs if e["event"] == "nvml_query_failed" and e["gpu"] == 1]
    assert [e["code"] for e in warned] == ([code] if outcome is Outcome.OTHER else [])
