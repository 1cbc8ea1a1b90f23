"""FakeNvml: the pynvml look-alike the GPU collector is tested against."""

from __future__ import annotations

import ctypes
import inspect
import re
import threading
import time

import pynvml
import pytest

from agent.sim.fake_nvml import H100_PCI_BUSES, FakeHandle, FakeNvml, fake_exports


@pytest.fixture
def nvml() -> FakeNvml:
    fake = FakeNvml(gpu_count=8, seed=7)
    fake.nvmlInit()
    return fake


class TestLifecycle:
    def test_calls_before_init_raise_uninitialized(self) -> None:
        """Any call before nvmlInit raises NVMLError_Uninitialized, like the real bindings."""
        fake = FakeNvml()
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            fake.nvmlDeviceGetCount()

    def test_driver_missing_raises_library_not_found(self) -> None:
        """driver_missing makes nvmlInit raise LibraryNotFound with pynvml's message."""
        fake = FakeNvml(driver_missing=True)
        with pytest.raises(pynvml.NVMLError_LibraryNotFound) as err:
            fake.nvmlInit()
        assert str(err.value) == "NVML Shared Library Not Found"
        assert err.value.value == 12

    def test_init_is_refcounted(self) -> None:
        """Two inits need two shutdowns before calls fail again."""
        fake = FakeNvml()
        fake.nvmlInit()
        fake.nvmlInit()
        fake.nvmlShutdown()
        assert fake.nvmlDeviceGetCount() == 8
        fake.nvmlShutdown()
        assert not fake.initialized
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            fake.nvmlDeviceGetCount()


class TestErrors:
    @pytest.mark.parametrize(
        ("name", "code"),
        [
            ("Uninitialized", 1),
            ("InvalidArgument", 2),
            ("NotSupported", 3),
            ("NoPermission", 4),
            ("NotFound", 6),
            ("DriverNotLoaded", 9),
            ("Timeout", 10),
            ("LibraryNotFound", 12),
            ("FunctionNotFound", 13),
            ("GpuIsLost", 15),
            ("ResetRequired", 16),
            ("Unknown", 999),
        ],
    )
    def test_error_classes_are_pynvmls(self, name: str, code: int) -> None:
        """Each NVMLError_<Name> is pynvml's own class, with its code and str()."""
        cls = getattr(FakeNvml, f"NVMLError_{name}")
        assert cls is getattr(pynvml, f"NVMLError_{name}")
        assert FakeNvml.nvmlExceptionClass(code) is cls
        err = cls()
        assert err.value == code
        assert isinstance(err, pynvml.NVMLError)
        assert str(err) == str(pynvml.NVMLError(code))

    def test_unsupported_function_raises_not_supported(self) -> None:
        """A function named in `unsupported` raises NotSupported on every GPU."""
        fake = FakeNvml(unsupported={"nvmlDeviceGetPowerUsage"})
        fake.nvmlInit()
        handle = fake.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            fake.nvmlDeviceGetPowerUsage(handle)
        assert fake.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) > 0

    def test_unsupported_field_has_per_element_status(self) -> None:
        """An unsupported field id comes back with nvmlReturn NOT_SUPPORTED; the others succeed."""
        fake = FakeNvml(unsupported={pynvml.NVML_FI_DEV_MEMORY_TEMP})
        fake.nvmlInit()
        handle = fake.nvmlDeviceGetHandleByIndex(0)
        rec, mem = fake.nvmlDeviceGetFieldValues(
            handle, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, pynvml.NVML_FI_DEV_MEMORY_TEMP]
        )
        assert rec.nvmlReturn == pynvml.NVML_SUCCESS
        assert rec.value.uiVal == 0
        assert mem.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


