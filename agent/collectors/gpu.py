"""GPU collector: NVML inventory, per-cycle samples, transition findings and an event thread.

``nvml`` is a seam: the real ``pynvml`` module in production, ``agent.sim.fake_nvml.FakeNvml``
in tests and the simulator. Both raise pynvml's own exception classes.

Rules this module keeps:
- A failed read means what ``nvml_errors`` says (``nvml_reader.DeviceReader``): a metric
  the device or driver does not support stays UNSET in the sample (absent, never 0), a lost
  GPU marks the sample ``lost``, one that needs a reset ``reset_required``; one GPU failing
  never stops the others.
- Findings are returned only on transitions (``gpu_transitions``), so a steady fault is
  reported once, and again only after it clears.
- Findings the event thread already delivered (DBE, recovery action, lost) are not
  repeated by the next ``collect`` for the same change.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from dataclasses import dataclass
from typing import Any

import pynvml  # imports without a driver: the library is loaded lazily by nvmlInit
import structlog

from agent.collectors import gpu_transitions as gt
from agent.collectors import nvml_fields as nf
from agent.collectors.base import CollectorUnsupported, FindingSink
from agent.collectors.gpu_transitions import GpuIdent, GpuState
from agent.collectors.nvml_errors import Outcome, sort_code, sort_error
from agent.collectors.nvml_reader import DeviceReader
from starpulse.core import vocab
from starpulse.core import xid as xidcat
from starpulse.core.findings import Finding
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

FI_MEMORY_TEMP = nf.FI_MEMORY_TEMP
FI_RECOVERY_ACTION = nf.FI_RECOVERY_ACTION

# nvmlDeviceGetTotalEccErrors arguments of each ECC group of nvml_fields.GROUPS.
_ECC_ARGS = {
    "ecc_sbe_volatile": (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC),
    "ecc_dbe_volatile": (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
    "ecc_sbe_aggregate": (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC),
    "ecc_dbe_aggregate": (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC),
}
_RETIRED_CAUSE = {
    "retired_pages_sbe": pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
    "retired_pages_dbe": pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
}

# Event bits the thread registers for (each device: only those it supports).
EVENT_XID = 0x8  # nvmlEventTypeXidCriticalError
EVENT_DBE = 0x2  # nvmlEventTypeDoubleBitEccError
EVENT_RECOVERY_ACTION = 0x8000  # nvmlEventTypeGpuRecoveryAction
WANTED_EVENTS = EVENT_XID | EVENT_DBE | EVENT_RECOVERY_ACTION

_BACKOFF_INITIAL_S = 0.2
_BACKOFF_MAX_S = 5.0

_INIT_HINTS = {
    "NVMLError_LibraryNotFound": "is the NVIDIA driver installed?",
    "NVMLError_DriverNotLoaded": "is the nvidia kernel module loaded?",
    "NVMLError_NoPermission": "no permission to open the NVIDIA device nodes",
    "NVMLError_LibRmVersionMismatch": "driver library and kernel module differ; reload the driver or reboot",
}


def _init_error_line(err: BaseException) -> str:
    """One human line for an nvmlInit failure."""
    hint = _INIT_HINTS.get(type(err).__name__)
    return f"NVML unavailable: {err} ({hint})" if hint else f"NVML unavailable: {err}"


def nvml_unavailable_reason(nvml: Any) -> str | None:
    """Why NVML cannot be used on this host, as one line; None when it can.

    Leaves the library's init refcount as it found it.
    """
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as err:
        return _init_error_line(err)
    with contextlib.suppress(nvml.NVMLError):
        nvml.nvmlShutdown()
    return None


def _cuda_version_str(value: int) -> str:
    """12040 -> "12.4", the form nvidia-smi prints."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def _handle_key(handle: Any) -> Any:
    """A hashable key for a device handle: ctypes pointers compare by address, fakes by value."""
    if isinstance(handle, ctypes._Pointer):
        return ctypes.cast(handle, ctypes.c_void_p).value
    return handle


@dataclass
class _FieldPlan:
    """One GPU's nvmlDeviceGetFieldValues request and where each group's answers sit in it."""

    links: tuple[int, ...]
    request: list[int | tuple[int, int]]
    groups: list[tuple[nf.FieldGroup, int]]  # (group, index of its first field)
    single: list[nf.FieldGroup]  # groups read with their single call on this GPU
    link_at: list[tuple[int, int]]  # (link, index); empty when link state uses the single call
    nvlink_single: bool


