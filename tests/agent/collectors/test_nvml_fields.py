"""Batched NVML reads (one nvmlDeviceGetFieldValues call per GPU) give the same samples as one call per value."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pynvml
import pytest

from agent.collectors.gpu import NvmlGpuCollector
from agent.sim.fake_nvml import FakeNvml
from starpulse.core.findings import Finding
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

Inject = Callable[[FakeNvml], None]


def started(fake: FakeNvml, batch: bool) -> NvmlGpuCollector:
    c = NvmlGpuCollector(fake, batch_fields=batch)
    assert c.supported()
    c.describe(ipb.Inventory())
    return c


def cycle(c: NvmlGpuCollector) -> tuple[tpb.Report, list[tuple[str, str, str]]]:
    report = tpb.Report()
    findings: list[Finding] = c.collect(report)
    return report, sorted((f.kind, f.component, f.message) for f in findings)


def lockstep(
    steps: Iterable[Inject],
    unsupported: Iterable[str | int] = (),
    single_unsupported: Iterable[str | int] | None = None,
) -> list[tuple[tpb.Report, tpb.Report]]:
    """Two identical fakes, one read batched and one a value per call; the same faults before each cycle.

    Same seed, so both draw the same noise in the same order: the samples must be equal.
    """
    fb = FakeNvml(gpu_count=8, seed=11, unsupported=frozenset(unsupported))
    fs = FakeNvml(
        gpu_count=8,
        seed=11,
        unsupported=frozenset(unsupported if single_unsupported is None else single_unsupported),
    )
    batched, single = started(fb, True), started(fs, False)
    out = []
    try:
        for inject in steps:
            inject(fb)
            inject(fs)
            (rb, fb_findings), (rs, fs_findings) = cycle(batched), cycle(single)
            assert fb_findings == fs_findings
            out.append((rb, rs))
    finally:
        batched.close()
        single.close()
    return out


def nothing(_: FakeNvml) -> None:
    pass


def faults(f: FakeNvml) -> None:
    f.inject_ecc_dbe(1)
    f.inject_nvlink_down(2, 7)
    f.inject_row_remap_failure(3)
    f.inject_thermal_slowdown(4)
    f.set_recovery_action(5, 2)
    f.inject_reset_required(6)
    f.set_slow(7, 0.5)


def more_faults(f: FakeNvml) -> None:
    f.inject_ecc_dbe(1)
    f.inject_gpu_lost(0)
    f.clear(2)
    f.inject_nvlink_down(3, 0)


def assert_same(pairs: list[tuple[tpb.Report, tpb.Report]]) -> None:
    for batched, single in pairs:
        assert len(batched.gpus) == 8
        for b, s in zip(batched.gpus, single.gpus, strict=True):
            assert b == s, f"gpu {b.index}:\nbatched {b}\nsingle {s}"


class TestSameSamples:
    def test_healthy_and_faulty_gpus(self) -> None:
        """ECC DBE, NVLink down, remap failure, thermal, recovery action, reset required, lost: equal samples."""
        pairs = lockstep([nothing, faults, nothing, more_faults, nothing])
        assert_same(pairs)
        last = pairs[-1][0].gpus
        assert last[0].lost and last[6].reset_required
        assert last[1].ecc_dbe_volatile == 2 and last[3].remap_failure
        assert [nl.up for nl in last[3].nvlinks][:2] == [False, True]
        assert all(nl.up for nl in last[2].nvlinks)  # cleared

    @pytest.mark.parametrize(
        "unsupported",
        [
            {"nvmlDeviceGetPcieReplayCounter", pynvml.NVML_FI_DEV_MEMORY_TEMP},
            {"nvmlDeviceGetRemappedRows", "nvmlDeviceGetTotalEccErrors"},
            {"nvmlDeviceGetRetiredPages", "nvmlDeviceGetRetiredPagesPendingStatus"},
            {"nvmlDeviceGetNvLinkState"},
            {"nvmlDeviceGetFieldValues"},  # an old driver: no field-values API at all
        ],
        ids=["pcie-and-memtemp", "remap-and-ecc", "retired-pages", "no-nvlink", "no-field-api"],
    )
    def test_not_supported_is_absent_in_both(self, unsupported: set[str | int]) -> None:
        """A value the device does not support is absent (not 0) both ways, and the samples are equal."""
        pairs = lockstep([nothing, faults, nothing], unsupported)
        assert_same(pairs)
        sample = pairs[0][0].gpus[0]
        if "nvmlDeviceGetPcieReplayCounter" in unsupported:
            assert not sample.HasField("pcie_replay_count") and not sample.HasField("memory_temperature_c")
            assert sample.HasField("ecc_dbe_volatile")
        if "nvmlDeviceGetRemappedRows" in unsupported:
            assert not sample.HasField("remap_failure") and not sample.HasField("ecc_sbe_volatile")
        if "nvmlDeviceGetNvLinkState" in unsupported:
            assert len(sample.nvlinks) == 0

    def test_driver_without_some_field_ids(self) -> None:
        """Fields the driver does not know, but whose single call answers: the single call is used, same samples."""
        missing = {
            pynvml.NVML_FI_DEV_REMAPPED_UNC,
            pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
            pynvml.NVML_FI_DEV_NVLINK_GET_STATE,
        }
        pairs = lockstep([nothing, faults, nothing, more_faults], missing, single_unsupported=())
        assert_same(pairs)
        assert pairs[1][0].gpus[1].ecc_dbe_volatile == 1
        assert pairs[1][0].gpus[1].HasField("remapped_rows_uncorrectable")


class TestCallsAndFallbacks:
    def calls_per_cycle(self, fake: FakeNvml, c: NvmlGpuCollector) -> dict[str, int]:
        fake.calls.clear()
        cycle(c)
        return dict(fake.calls)

    def test_batched_cycle_makes_a_third_of_the_calls(self) -> None:
        """Between full NVLink counter reads a GPU costs ~13 NVML calls batched, ~40 one per value."""
        counts = {}
        for batch in (True, False):
            fake = FakeNvml(gpu_count=8, seed=2)
            c = started(fake, batch)
            c.slow_every_s = 3600.0
            cycle(c)
            counts[batch] = sum(self.calls_per_cycle(fake, c).values())
            c.close()
        assert counts[True] <= 8 * 14 + 1
        assert counts[False] >= 8 * 39

    def test_field_api_unsupported_falls_back_once(self) -> None:
        """nvmlDeviceGetFieldValues raising NotSupported switches to one call per value for good."""
        fake = FakeNvml(gpu_count=2, seed=2, unsupported={"nvmlDeviceGetFieldValues"})
        c = started(fake, True)
        cycle(c)
        calls = self.calls_per_cycle(fake, c)
        assert calls["nvmlDeviceGetTotalEccErrors"] == 2 * 4
        assert calls["nvmlDeviceGetNvLinkState"] == 2 * 18
        assert calls["nvmlDeviceGetFieldValues"] == 2  # recovery action / memory temperature, as before
        c.close()

    def test_missing_field_id_checked_once_per_gpu(self) -> None:
        """A field both ways unsupported is checked against its single call once, not every cycle."""
        fake = FakeNvml(gpu_count=2, seed=2, unsupported={"nvmlDeviceGetRetiredPages"})
        c = started(fake, True)
        first = self.calls_per_cycle(fake, c)
        second = self.calls_per_cycle(fake, c)
        assert first.get("nvmlDeviceGetRetiredPages") == 2 * 2
        assert "nvmlDeviceGetRetiredPages" not in second
        assert second["nvmlDeviceGetFieldValues"] == 2
        c.close()

    def test_other_link_states_ask_the_single_call(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A link state other than ACTIVE / INACTIVE (a sleeping link) is read with nvmlDeviceGetNvLinkState."""
        fake = FakeNvml(gpu_count=1, seed=2)
        real = fake.nvmlDeviceGetFieldValues

        def sleeping_link_4(handle: Any, fieldIds: Any) -> Any:
            values = real(handle, fieldIds)
            for fv in values:
                if fv.fieldId == pynvml.NVML_FI_DEV_NVLINK_GET_STATE and fv.scopeId == 4:
                    fv.value.uiVal = pynvml.NVML_NVLINK_STATE_SLEEP
            return values

        monkeypatch.setattr(fake, "nvmlDeviceGetFieldValues", sleeping_link_4)
        c = started(fake, True)
        fake.calls.clear()
        report, _ = cycle(c)
        assert fake.calls["nvmlDeviceGetNvLinkState"] == 1
        assert [nl.link for nl in report.gpus[0].nvlinks] == list(range(18))
        assert report.gpus[0].nvlinks[4].up  # what the single call says
        c.close()


