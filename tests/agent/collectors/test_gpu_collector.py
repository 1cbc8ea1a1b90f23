"""NvmlGpuCollector against FakeNvml (and against the real pynvml, which has no driver here)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pynvml
import pytest

from agent.collectors.base import Collector, CollectorUnsupported
from agent.collectors.gpu import NvmlGpuCollector, nvml_unavailable_reason
from agent.sim.fake_nvml import FakeNvml
from starpulse.core.findings import Finding
from starpulse.core.xid import lookup
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

LIBRARY_NOT_FOUND_LINE = "NVML unavailable: NVML Shared Library Not Found (is the NVIDIA driver installed?)"


class Sink:
    """A thread-safe FindingSink that tests can wait on."""

    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self._cond = threading.Condition()

    def __call__(self, finding: Finding) -> None:
        with self._cond:
            self.findings.append(finding)
            self._cond.notify_all()

    def wait_for(self, pred: Callable[[list[Finding]], bool], timeout: float = 5.0) -> list[Finding]:
        """Block until pred(findings) holds; fail at the deadline."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not pred(self.findings):
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"condition not met; findings: {self.findings}"
                self._cond.wait(remaining)
            return list(self.findings)

    def kinds(self, kind: str) -> list[Finding]:
        with self._cond:
            return [f for f in self.findings if f.kind == kind]