class TestSimGpu:
    def test_identity_is_deterministic_per_seed(self) -> None:
        """Same seed, same UUIDs and serials; another seed, other UUIDs."""
        a, b, c = FakeNvml(seed=1), FakeNvml(seed=1), FakeNvml(seed=2)
        assert [g.uuid for g in map(a.gpu, range(8))] == [g.uuid for g in map(b.gpu, range(8))]
        assert a.gpu(0).uuid != c.gpu(0).uuid
        assert len({a.gpu(i).uuid for i in range(8)}) == 8

    def test_identity_looks_like_an_h100(self, nvml: FakeNvml) -> None:
        """UUID, bus id, model, NVLinks and memory look like a DGX H100 GPU."""
        for index in range(8):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            assert re.fullmatch(
                r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
                nvml.nvmlDeviceGetUUID(handle),
            )
            assert nvml.nvmlDeviceGetPciInfo(handle).busId == f"00000000:{H100_PCI_BUSES[index]:02X}:00.0"
            assert nvml.nvmlDeviceGetName(handle) == "NVIDIA H100 80GB HBM3"
            assert nvml.nvmlDeviceGetIndex(handle) == index
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        assert nvml.nvmlDeviceGetNvLinkState(handle, 17) == pynvml.NVML_FEATURE_ENABLED
        with pytest.raises(pynvml.NVMLError_NotSupported):
            nvml.nvmlDeviceGetNvLinkState(handle, 18)
        assert nvml.nvmlDeviceGetMemoryInfo(handle).total == 85_520_809_984

    def test_readings_are_plausible(self, nvml: FakeNvml) -> None:
        """Temperature, power (mW), utilization and clocks are in a loaded H100's range."""
        handle = nvml.nvmlDeviceGetHandleByIndex(3)
        assert 40 <= nvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) <= 80
        assert 450_000 <= nvml.nvmlDeviceGetPowerUsage(handle) <= 700_000
        assert nvml.nvmlDeviceGetEnforcedPowerLimit(handle) == 700_000
        assert 85 <= nvml.nvmlDeviceGetUtilizationRates(handle).gpu <= 100
        assert 1800 <= nvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM) <= 1980
        assert nvml.nvmlDeviceGetRemappedRows(handle) == (0, 0, 0, 0)


class TestFaultInjection:
    def test_gpu_lost_raises_for_that_gpu_only(self, nvml: FakeNvml) -> None:
        """A lost GPU raises GpuIsLost from every call, including HandleByIndex; others work."""
        handle = nvml.nvmlDeviceGetHandleByIndex(2)
        nvml.inject_gpu_lost(2)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            nvml.nvmlDeviceGetHandleByIndex(2)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            nvml.nvmlDeviceGetUUID(handle)
        assert nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(3)).startswith("GPU-")

    def test_reset_required_keeps_identity(self, nvml: FakeNvml) -> None:
        """ResetRequired hits metric queries; identity queries still answer."""
        nvml.inject_reset_required(1)
        handle = nvml.nvmlDeviceGetHandleByIndex(1)
        assert nvml.nvmlDeviceGetUUID(handle).startswith("GPU-")
        with pytest.raises(pynvml.NVMLError_ResetRequired):
            nvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)

    def test_ecc_dbe_bumps_counters_and_remap_pending(self, nvml: FakeNvml) -> None:
        """inject_ecc_dbe adds one volatile and one aggregate DBE and leaves a remap pending."""
        nvml.inject_ecc_dbe(0)
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        unc = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        assert nvml.nvmlDeviceGetTotalEccErrors(handle, unc, pynvml.NVML_VOLATILE_ECC) == 1
        assert nvml.nvmlDeviceGetTotalEccErrors(handle, unc, pynvml.NVML_AGGREGATE_ECC) == 1
        assert nvml.nvmlDeviceGetRemappedRows(handle)[2] == 1

    def test_thermal_slowdown_sets_bits_and_drops_clock(self, nvml: FakeNvml) -> None:
        """Thermal slowdown sets HwThermalSlowdown|HwSlowdown and the SM clock falls."""
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        nvml.inject_thermal_slowdown(0)
        reasons = nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
        assert reasons & 0x40
        assert reasons & 0x8
        assert nvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM) < 1200

    def test_set_slow_scales_clock_power_util(self, nvml: FakeNvml) -> None:
        """A fail-slow GPU runs at a fraction of its clock, power and utilization."""
        handle = nvml.nvmlDeviceGetHandleByIndex(4)
        nvml.set_slow(4, 0.5)
        assert nvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM) <= 990
        assert nvml.nvmlDeviceGetPowerUsage(handle) < 350_000
        assert nvml.nvmlDeviceGetUtilizationRates(handle).gpu < 55
        with pytest.raises(ValueError):
            nvml.set_slow(4, 0)

    def test_remove_gpu_drops_the_count(self, nvml: FakeNvml) -> None:
        """remove_gpu hides the GPU from enumeration; clear brings it back."""
        nvml.remove_gpu(5)
        assert nvml.nvmlDeviceGetCount() == 7
        nvml.clear(5)
        assert nvml.nvmlDeviceGetCount() == 8

    def test_clear_restores_a_healthy_gpu(self, nvml: FakeNvml) -> None:
        """clear undoes every fault and restores the same identity."""
        uuid = nvml.gpu(0).uuid
        for inject in (
            nvml.inject_ecc_dbe,
            nvml.inject_row_remap_failure,
            nvml.inject_nvlink_down,
            nvml.inject_thermal_slowdown,
            nvml.inject_gpu_lost,
        ):
            inject(0)
        nvml.set_recovery_action(0, 2)
        nvml.clear(0)
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        assert nvml.nvmlDeviceGetUUID(handle) == uuid
        assert nvml.nvmlDeviceGetRemappedRows(handle) == (0, 0, 0, 0)
        assert nvml.nvmlDeviceGetNvLinkState(handle, 0) == pynvml.NVML_FEATURE_ENABLED
        assert nvml.nvmlDeviceGetCurrentClocksEventReasons(handle) == 0
        assert nvml.nvmlDeviceGetFieldValues(handle, [230])[0].value.uiVal == 0