class TestDecode:
    def test_struct_decoding_equals_the_ctypes_fields(self) -> None:
        """Every value type, an unknown type and failed elements: as pynvml's own structure reads them."""
        from agent.collectors import nvml_fields as nf

        rows: list[tuple[int, int, Any]] = [
            (pynvml.NVML_VALUE_TYPE_DOUBLE, pynvml.NVML_SUCCESS, ("dVal", -2.5)),
            (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, pynvml.NVML_SUCCESS, ("uiVal", 4_000_000_000)),
            (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG, pynvml.NVML_SUCCESS, ("ulVal", 2**40 + 3)),
            (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, pynvml.NVML_SUCCESS, ("ullVal", 2**64 - 1)),
            (pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, pynvml.NVML_SUCCESS, ("sllVal", -(2**62))),
            (pynvml.NVML_VALUE_TYPE_SIGNED_INT, pynvml.NVML_SUCCESS, ("siVal", -7)),
            (pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT, pynvml.NVML_SUCCESS, ("usVal", 65535)),
            (99, pynvml.NVML_SUCCESS, ("ullVal", 5)),  # a value type this code does not know
            (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, pynvml.NVML_ERROR_NOT_SUPPORTED, ("uiVal", 8)),
            (0, pynvml.NVML_ERROR_GPU_IS_LOST, ("ullVal", 2**63)),
        ]
        array = (pynvml.c_nvmlFieldValue_t * len(rows))()
        for fv, (vtype, ret, (member, value)) in zip(array, rows, strict=True):
            fv.fieldId, fv.scopeId, fv.timestamp, fv.latencyUsec = 7, 1, 123456789, 42
            fv.valueType, fv.nvmlReturn = vtype, ret
            setattr(fv.value, member, value)
        assert nf.ROW_LAYOUT_OK
        expected = [(fv.nvmlReturn, nf.field_value(fv) if fv.nvmlReturn == nf.SUCCESS else None) for fv in array]
        assert nf.decode(array) == expected == nf.decode(list(array))
        values = [v for _, v in expected]
        assert values == [-2.5, 4_000_000_000, 2**40 + 3, 2**64 - 1, -(2**62), -7, 65535, None, None, None]