def wait_until(pred: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        time.sleep(0.005)


def collect(collector: NvmlGpuCollector) -> tuple[tpb.Report, list[Finding]]:
    report = tpb.Report()
    findings = collector.collect(report)
    return report, findings


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml(gpu_count=8, seed=11)


@pytest.fixture
def collector(fake: FakeNvml) -> Iterator[NvmlGpuCollector]:
    c = NvmlGpuCollector(fake, event_timeout_ms=50)
    assert c.supported()
    c.describe(ipb.Inventory())
    yield c
    c.close()


class TestAvailability:
    def test_real_pynvml_without_driver_is_unsupported(self) -> None:
        """With the real pynvml and no driver, supported() is False with the LibraryNotFound line."""
        c = NvmlGpuCollector(pynvml)
        assert c.supported() is False
        assert c.unavailable_reason == LIBRARY_NOT_FOUND_LINE
        c.close()

    def test_unavailable_reason_with_real_pynvml(self) -> None:
        """nvml_unavailable_reason(pynvml) names the missing library and the likely cause."""
        assert nvml_unavailable_reason(pynvml) == LIBRARY_NOT_FOUND_LINE

    def test_unavailable_reason_none_when_nvml_works(self) -> None:
        """With a working NVML the reason is None and the init refcount is left as found."""
        fake = FakeNvml()
        assert nvml_unavailable_reason(fake) is None
        assert not fake.initialized

    def test_fake_without_driver_is_unsupported(self) -> None:
        """driver_missing: supported() is False, describe/collect raise CollectorUnsupported."""
        c = NvmlGpuCollector(FakeNvml(driver_missing=True))
        assert not c.supported()
        assert c.unavailable_reason == LIBRARY_NOT_FOUND_LINE
        with pytest.raises(CollectorUnsupported):
            c.collect(tpb.Report())

    def test_init_happens_once(self, fake: FakeNvml) -> None:
        """supported() initialises NVML once however often it is asked."""
        c = NvmlGpuCollector(fake)
        assert c.supported() and c.supported()
        assert fake.calls["nvmlInit"] == 1
        c.close()

    def test_implements_the_collector_protocol(self, fake: FakeNvml) -> None:
        """The collector satisfies the Collector protocol and is named "gpu"."""
        c = NvmlGpuCollector(fake)
        assert isinstance(c, Collector)
        assert c.name == "gpu"


class TestDescribe:
    def test_fills_gpus_and_host_facts(self, fake: FakeNvml) -> None:
        """describe() adds one GpuInfo per GPU and the driver / NVML / CUDA versions."""
        c = NvmlGpuCollector(fake)
        c.supported()
        inv = ipb.Inventory()
        c.describe(inv)
        assert len(inv.gpus) == 8
        assert inv.host.driver_version == "550.90.07"
        assert inv.host.nvml_version == "12.550.90.07"
        assert inv.host.cuda_driver_version == "12.4"
        for index, gpu in enumerate(inv.gpus):
            assert gpu.index == index
            assert gpu.uuid == fake.gpu(index).uuid
            assert gpu.pci_bus_id == fake.gpu(index).pci_bus_id
            assert gpu.serial == fake.gpu(index).serial
            assert gpu.model == "NVIDIA H100 80GB HBM3"
            assert gpu.nvlink_count == 18
            assert gpu.memory_total_bytes == 85_520_809_984
            assert gpu.vbios_version
        c.close()

    def test_nvlink_count_zero_when_unsupported(self) -> None:
        """No NVLink state support (a PCIe card): nvlink_count 0 and no link samples."""
        c = NvmlGpuCollector(FakeNvml(gpu_count=2, unsupported={"nvmlDeviceGetNvLinkState"}))
        c.supported()
        inv = ipb.Inventory()
        c.describe(inv)
        assert [g.nvlink_count for g in inv.gpus] == [0, 0]
        report, findings = collect(c)
        assert [len(s.nvlinks) for s in report.gpus] == [0, 0]
        assert findings == []
        c.close()


class TestSamples:
    def test_one_plausible_sample_per_gpu(self, collector: NvmlGpuCollector, fake: FakeNvml) -> None:
        """Each GPU gets a sample with every field set to a plausible value, and no findings."""
        report, findings = collect(collector)
        assert findings == []
        assert len(report.gpus) == 8
        for index, s in enumerate(report.gpus):
            assert s.index == index
            assert s.uuid == fake.gpu(index).uuid
            assert 40 <= s.temperature_c <= 85
            assert 400 <= s.power_w <= 700
            assert s.power_limit_w == 700
            assert 85 <= s.utilization_gpu_pct <= 100
            assert 0 <= s.utilization_memory_pct <= 100
            assert 0 < s.memory_used_bytes < s.memory_total_bytes
            assert 1800 <= s.sm_clock_mhz <= 1980
            assert s.memory_clock_mhz == 2619
            assert 50 <= s.memory_temperature_c <= 90
            assert s.performance_state == 0
            for field in (
                "clock_event_reasons",
                "ecc_sbe_volatile",
                "ecc_dbe_volatile",
                "ecc_sbe_aggregate",
                "ecc_dbe_aggregate",
                "remapped_rows_correctable",
                "remapped_rows_uncorrectable",
                "remap_pending",
                "remap_failure",
                "retired_pages_sbe",
                "retired_pages_dbe",
                "retired_pages_pending",
                "pcie_replay_count",
                "recovery_action",
            ):
                assert s.HasField(field), field
            assert [nl.link for nl in s.nvlinks] == list(range(18))
            assert all(nl.up and nl.HasField("crc_flit_errors") for nl in s.nvlinks)
            assert not s.lost and not s.reset_required

    @pytest.mark.parametrize(
        ("unsupported", "absent"),
        [
            ({"nvmlDeviceGetPowerUsage"}, ["power_w"]),
            ({"nvmlDeviceGetTemperature"}, ["temperature_c"]),
            ({"nvmlDeviceGetRemappedRows"}, ["remapped_rows_correctable", "remap_pending", "remap_failure"]),
            (
                {"nvmlDeviceGetRetiredPages", "nvmlDeviceGetRetiredPagesPendingStatus"},
                ["retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending"],
            ),
            ({"nvmlDeviceGetTotalEccErrors"}, ["ecc_sbe_volatile", "ecc_dbe_aggregate"]),
            ({"nvmlDeviceGetPcieReplayCounter"}, ["pcie_replay_count"]),
            ({82}, ["memory_temperature_c"]),
            ({230}, ["recovery_action"]),
            ({"nvmlDeviceGetFieldValues"}, ["recovery_action", "memory_temperature_c"]),
        ],
    )
    def test_unsupported_is_absent_not_zero(self, unsupported: set[Any], absent: list[str]) -> None:
        """An unsupported function or field leaves the field unset (HasField False), never 0."""
        c = NvmlGpuCollector(FakeNvml(gpu_count=2, unsupported=frozenset(unsupported)))
        c.supported()
        report, findings = collect(c)
        assert findings == []
        for s in report.gpus:
            for field in absent:
                assert not s.HasField(field), field
            assert s.HasField("sm_clock_mhz")
        c.close()

    def test_unsupported_nvlink_counter_is_absent(self) -> None:
        """An unsupported NVLink error counter leaves that counter unset on each link."""
        c = NvmlGpuCollector(FakeNvml(gpu_count=1, unsupported={"nvmlDeviceGetNvLinkErrorCounter"}))
        c.supported()
        report, _ = collect(c)
        links = report.gpus[0].nvlinks
        assert len(links) == 18
        assert not any(nl.HasField("replay_errors") for nl in links)
        c.close()

    def test_nvlink_error_counters_keep_the_per_call_rules(
        self, collector: NvmlGpuCollector, fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Absent, other-error, reset-required and lost answers of the per-link counters, as for any call."""
        real = fake.nvmlDeviceGetNvLinkErrorCounter
        asked: list[tuple[int, int, int]] = []

        def counter(handle: Any, link: int, which: int) -> int:
            index = fake.nvmlDeviceGetIndex(handle)
            asked.append((index, link, which))
            if which == 4:
                raise pynvml.NVMLError_NotSupported()
            if (index, link, which) == (0, 1, 2):
                raise pynvml.NVMLError_NoPermission()
            if (index, link, which) == (3, 5, 1):
                raise pynvml.NVMLError_GpuIsLost()
            if (index, link, which) == (6, 0, 0):
                raise pynvml.NVMLError_ResetRequired()
            return int(real(handle, link, which))

        monkeypatch.setattr(fake, "nvmlDeviceGetNvLinkErrorCounter", counter)
        report, _ = collect(collector)
        g0, g3, g6 = report.gpus[0], report.gpus[3], report.gpus[6]
        assert not any(nl.HasField("ecc_data_errors") for g in report.gpus for nl in g.nvlinks)
        assert [nl.link for nl in g0.nvlinks if not nl.HasField("crc_flit_errors")] == [1]
        assert all(nl.HasField("crc_data_errors") for nl in g0.nvlinks)
        assert g3.lost and len(g3.nvlinks) == 18
        assert [nl.HasField("replay_errors") for nl in g3.nvlinks] == [True] * 6 + [False] * 12
        assert all(nl.HasField("recovery_errors") for nl in g3.nvlinks[:5])
        assert not any(nl.HasField("recovery_errors") for nl in g3.nvlinks[5:])
        assert max(link for index, link, _ in asked if index == 3) == 5  # nothing asked once lost
        assert g6.reset_required and not g6.nvlinks[0].HasField("replay_errors")
        assert g6.nvlinks[0].HasField("recovery_errors") and g6.nvlinks[1].HasField("replay_errors")
        assert not report.gpus[5].lost and not report.gpus[5].reset_required

    @pytest.mark.parametrize("batch_fields", [True, False], ids=["batched", "one-call-per-value"])
    def test_other_nvml_error_leaves_field_absent(
        self, fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, batch_fields: bool
    ) -> None:
        """An unexpected NVML error (NoPermission) on one metric leaves only that metric unset."""

        def no_permission(handle: Any) -> int:
            raise pynvml.NVMLError_NoPermission()

        field_values = fake.nvmlDeviceGetFieldValues

        def field_no_permission(handle: Any, fieldIds: Any) -> Any:
            values = field_values(handle, fieldIds)
            for fv in values:
                if fv.fieldId == pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER:
                    fv.nvmlReturn = pynvml.NVML_ERROR_NO_PERMISSION
            return values

        monkeypatch.setattr(fake, "nvmlDeviceGetPcieReplayCounter", no_permission)
        monkeypatch.setattr(fake, "nvmlDeviceGetFieldValues", field_no_permission)
        c = NvmlGpuCollector(fake, batch_fields=batch_fields)
        c.supported()
        report, _ = collect(c)
        assert not any(s.HasField("pcie_replay_count") for s in report.gpus)
        assert all(s.HasField("power_w") for s in report.gpus)
        c.close()

    def test_lost_gpu_does_not_stop_the_others(self, collector: NvmlGpuCollector, fake: FakeNvml) -> None:
        """GPU 2 lost: its sample says lost (uuid from inventory), the other 7 are complete."""
        fake.inject_gpu_lost(2)
        report, _ = collect(collector)
        assert len(report.gpus) == 8
        lost = report.gpus[2]
        assert lost.lost and lost.uuid == fake.gpu(2).uuid
        assert not lost.HasField("temperature_c")
        others = [s for s in report.gpus if s.index != 2]
        assert all(s.HasField("temperature_c") and not s.lost for s in others)

    def test_surprise_exception_on_one_gpu_is_isolated(
        self, collector: NvmlGpuCollector, fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A non-NVML exception while sampling one GPU skips only that GPU."""
        real = fake.nvmlDeviceGetHandleByIndex

        def flaky(index: int) -> Any:
            if index == 4:
                raise RuntimeError("boom")
            return real(index)

        monkeypatch.setattr(fake, "nvmlDeviceGetHandleByIndex", flaky)
        report, _ = collect(collector)
        assert [s.index for s in report.gpus] == [0, 1, 2, 3, 5, 6, 7]

    def test_pci_address_asked_once_per_uuid(
        self, collector: NvmlGpuCollector, fake: FakeNvml, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """describe() read each GPU's PCI address; cycles do not ask again, and findings still carry it."""
        asked: list[Any] = []
        real = fake.nvmlDeviceGetPciInfo

        def counting(handle: Any) -> Any:
            asked.append(handle)
            return real(handle)

        monkeypatch.setattr(fake, "nvmlDeviceGetPciInfo", counting)
        collect(collector)
        fake.inject_thermal_slowdown(3)
        _, findings = collect(collector)
        assert asked == []
        assert [f.pci for f in findings] == [fake.gpu(3).pci_bus_id]

    def test_reset_required_flags_the_sample(self, collector: NvmlGpuCollector, fake: FakeNvml) -> None:
        """ResetRequired sets reset_required; the metrics it blocks are absent."""
        fake.inject_reset_required(6)
        report, _ = collect(collector)
        s = report.gpus[6]
        assert s.reset_required and not s.lost
        assert not s.HasField("power_w")

    def test_fail_slow_shows_in_samples_without_a_finding(self, collector: NvmlGpuCollector, fake: FakeNvml) -> None:
        """A fail-slow GPU shows lower SM clock, power and utilization; judging it is the controller's."""
        fake.set_slow(3, 0.6)
        report, findings = collect(collector)
        assert findings == []
        slow, peer = report.gpus[3], report.gpus[4]
        assert slow.sm_clock_mhz < 0.7 * peer.sm_clock_mhz
        assert slow.utilization_gpu_pct < 0.7 * peer.utilization_gpu_pct
        assert slow.power_w < peer.power_w


FAULTS: list[tuple[str, Callable[[FakeNvml, int], None], str, str, str]] = [
    ("gpu_lost", lambda f, i: f.inject_gpu_lost(i), "gpu_lost", "reboot", "fatal"),
    (
        "reset_required",
        lambda f, i: f.inject_reset_required(i),
        "gpu_reset_required",
        "reset_gpu",
        "critical",
    ),
    ("ecc_dbe", lambda f, i: f.inject_ecc_dbe(i), "ecc_dbe", "reset_gpu", "critical"),
    (
        "row_remap_failure",
        lambda f, i: f.inject_row_remap_failure(i),
        "row_remap_failure",
        "contact_support",
        "critical",
    ),
    ("nvlink_down", lambda f, i: f.inject_nvlink_down(i, 5), "nvlink_down", "reset_gpu", "critical"),
    ("thermal", lambda f, i: f.inject_thermal_slowdown(i), "thermal_slowdown", "investigate", "warning"),
    (
        "recovery_reset",
        lambda f, i: f.set_recovery_action(i, 1),
        "gpu_recovery_action",
        "reset_gpu",
        "critical",
    ),
    ("recovery_reboot", lambda f, i: f.set_recovery_action(i, 2), "gpu_recovery_action", "reboot", "fatal"),
]


class TestFindings:
    @pytest.mark.parametrize("fault", FAULTS, ids=[f[0] for f in FAULTS])
    def test_fault_reported_once_and_cleared(
        self, collector: NvmlGpuCollector, fake: FakeNvml, fault: tuple[Any, ...]
    ) -> None:
        """A fault gives exactly one finding of the right kind/action; clear() restores; it re-arms."""
        _, inject, kind, action, severity = fault
        assert collect(collector)[1] == []
        inject(fake, 3)
        _, findings = collect(collector)
        assert [(f.kind, f.action, f.severity, f.component) for f in findings] == [(kind, action, severity, "gpu-3")]
        finding = findings[0]
        assert finding.source == "nvml"
        assert finding.pci == fake.gpu(3).pci_bus_id
        assert finding.attributes["uuid"] == fake.gpu(3).uuid
        assert collect(collector)[1] == []  # not repeated

        fake.clear(3)
        report, findings = collect(collector)
        assert findings == []
        s = report.gpus[3]
        assert not s.lost and not s.reset_required and s.HasField("temperature_c")
        assert all(nl.up for nl in s.nvlinks)
        assert s.clock_event_reasons == 0 and s.recovery_action == 0

        inject(fake, 3)
        assert [f.kind for f in collect(collector)[1]] == [kind]  # re-armed after clearing

    def test_gpu_lost_carries_xid_79(self, collector: NvmlGpuCollector, fake: FakeNvml) -> None:
        """gpu_lost names Xid 79 in the finding and its attributes."""
        fake.inject_gpu_lost(0)
        (finding,) = collect(collector)[1]
        assert finding.xid == 79
        assert finding.attributes["xid_mnemonic"] == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"  # NVIDIA's own name
        assert finding.to_event().kind == tpb.EVENT_KIND_GPU_LOST

    def test_already_bad_state_counts_on_first_collect(self, fake: FakeNvml) -> None:
        """Faults present before the first collect are reported by it (a one-shot scan sees them)."""
        fake.nvmlInit()
        fake.inject_ecc_dbe(1)
        fake.inject_thermal_slowdown(2)
        fake.inject_nvlink_down(4, 0)
        fake.nvmlShutdown()
        c = NvmlGpuCollector(fake)
        c.supported()
        c.describe(ipb.Inventory())
        kinds = sorted((f.kind, f.component) for f in collect(c)[1])
        assert kinds == [("ecc_dbe", "gpu-1"), ("nvlink_down", "gpu-4"), ("thermal_slowdown", "gpu-2")]
        c.close()

    def test_device_count_drop_is_gpu_lost(self, collector: NvmlGpuCollector, fake: FakeNvml) -> None:
        """A GPU that disappears from enumeration gives one gpu_lost naming the inventory GPU."""
        collect(collector)
        fake.remove_gpu(5)
        report, findings = collect(collector)
        assert len(report.gpus) == 7
        assert [(f.kind, f.component, f.pci) for f in findings] == [("gpu_lost", "gpu-5", fake.gpu(5).pci_bus_id)]
        assert findings[0].attributes["device_count"] == "7"
        assert collect(collector)[1] == []

    def test_recovery_action_change_is_reported(self, collector: NvmlGpuCollector, fake: FakeNvml) -> None:
        """Recovery action going 1 -> 2 gives a second finding with the new action."""
        fake.set_recovery_action(0, 1)
        assert [f.action for f in collect(collector)[1]] == ["reset_gpu"]
        fake.set_recovery_action(0, 2)
        assert [f.action for f in collect(collector)[1]] == ["reboot"]

    def test_second_dbe_is_reported_again(self, collector: NvmlGpuCollector, fake: FakeNvml) -> None:
        """Each new DBE (counter increase) is a new finding."""
        fake.inject_ecc_dbe(7)
        assert [f.kind for f in collect(collector)[1]] == ["ecc_dbe"]
        fake.inject_ecc_dbe(7)
        assert [f.kind for f in collect(collector)[1]] == ["ecc_dbe"]

    def test_findings_convert_to_events(self, collector: NvmlGpuCollector, fake: FakeNvml) -> None:
        """Every finding kind the collector emits is a valid wire event."""
        for index, (_, inject, *_rest) in enumerate(FAULTS[:7]):
            inject(fake, index)
        findings = collect(collector)[1]
        assert len(findings) == 7
        for f in findings:
            assert f.to_event().kind != tpb.EVENT_KIND_UNSPECIFIED


class TestEventThread:
    @pytest.fixture
    def sink(self) -> Sink:
        return Sink()

    @pytest.fixture
    def running(self, fake: FakeNvml, sink: Sink) -> Iterator[NvmlGpuCollector]:
        c = NvmlGpuCollector(fake, sink=sink, event_timeout_ms=50)
        assert c.supported()
        c.describe(ipb.Inventory())
        assert c.start_events()
        yield c
        c.close()

    @pytest.mark.parametrize(
        "case", [(79, "reboot", "fatal"), (95, "reset_gpu", "critical"), (13, "restart_app", "warning")]
    )
    def test_xid_event_gives_catalog_action(
        self, running: NvmlGpuCollector, fake: FakeNvml, sink: Sink, case: tuple[int, str, str]
    ) -> None:
        """An Xid event becomes an xid finding with the catalog's action and description."""
        xid, action, severity = case
        fake.inject_xid(4, xid)
        (finding,) = sink.wait_for(lambda fs: any(f.kind == "xid" for f in fs))
        assert (finding.xid, finding.action, finding.severity) == (xid, action, severity)
        assert finding.component == "gpu-4"
        assert finding.pci == fake.gpu(4).pci_bus_id
        assert finding.source == "nvml"
        assert lookup(xid).description in finding.message

    def test_unknown_xid_is_investigated(self, running: NvmlGpuCollector, fake: FakeNvml, sink: Sink) -> None:
        """An Xid missing from the catalog is a warning to investigate, not ignored."""
        fake.inject_xid(0, 999)
        (finding,) = sink.wait_for(lambda fs: len(fs) == 1)
        assert (finding.kind, finding.action, finding.severity) == ("xid", "investigate", "warning")

    def test_dbe_event_reported_once(self, running: NvmlGpuCollector, fake: FakeNvml, sink: Sink) -> None:
        """A DBE event gives ecc_dbe through the sink; the next collect does not repeat it."""
        fake.inject_ecc_dbe(2)
        (finding,) = sink.wait_for(lambda fs: len(fs) == 1)
        assert (finding.kind, finding.component, finding.action) == ("ecc_dbe", "gpu-2", "reset_gpu")
        assert collect(running)[1] == []

    def test_recovery_action_event(self, running: NvmlGpuCollector, fake: FakeNvml, sink: Sink) -> None:
        """A recovery-action event gives gpu_recovery_action with the mapped action, once."""
        fake.set_recovery_action(1, 4)
        (finding,) = sink.wait_for(lambda fs: len(fs) == 1)
        assert (finding.kind, finding.action) == ("gpu_recovery_action", "reset_gpu")
        assert finding.attributes["recovery_action_name"] == "DRAIN_AND_RESET"
        assert collect(running)[1] == []

    def test_gpu_lost_in_wait_reported_once(self, running: NvmlGpuCollector, fake: FakeNvml, sink: Sink) -> None:
        """GpuIsLost from the wait gives one gpu_lost (after the Xid 79); the thread keeps going."""
        fake.inject_gpu_lost(6)
        findings = sink.wait_for(lambda fs: any(f.kind == "gpu_lost" for f in fs))
        assert [f.kind for f in findings] == ["xid", "gpu_lost"]
        assert findings[1].component == "gpu-6"
        assert collect(running)[1] == []
        fake.inject_xid(1, 13)
        sink.wait_for(lambda fs: any(f.xid == 13 for f in fs))
        assert len(sink.kinds("gpu_lost")) == 1
        assert running.events_running

    def test_wait_errors_are_survived(self, fake: FakeNvml, sink: Sink, monkeypatch: pytest.MonkeyPatch) -> None:
        """Unexpected wait errors are logged and backed off; events still arrive afterwards."""
        real = fake.nvmlEventSetWait
        failures = iter([pynvml.NVMLError_Unknown(), pynvml.NVMLError_Unknown()])

        def flaky(es: Any, timeout_ms: int) -> Any:
            err = next(failures, None)
            if err is not None:
                raise err
            return real(es, timeout_ms)

        monkeypatch.setattr(fake, "nvmlEventSetWait", flaky)
        c = NvmlGpuCollector(fake, sink=sink, event_timeout_ms=50)
        c.supported()
        assert c.start_events()
        fake.inject_xid(0, 95)
        (finding,) = sink.wait_for(lambda fs: len(fs) == 1)
        assert finding.xid == 95
        c.close()

    def test_without_sink_collect_returns_event_findings(self, fake: FakeNvml) -> None:
        """With no sink, event findings come back from the next collect()."""
        c = NvmlGpuCollector(fake, event_timeout_ms=50)
        c.supported()
        assert c.start_events()
        fake.inject_xid(3, 13)
        deadline = time.monotonic() + 5
        found: list[Finding] = []
        while not found:
            assert time.monotonic() < deadline
            found = [f for f in collect(c)[1] if f.kind == "xid"]
            time.sleep(0.01)
        assert found[0].xid == 13
        c.close()

    def test_close_stops_the_thread_and_nvml(self, fake: FakeNvml, sink: Sink) -> None:
        """close() joins the thread, frees the set, shuts NVML down, and is idempotent."""
        c = NvmlGpuCollector(fake, sink=sink, event_timeout_ms=50)
        c.supported()
        assert c.start_events()
        assert c.events_running
        c.close()
        assert not c.events_running  # joined within close()'s limit; one left running would stay alive
        assert not fake.initialized
        c.close()
        assert fake.calls["nvmlShutdown"] == 1
        assert fake.calls["nvmlEventSetFree"] == 1

    def test_close_while_a_gpu_is_lost(self, running: NvmlGpuCollector, fake: FakeNvml, sink: Sink) -> None:
        """close() returns promptly even while the thread is backing off after GpuIsLost."""
        fake.inject_gpu_lost(0)
        sink.wait_for(lambda fs: any(f.kind == "gpu_lost" for f in fs))
        running.close()
        assert not running.events_running  # joined within close()'s limit, back-off or not

    def test_no_event_support_does_not_start(self) -> None:
        """When registration fails on every device, start_events() is False and no thread runs."""
        c = NvmlGpuCollector(FakeNvml(gpu_count=2, unsupported={"nvmlDeviceRegisterEvents"}))
        c.supported()
        assert c.start_events() is False
        assert not c.events_running
        c.close()

    def test_registration_failure_skips_only_that_device(
        self, fake: FakeNvml, sink: Sink, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A device whose registration fails is skipped; the others still deliver events."""
        real = fake.nvmlDeviceRegisterEvents

        def register(handle: Any, mask: int, es: Any) -> None:
            if handle.gpu == 0:
                raise pynvml.NVMLError_NotSupported()
            real(handle, mask, es)

        monkeypatch.setattr(fake, "nvmlDeviceRegisterEvents", register)
        c = NvmlGpuCollector(fake, sink=sink, event_timeout_ms=50)
        c.supported()
        assert c.start_events()
        fake.inject_xid(0, 13)
        fake.inject_xid(1, 95)
        (finding,) = sink.wait_for(lambda fs: len(fs) == 1)
        assert (finding.component, finding.xid) == ("gpu-1", 95)
        c.close()