class TestEvents:
    def test_wait_times_out(self, nvml: FakeNvml) -> None:
        """nvmlEventSetWait raises Timeout after roughly its timeout when nothing arrives."""
        es = nvml.nvmlEventSetCreate()
        start = time.monotonic()
        with pytest.raises(pynvml.NVMLError_Timeout):
            nvml.nvmlEventSetWait(es, 30)
        assert 0.025 <= time.monotonic() - start < 1.0

    def test_xid_is_delivered_to_a_registered_set(self, nvml: FakeNvml) -> None:
        """An injected Xid reaches a set registered for XidCriticalError, with all data fields."""
        es = nvml.nvmlEventSetCreate()
        handle = nvml.nvmlDeviceGetHandleByIndex(3)
        nvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, es)
        nvml.inject_xid(3, 95)
        data = nvml.nvmlEventSetWait(es, 1000)
        assert data.device == FakeHandle(3)
        assert data.eventType == pynvml.nvmlEventTypeXidCriticalError
        assert data.eventData == 95
        assert data.gpuInstanceId == 0xFFFFFFFF
        assert data.computeInstanceId == 0xFFFFFFFF

    def test_unregistered_events_are_not_delivered(self, nvml: FakeNvml) -> None:
        """Events of other GPUs or other types do not reach the set."""
        es = nvml.nvmlEventSetCreate()
        nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlEventTypeXidCriticalError, es)
        nvml.inject_xid(1, 13)
        nvml.inject_ecc_dbe(0)
        with pytest.raises(pynvml.NVMLError_Timeout):
            nvml.nvmlEventSetWait(es, 10)

    def test_waiter_is_woken_by_injection(self, nvml: FakeNvml) -> None:
        """A blocked waiter returns as soon as an event is injected, well before its timeout."""
        es = nvml.nvmlEventSetCreate()
        nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlEventTypeXidCriticalError, es)
        got: list[int] = []
        waiter = threading.Thread(target=lambda: got.append(nvml.nvmlEventSetWait(es, 10_000).eventData))
        waiter.start()
        time.sleep(0.02)
        nvml.inject_xid(0, 48)
        waiter.join(timeout=2)
        assert got == [48]

    def test_registering_unsupported_bits_fails(self, nvml: FakeNvml) -> None:
        """Registering bits the device does not support raises NotSupported (mask with Supported)."""
        es = nvml.nvmlEventSetCreate()
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            nvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeAll, es)
        supported = nvml.nvmlDeviceGetSupportedEventTypes(handle)
        nvml.nvmlDeviceRegisterEvents(handle, supported & pynvml.nvmlEventTypeAll, es)

    def test_wait_on_a_freed_set_fails(self, nvml: FakeNvml) -> None:
        """A freed event set cannot be waited on."""
        es = nvml.nvmlEventSetCreate()
        nvml.nvmlEventSetFree(es)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            nvml.nvmlEventSetWait(es, 10)