class NvmlGpuCollector:
    """Collector for NVIDIA GPUs through NVML (name "gpu"); one ``AcceleratorBackend``."""

    name = "gpu"
    vendor = "nvidia"
    interconnect = "nvlink"
    tool = "NVML"  # what a "could not check" line names

    def __init__(
        self,
        nvml: Any = pynvml,
        sink: FindingSink | None = None,
        event_timeout_ms: int = 1000,
        batch_fields: bool = True,
    ) -> None:
        self._nvml = nvml
        self._sink = sink
        self._event_timeout_ms = event_timeout_ms
        self.unavailable_reason: str | None = None
        self._init_tried = False
        self._initialized = False
        self._closed = False
        self._lock = threading.Lock()  # guards state shared with the event thread
        self._idents: dict[int, GpuIdent] = {}  # by NVML index
        self._inventory: dict[str, GpuIdent] = {}  # by key, as described
        self._inventory_links: dict[str, set[int]] = {}
        self._state: dict[str, GpuState] = {}
        self._pending: list[Finding] = []  # event findings when there is no sink
        self._warned: set[tuple[int, str, int]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self._event_handles: dict[Any, int] = {}
        self._event_lost_unknown_announced = False
        # Seconds between reads of the NVLink error counters (5 per link, 18 links: 90 NVML
        # calls per GPU); 0: every cycle. Link state is read every cycle regardless.
        self.slow_every_s = 0.0
        self._nvlink_counters: dict[str, tuple[float, dict[int, tpb.NvLinkSample]]] = {}
        # By key, between full reads: (read_at, links, states, a GpuSample holding only those
        # nvlinks) so that a cycle whose link states did not change merges them in one call.
        self._nvlink_merge: dict[str, tuple[float, tuple[int, ...], tuple[int | None, ...], tpb.GpuSample]] = {}
        self._merged_into: dict[str, tpb.GpuSample] = {}  # this cycle's kept nvlinks, for _transitions
        # One nvmlDeviceGetFieldValues call per GPU and cycle for the values in
        # nvml_fields.GROUPS and NVLink states (False: one call per value, as before; also
        # where the driver has no field-values API). Per GPU: the plan, the groups that
        # fell back to their single call, and what was already checked against it.
        self._batch = batch_fields and hasattr(nvml, "nvmlDeviceGetFieldValues")
        self._field_plans: dict[str, _FieldPlan] = {}
        self._single_groups: dict[str, set[str]] = {}
        self._verified: set[tuple[str, str, int]] = set()
        self._pcie_max: dict[str, tuple[int | None, int | None]] = {}  # by key: max link width, generation

    # ---- Collector protocol ---------------------------------------------------------

    def supported(self) -> bool:
        """Initialise NVML once; False (with ``unavailable_reason``) when it cannot be used."""
        if self._init_tried:
            return self._initialized
        self._init_tried = True
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as err:
            self.unavailable_reason = _init_error_line(err)
            log.info("nvml_unavailable", reason=self.unavailable_reason)
            return False
        self._initialized = True
        return True

    def describe(self, inventory: ipb.Inventory) -> None:
        """Driver versions into host facts, one GpuInfo per enumerated device."""
        self._require_init()
        nvml = self._nvml
        host = inventory.host
        host.driver_version = self._system_str("nvmlSystemGetDriverVersion")
        host.nvml_version = self._system_str("nvmlSystemGetNVMLVersion")
        cuda = self._system_int("nvmlSystemGetCudaDriverVersion_v2")
        if cuda is None:
            cuda = self._system_int("nvmlSystemGetCudaDriverVersion")
        if cuda is not None:
            host.cuda_driver_version = _cuda_version_str(cuda)

        count = nvml.nvmlDeviceGetCount()
        for index in range(count):
            info = inventory.gpus.add(index=index)
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError as err:
                log.warning("nvml_gpu_describe_failed", gpu=index, error=str(err))
                continue
            reader = DeviceReader(nvml, handle, index, self._warn_once)
            ident = GpuIdent(index, reader.call("nvmlDeviceGetUUID") or "", self._pci(reader))
            info.uuid = ident.uuid
            info.pci_bus_id = ident.pci
            info.serial = reader.call("nvmlDeviceGetSerial") or ""
            info.model = reader.call("nvmlDeviceGetName") or ""
            info.vbios_version = reader.call("nvmlDeviceGetVbiosVersion") or ""
            mem = reader.call("nvmlDeviceGetMemoryInfo")
            if mem is not None:
                info.memory_total_bytes = int(mem.total)
            links = {
                link
                for link in range(nvml.NVML_NVLINK_MAX_LINKS)
                if reader.call("nvmlDeviceGetNvLinkState", link, link=True) is not None
            }
            info.nvlink_count = len(links)
            info.vendor, info.interconnect, info.link_count = self.vendor, self.interconnect, len(links)
            with self._lock:
                self._idents[index] = ident
                self._inventory[ident.key] = ident
                self._inventory_links[ident.key] = links

    def collect(self, report: tpb.Report) -> list[Finding]:
        """One GpuSample per enumerated GPU; findings for what changed since the last cycle."""
        self._require_init()
        nvml = self._nvml
        findings: list[Finding] = []
        count = nvml.nvmlDeviceGetCount()
        seen: set[str] = set()
        self._merged_into.clear()  # none left over from a GPU whose sample failed last cycle
        for index in range(count):
            sample = tpb.GpuSample(index=index)
            try:
                ident = self._sample(index, sample)
            except Exception as err:  # one GPU's surprise must not cost the others
                log.exception("nvml_gpu_sample_failed", gpu=index, error=str(err))
                continue
            report.gpus.append(sample)
            seen.add(ident.key)
            findings.extend(self._transitions(sample, ident))
        findings.extend(self._missing(count, seen))
        with self._lock:
            findings.extend(self._pending)
            self._pending.clear()
        return findings

    def close(self) -> None:
        """Stop the event thread, free its event set, shut NVML down. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=self._event_timeout_ms / 1000.0 + 5.0)
            if thread.is_alive():
                log.warning("nvml_event_thread_did_not_stop")
        if self._event_set is not None and (thread is None or not thread.is_alive()):
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlEventSetFree(self._event_set)
            self._event_set = None
        if self._initialized:
            self._initialized = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as err:
                log.warning("nvml_shutdown_failed", error=str(err))

    # ---- event thread -----------------------------------------------------------------

    def start_events(self) -> bool:
        """Register for Xid / DBE / recovery-action events and start the daemon thread.

        Registration happens here, in the caller's thread, so an event raised after this
        returns True is delivered. False when no device supports any wanted event.
        """
        if self._thread is not None:
            return True
        self._require_init()
        nvml = self._nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as err:
            log.warning("nvml_event_set_create_failed", error=str(err))
            return False
        handles: dict[Any, int] = {}
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                mask = nvml.nvmlDeviceGetSupportedEventTypes(handle) & WANTED_EVENTS
                if mask:
                    nvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
                    handles[_handle_key(handle)] = index
                    self._remember_ident(index, handle)
            except nvml.NVMLError as err:
                log.warning("nvml_event_register_failed", gpu=index, error=str(err))
        if not handles:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlEventSetFree(event_set)
            log.warning("nvml_events_unavailable", reason="no device supports Xid/DBE/recovery events")
            return False
        self._event_set = event_set
        self._event_handles = handles
        self._stop.clear()
        self._thread = threading.Thread(target=self._event_loop, name="nvml-events", daemon=True)
        self._thread.start()
        return True

    @property
    def events_running(self) -> bool:
        """True while the event thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def _event_loop(self) -> None:
        """Wait for NVML events until stopped; errors are logged and backed off, never fatal."""
        nvml = self._nvml
        backoff = _BACKOFF_INITIAL_S
        log.info("nvml_event_thread_started", devices=len(self._event_handles))
        try:
            while not self._stop.is_set():
                try:
                    data = nvml.nvmlEventSetWait(self._event_set, self._event_timeout_ms)
                except nvml.NVMLError_Timeout:
                    backoff = _BACKOFF_INITIAL_S
                    continue
                except Exception as err:
                    if sort_error(err) is Outcome.LOST:
                        self._on_event_gpu_lost()
                    else:
                        log.warning("nvml_event_wait_failed", error=str(err), backoff_s=backoff)
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, _BACKOFF_MAX_S)
                    continue
                backoff = _BACKOFF_INITIAL_S
                try:
                    self._on_event(data)
                except Exception as err:
                    log.exception("nvml_event_handling_failed", error=str(err))
        finally:
            log.info("nvml_event_thread_stopped")

    def _on_event(self, data: Any) -> None:
        """Turn one NVML event into findings."""
        ident = self._event_ident(data.device)
        event_type = int(data.eventType)
        event_data = int(data.eventData)
        if event_type & EVENT_XID:
            info = xidcat.lookup(event_data)
            self._emit(
                gt.gpu_finding(
                    "xid",
                    ident,
                    info.severity,
                    info.action,
                    f"Xid {event_data} ({info.mnemonic}): {info.description}",
                    xid=event_data,
                    mnemonic=info.mnemonic,
                    nvidia_resolution=info.immediate,
                )
            )
        if event_type & EVENT_DBE:
            with self._lock:
                self._state_for(ident).dbe_events_unconsumed += 1
            self._emit(gt.dbe_finding(ident, "NVML double-bit ECC event"))
        if event_type & EVENT_RECOVERY_ACTION:
            value = self._recovery_action_now(data.device)
            if value is None:
                value = event_data
            with self._lock:
                state = self._state_for(ident)
                changed = value != state.recovery_action
                state.recovery_action = value
            if changed and value:
                self._emit(gt.recovery_finding(ident, value))

    def _on_event_gpu_lost(self) -> None:
        """nvmlEventSetWait said a GPU is lost: find which, report each once."""
        nvml = self._nvml
        lost: list[GpuIdent] = []
        for index in sorted(set(self._event_handles.values())):
            try:
                nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index))
            except nvml.NVMLError as err:
                if sort_error(err) is Outcome.LOST:
                    with self._lock:
                        lost.append(self._idents.get(index) or GpuIdent(index))
        if not lost:
            with self._lock:
                if self._event_lost_unknown_announced:
                    return
                self._event_lost_unknown_announced = True
            log.warning("nvml_event_gpu_lost_unidentified")
            self._emit(
                Finding(
                    kind="gpu_lost",
                    component="gpu",
                    severity="fatal",
                    action=vocab.ACTION_REBOOT,
                    message="NVML event wait reports a GPU is lost (device not identified)",
                    source=gt.SOURCE,
                    xid=79,
                    attributes={"xid": "79", "nvml_error": "GPU is lost"},
                )
            )
            return
        for ident in lost:
            with self._lock:
                state = self._state_for(ident)
                if state.lost_announced:
                    continue
                state.lost_announced = True
            self._emit(gt.lost_finding(ident, "NVML event wait: GPU is lost"))

    def _event_ident(self, device: Any) -> GpuIdent:
        index = self._event_handles.get(_handle_key(device))
        if index is None:
            try:
                index = int(self._nvml.nvmlDeviceGetIndex(device))
            except self._nvml.NVMLError:
                return GpuIdent(-1)
        with self._lock:
            return self._idents.get(index) or GpuIdent(index)

    def _recovery_action_now(self, handle: Any) -> int | None:
        try:
            values = self._nvml.nvmlDeviceGetFieldValues(handle, [FI_RECOVERY_ACTION])
        except self._nvml.NVMLError:
            return None
        for fv in values:
            if fv.nvmlReturn == self._nvml.NVML_SUCCESS:
                value = nf.field_value(fv)
                return None if value is None else int(value)
        return None

    def _emit(self, finding: Finding) -> None:
        """Deliver an event-thread finding to the sink, or queue it for the next collect."""
        log.info("nvml_event_finding", kind=finding.kind, component=finding.component, action=finding.action)
        if self._sink is not None:
            try:
                self._sink(finding)
                return
            except Exception as err:
                log.exception("finding_sink_failed", error=str(err))
        with self._lock:
            self._pending.append(finding)

    # ---- sampling -----------------------------------------------------------------------

    def _sample(self, index: int, sample: tpb.GpuSample) -> GpuIdent:
        """Read every GpuSample field of one GPU into ``sample``, leaving unsupported ones unset."""
        nvml = self._nvml
        with self._lock:
            ident = self._idents.get(index) or GpuIdent(index)
        sample.uuid = ident.uuid
        handle = self._handle(index, sample)
        if handle is None:
            return ident

        r = DeviceReader(nvml, handle, index, self._warn_once)
        uuid = r.call("nvmlDeviceGetUUID")
        if uuid:
            # The PCI address belongs to the UUID: asked again only when the UUID is new here.
            if uuid != ident.uuid or not ident.pci:
                ident = GpuIdent(index, uuid, self._pci(r) or ident.pci)
                with self._lock:
                    self._idents[index] = ident
            sample.uuid = uuid

        temp = r.call("nvmlDeviceGetTemperature", nvml.NVML_TEMPERATURE_GPU)
        if temp is not None:
            sample.temperature_c = float(temp)
        power = r.call("nvmlDeviceGetPowerUsage")
        if power is not None:
            sample.power_w = power / 1000.0
        limit = r.call("nvmlDeviceGetEnforcedPowerLimit")
        if limit is not None:
            sample.power_limit_w = limit / 1000.0
        util = r.call("nvmlDeviceGetUtilizationRates")
        if util is not None:
            sample.utilization_gpu_pct = float(util.gpu)
            sample.utilization_memory_pct = float(util.memory)
        mem = r.call("nvmlDeviceGetMemoryInfo")
        if mem is not None:
            sample.memory_used_bytes = int(mem.used)
            sample.memory_total_bytes = int(mem.total)
        sm = r.call("nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_SM)
        if sm is not None:
            sample.sm_clock_mhz = int(sm)
        mclk = r.call("nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_MEM)
        if mclk is not None:
            sample.memory_clock_mhz = int(mclk)
        reasons = r.call("nvmlDeviceGetCurrentClocksEventReasons")
        if reasons is not None:
            sample.clock_event_reasons = int(reasons)
        pstate = r.call("nvmlDeviceGetPerformanceState")
        if pstate is not None:
            sample.performance_state = int(pstate)
        self._read_pcie_link(r, sample, ident)

        if not (self._batch and self._read_batched(r, handle, sample, ident)):
            self._read_ecc(r, sample)
            self._read_nvlinks(r, sample, ident)
            self._read_fields(r, sample)

        sample.lost = r.lost
        sample.reset_required = r.reset_required
        return ident

    def _read_pcie_link(self, r: DeviceReader, sample: tpb.GpuSample, ident: GpuIdent) -> None:
        """PCIe link width and generation, now (every cycle) and at most (once per GPU).

        The current generation follows the load (a GPU drops it when idle), so it is read
        with the utilisation it is judged against; the maxima are the device's and never
        change, so they are asked once and kept by GPU (two calls per cycle, not four).
        """
        width = r.call("nvmlDeviceGetCurrPcieLinkWidth")
        if width is not None:
            sample.pcie_link_width = int(width)
        gen = r.call("nvmlDeviceGetCurrPcieLinkGeneration")
        if gen is not None:
            sample.pcie_link_gen = int(gen)
        maxima = self._pcie_max.get(ident.key)
        if maxima is None:
            maxima = (r.call("nvmlDeviceGetMaxPcieLinkWidth"), r.call("nvmlDeviceGetMaxPcieLinkGeneration"))
            if r.lost or r.reset_required:
                return  # not an answer about the device: asked again next cycle
            self._pcie_max[ident.key] = maxima
        width_max, gen_max = maxima
        if width_max is not None:
            sample.pcie_link_width_max = int(width_max)
        if gen_max is not None:
            sample.pcie_link_gen_max = int(gen_max)

    def _handle(self, index: int, sample: tpb.GpuSample) -> Any:
        """The device's handle; None when the GPU is lost or needs a reset (``sample`` says which)."""
        try:
            return self._nvml.nvmlDeviceGetHandleByIndex(index)
        except self._nvml.NVMLError as err:
            outcome = sort_error(err)
            if outcome is Outcome.LOST:
                sample.lost = True
            elif outcome is Outcome.RESET_REQUIRED:
                sample.reset_required = True
            else:
                raise
        return None

    def _read_ecc(self, r: DeviceReader, sample: tpb.GpuSample) -> None:
        """ECC counters, row remapping, page retirement, PCIe replays: one NVML call per value."""
        for group in nf.GROUPS:
            if group.single:
                self._read_single(r, sample, group)

    @staticmethod
    def _read_single(r: DeviceReader, sample: tpb.GpuSample, group: nf.FieldGroup) -> None:
        """One group of nvml_fields.GROUPS through its single-value NVML call."""
        kind = group.single
        if kind == "ecc":
            value = r.call("nvmlDeviceGetTotalEccErrors", *_ECC_ARGS[group.name])
            if value is not None:
                setattr(sample, group.name, int(value))
        elif kind == "remapped_rows":
            rows = r.call("nvmlDeviceGetRemappedRows")
            if rows is not None:
                corr, unc, pending, failure = rows
                sample.remapped_rows_correctable = int(corr)
                sample.remapped_rows_uncorrectable = int(unc)
                sample.remap_pending = bool(pending)
                sample.remap_failure = bool(failure)
        elif kind == "retired":
            pages = r.call("nvmlDeviceGetRetiredPages", _RETIRED_CAUSE[group.name])
            if pages is not None:
                setattr(sample, group.name, len(pages))
        elif kind == "retired_pending":
            pending = r.call("nvmlDeviceGetRetiredPagesPendingStatus")
            if pending is not None:
                sample.retired_pages_pending = bool(pending)
        elif kind == "pcie":
            replay = r.call("nvmlDeviceGetPcieReplayCounter")
            if replay is not None:
                sample.pcie_replay_count = int(replay)

    # ---- batched: one nvmlDeviceGetFieldValues call per GPU ---------------------------------

    def _links(self, ident: GpuIdent) -> tuple[int, ...]:
        """NVLinks to read: the inventory's, else every index NVML allows."""
        with self._lock:
            known = self._inventory_links.get(ident.key)
        return tuple(sorted(known)) if known else tuple(range(self._nvml.NVML_NVLINK_MAX_LINKS))

    def _plan(self, key: str, links: tuple[int, ...]) -> _FieldPlan:
        plan = self._field_plans.get(key)
        if plan is not None and plan.links == links:
            return plan
        single = self._single_groups.get(key, set())
        request: list[int | tuple[int, int]] = []
        groups: list[tuple[nf.FieldGroup, int]] = []
        single_groups: list[nf.FieldGroup] = []
        for group in nf.GROUPS:
            if group.name in single:
                single_groups.append(group)
                continue
            groups.append((group, len(request)))
            request.extend(fid for fid, _, _ in group.fields)
        nvlink_single = "nvlink_state" in single
        link_at: list[tuple[int, int]] = []
        if not nvlink_single:
            for link in links:
                link_at.append((link, len(request)))
                request.append((nf.FI_NVLINK_GET_STATE, link))
        plan = _FieldPlan(links, request, groups, single_groups, link_at, nvlink_single)
        self._field_plans[key] = plan
        return plan

    def _read_batched(self, r: DeviceReader, handle: Any, sample: tpb.GpuSample, ident: GpuIdent) -> bool:
        """The nvml_fields values and NVLink states from one call; False: use the single calls.

        The sample comes out exactly as the single calls would fill it. An element that is
        NOT_SUPPORTED is absent, as the single call's NotSupported is; the first time per GPU
        and group the single call is asked too, and if it does answer (a driver without
        that field id) the group uses the single call from then on.
        """
        nvml = self._nvml
        key = ident.key
        states: dict[int, int | None] = {}
        if r.lost:
            self._read_nvlinks(r, sample, ident, states)
            return True
        plan = self._plan(key, self._links(ident))
        try:
            values = nvml.nvmlDeviceGetFieldValues(handle, plan.request)
        except nvml.NVMLError as err:
            outcome = sort_error(err)
            if outcome is Outcome.ABSENT:
                self._batch = False
                log.info("nvml_field_values_unavailable", error=str(err), fallback="one call per value")
                return False
            r.failed(outcome, "nvmlDeviceGetFieldValues", err)
            if outcome is Outcome.OTHER:
                return False
        else:
            decoded = nf.decode(values)
            recheck = self._apply_fields(r, sample, key, plan, decoded)
            for group in plan.single:
                self._read_single(r, sample, group)
            if plan.nvlink_single:
                self._read_nvlinks(r, sample, ident)
            else:
                states = self._link_states(r, key, plan, decoded)
                self._read_nvlinks(r, sample, ident, states)
            for group in recheck:
                self._recheck(r, sample, key, group)
            return True
        self._read_nvlinks(r, sample, ident, states)
        return True

    def _element_failed(self, r: DeviceReader, outcome: Outcome, ret: int, fid: int) -> None:
        r.failed(outcome, f"nvmlDeviceGetFieldValues[{fid}]", self._nvml.NVMLError(ret))

    def _apply_fields(
        self, r: DeviceReader, sample: tpb.GpuSample, key: str, plan: _FieldPlan, decoded: list[tuple[int, Any]]
    ) -> list[nf.FieldGroup]:
        """Set each group whose fields all succeeded; return the absent ones to check once."""
        recheck: list[nf.FieldGroup] = []
        for group, start in plan.groups:
            fields = group.fields
            for offset, (fid, _, _) in enumerate(fields):
                ret, value = decoded[start + offset]
                if ret != nf.SUCCESS:
                    outcome = sort_code(ret)
                    if outcome is not Outcome.ABSENT:
                        self._element_failed(r, outcome, ret, fid)
                    elif group.single and (key, group.name, -1) not in self._verified:
                        recheck.append(group)
                    break
                if value is None:
                    break
            else:
                for offset, (_, attr, kind) in enumerate(fields):
                    setattr(sample, attr, kind(decoded[start + offset][1]))
        return recheck

    def _link_states(
        self, r: DeviceReader, key: str, plan: _FieldPlan, decoded: list[tuple[int, Any]]
    ) -> dict[int, int | None]:
        """Each link's state as nvmlDeviceGetNvLinkState gives it (ENABLED / DISABLED / None)."""
        nvml = self._nvml
        states: dict[int, int | None] = {}
        for link, at in plan.link_at:
            ret, value = decoded[at]
            state: int | None = None
            if ret == nf.SUCCESS:
                if value == nf.NVLINK_STATE_ACTIVE:
                    state = nvml.NVML_FEATURE_ENABLED
                elif value == nf.NVLINK_STATE_INACTIVE:
                    state = nvml.NVML_FEATURE_DISABLED
                else:  # sleeping, traffic disabled, or newer: the single call decides
                    state = r.call("nvmlDeviceGetNvLinkState", link, link=True)
            elif (outcome := sort_code(ret, link=True)) is not Outcome.ABSENT:
                self._element_failed(r, outcome, ret, nf.FI_NVLINK_GET_STATE)
            elif (key, "nvlink_state", link) not in self._verified:
                self._verified.add((key, "nvlink_state", link))
                state = r.call("nvmlDeviceGetNvLinkState", link, link=True)
                if state is not None and key in self._field_plans:
                    self._use_single(key, "nvlink_state", r.index)
            states[link] = state
        return states

    def _recheck(self, r: DeviceReader, sample: tpb.GpuSample, key: str, group: nf.FieldGroup) -> None:
        """A group absent from the fields: ask its single call once; if it answers, keep using it."""
        self._verified.add((key, group.name, -1))
        self._read_single(r, sample, group)
        if any(sample.HasField(attr) for _, attr, _ in group.fields):
            self._use_single(key, group.name, r.index)

    def _use_single(self, key: str, group: str, index: int) -> None:
        self._single_groups.setdefault(key, set()).add(group)
        self._field_plans.pop(key, None)
        log.info("nvml_field_fallback", gpu=index, group=group, reason="field not supported, single call answers")

    def _read_nvlinks(
        self, r: DeviceReader, sample: tpb.GpuSample, ident: GpuIdent, states: dict[int, int | None] | None = None
    ) -> None:
        """State and DL error counters of each present link (the inventory's, else all probed).

        ``states``: each link's state already read (batched); None: one call per link.
        """
        nvml = self._nvml
        links = self._links(ident)
        now = time.monotonic()
        cached = self._nvlink_counters.get(ident.key)
        fresh = cached is None or now - cached[0] >= self.slow_every_s
        if cached is not None and not fresh and states is not None and not r.lost:
            merged = self._kept_nvlinks(ident.key, links, states, cached)
            if merged is not None:
                sample.MergeFrom(merged)  # nvlinks is empty here: this appends them all
                self._merged_into[ident.key] = merged
                return
        # Between full reads each link's counters come from the last full read's NvLinkSample.
        counters: dict[int, tpb.NvLinkSample] = {} if fresh or cached is None else cached[1]
        up = nvml.NVML_FEATURE_ENABLED
        for link in links:
            state = r.call("nvmlDeviceGetNvLinkState", link, link=True) if states is None else states.get(link)
            if state is None:
                if r.lost:
                    return
                continue
            kept = None if fresh else counters.get(link)
            if kept is None:
                kept = counters[link] = tpb.NvLinkSample(link=link, **r.link_counters(link))
            nl = sample.nvlinks.add()
            nl.CopyFrom(kept)
            nl.up = state == up
        if fresh and not r.lost:
            self._nvlink_counters[ident.key] = (now, counters)

    def _kept_nvlinks(
        self,
        key: str,
        links: tuple[int, ...],
        states: dict[int, int | None],
        cached: tuple[float, dict[int, tpb.NvLinkSample]],
    ) -> tpb.GpuSample | None:
        """Between full reads, the nvlinks the loop in _read_nvlinks would add, kept in one message.

        Built from the kept counters and these states, and kept until the states or the
        full read change: a cycle then merges all links in one call instead of a copy per
        link. None when a link with a state has no kept counters yet (the loop reads them).
        """
        read_at, counters = cached
        now_states = tuple(states.get(link) for link in links)
        kept = self._nvlink_merge.get(key)
        if kept is not None and kept[0] == read_at and kept[1] == links and kept[2] == now_states:
            return kept[3]
        up = self._nvml.NVML_FEATURE_ENABLED
        merged = tpb.GpuSample()
        for link, state in zip(links, now_states, strict=True):
            if state is None:
                continue
            counted = counters.get(link)
            if counted is None:
                return None
            nl = merged.nvlinks.add()
            nl.CopyFrom(counted)
            nl.up = state == up
        self._nvlink_merge[key] = (read_at, links, now_states, merged)
        return merged

    def _read_fields(self, r: DeviceReader, sample: tpb.GpuSample) -> None:
        """Recovery action and memory temperature via the field-values API (per-element status)."""
        values = r.call("nvmlDeviceGetFieldValues", [FI_RECOVERY_ACTION, FI_MEMORY_TEMP])
        if values is None:
            return
        for fv in values:
            if fv.nvmlReturn != self._nvml.NVML_SUCCESS:
                continue
            value = nf.field_value(fv)
            if value is None:
                continue
            if fv.fieldId == FI_RECOVERY_ACTION:
                sample.recovery_action = int(value)
            elif fv.fieldId == FI_MEMORY_TEMP:
                sample.memory_temperature_c = float(value)

    # ---- transitions ----------------------------------------------------------------------

    def _transitions(self, s: tpb.GpuSample, ident: GpuIdent) -> list[Finding]:
        """Findings for what got worse since this GPU's previous sample (see gpu_transitions)."""
        merged = self._merged_into.pop(ident.key, None)  # this cycle's, whatever the sample holds
        with self._lock:
            inventory_links = self._inventory_links.get(ident.key, set())
            return gt.transitions(self._state_for(ident), s, ident, merged, inventory_links)

    def _missing(self, count: int, seen: set[str]) -> list[Finding]:
        """gpu_lost for inventory GPUs NVML no longer enumerates."""
        with self._lock:
            return gt.missing(count, seen, self._inventory, self._state_for)

    # ---- helpers ---------------------------------------------------------------------------

    def _require_init(self) -> None:
        if not self.supported():
            raise CollectorUnsupported(self.unavailable_reason or "NVML unavailable")
        if self._closed:
            raise CollectorUnsupported("GPU collector is closed")

    def _state_for(self, ident: GpuIdent) -> GpuState:
        """Transition state of one GPU (lock held)."""
        return self._state.setdefault(ident.key, GpuState())

    def _remember_ident(self, index: int, handle: Any) -> None:
        r = DeviceReader(self._nvml, handle, index, self._warn_once)
        uuid = r.call("nvmlDeviceGetUUID")
        if uuid:
            with self._lock:
                self._idents[index] = GpuIdent(index, uuid, self._pci(r))

    @staticmethod
    def _pci(r: DeviceReader) -> str:
        info = r.call("nvmlDeviceGetPciInfo")
        if info is None:
            return ""
        bus_id = info.busId
        return bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)

    def _system_str(self, fn_name: str) -> str:
        try:
            return str(getattr(self._nvml, fn_name)())
        except (self._nvml.NVMLError, AttributeError) as err:
            log.info("nvml_system_query_failed", function=fn_name, error=str(err))
            return ""

    def _system_int(self, fn_name: str) -> int | None:
        try:
            return int(getattr(self._nvml, fn_name)())
        except (self._nvml.NVMLError, AttributeError):
            return None

    def _warn_once(self, index: int, fn_name: str, err: BaseException) -> None:
        """Log an unexpected per-metric NVML error once per (GPU, function, code)."""
        code = int(getattr(err, "value", -1))
        key = (index, fn_name, code)
        if key in self._warned:
            return
        self._warned.add(key)
        log.warning("nvml_query_failed", gpu=index, function=fn_name, error=str(err), code=code)