class TestSurface:
    def test_every_exposed_name_exists_in_pynvml(self) -> None:
        """Every nvml*/NVML* name FakeNvml exposes exists in the real pynvml (no drift)."""
        exports = fake_exports()
        assert len(exports) > 60
        missing = sorted(name for name in exports if not hasattr(pynvml, name))
        assert missing == []

    def test_constants_and_classes_equal_pynvmls(self) -> None:
        """Constants have pynvml's values and error classes are pynvml's objects."""
        for name, value in fake_exports().items():
            if callable(value) and name.startswith("nvml"):
                continue
            assert value is getattr(pynvml, name) or value == getattr(pynvml, name), name

    def test_functions_take_pynvmls_required_arguments(self) -> None:
        """Each fake function takes as many required positional arguments as pynvml's."""

        def required(fn: object) -> int:
            params = inspect.signature(fn).parameters.values()  # type: ignore[arg-type]
            return sum(1 for p in params if p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD)

        fake = FakeNvml()
        for name in fake_exports():
            real = getattr(pynvml, name)
            if name.startswith("nvml") and inspect.isfunction(real) and name != "nvmlExceptionClass":
                assert required(getattr(fake, name)) == required(getattr(pynvml, name)), name

    def test_field_values_has_pynvmls_surface(self, nvml: FakeNvml) -> None:
        """Same parameters as pynvml's; a ctypes array of pynvml.c_nvmlFieldValue_t; ids or (id, scope) pairs."""
        assert list(inspect.signature(nvml.nvmlDeviceGetFieldValues).parameters) == list(
            inspect.signature(pynvml.nvmlDeviceGetFieldValues).parameters
        )
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        ids = [pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL, (pynvml.NVML_FI_DEV_NVLINK_GET_STATE, 17), (999, 3)]
        values = nvml.nvmlDeviceGetFieldValues(handle, ids)
        assert isinstance(values, ctypes.Array) and values._type_ is pynvml.c_nvmlFieldValue_t
        assert len(values) == 3
        expected = [(pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL, 0), (165, 17), (999, 3)]
        assert [(v.fieldId, v.scopeId) for v in values] == expected
        assert all(v.timestamp > 0 for v in values[:2])
        assert values[0].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        assert values[1].value.uiVal == pynvml.NVML_NVLINK_STATE_ACTIVE
        assert values[2].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED

    def test_fields_follow_the_injected_state(self, nvml: FakeNvml) -> None:
        """Each field mirrors its single-value call after faults: the same state drives both."""
        nvml.inject_ecc_dbe(2)
        nvml.inject_row_remap_failure(2)
        nvml.inject_nvlink_down(2, 5)
        handle = nvml.nvmlDeviceGetHandleByIndex(2)
        unc, agg = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC
        rows = nvml.nvmlDeviceGetRemappedRows(handle)
        expected = {
            pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: nvml.nvmlDeviceGetTotalEccErrors(handle, unc, agg),
            pynvml.NVML_FI_DEV_REMAPPED_UNC: rows[1],
            pynvml.NVML_FI_DEV_REMAPPED_PENDING: rows[2],
            pynvml.NVML_FI_DEV_REMAPPED_FAILURE: rows[3],
            pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: nvml.nvmlDeviceGetPcieReplayCounter(handle),
            pynvml.NVML_FI_DEV_RETIRED_PENDING: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle),
        }
        values = nvml.nvmlDeviceGetFieldValues(handle, list(expected))
        got = {v.fieldId: (v.value.ullVal if v.valueType == 3 else v.value.uiVal) for v in values}
        assert got == expected
        assert expected[pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL] == 1 and expected[pynvml.NVML_FI_DEV_REMAPPED_FAILURE]
        (down, up) = nvml.nvmlDeviceGetFieldValues(
            handle, [(pynvml.NVML_FI_DEV_NVLINK_GET_STATE, 5), (pynvml.NVML_FI_DEV_NVLINK_GET_STATE, 6)]
        )
        assert down.value.uiVal == pynvml.NVML_NVLINK_STATE_INACTIVE
        assert up.value.uiVal == pynvml.NVML_NVLINK_STATE_ACTIVE

    def test_unsupported_function_makes_its_fields_unsupported(self) -> None:
        """Naming a function unsupported takes its fields with it; naming a field id alone keeps the function."""
        fake = FakeNvml(unsupported={"nvmlDeviceGetRemappedRows", pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER})
        fake.nvmlInit()
        handle = fake.nvmlDeviceGetHandleByIndex(0)
        rem, pcie = fake.nvmlDeviceGetFieldValues(
            handle, [pynvml.NVML_FI_DEV_REMAPPED_COR, pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER]
        )
        assert rem.nvmlReturn == pcie.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
        assert fake.nvmlDeviceGetPcieReplayCounter(handle) == 0
