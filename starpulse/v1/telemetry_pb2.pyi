from starpulse.v1 import inventory_pb2 as _inventory_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_KIND_UNSPECIFIED: _ClassVar[EventKind]
    EVENT_KIND_XID: _ClassVar[EventKind]
    EVENT_KIND_SXID: _ClassVar[EventKind]
    EVENT_KIND_ECC_DBE: _ClassVar[EventKind]
    EVENT_KIND_GPU_LOST: _ClassVar[EventKind]
    EVENT_KIND_GPU_RESET_REQUIRED: _ClassVar[EventKind]
    EVENT_KIND_GPU_RECOVERY_ACTION: _ClassVar[EventKind]
    EVENT_KIND_ROW_REMAP_FAILURE: _ClassVar[EventKind]
    EVENT_KIND_NVLINK_DOWN: _ClassVar[EventKind]
    EVENT_KIND_NIC_LINK_DOWN: _ClassVar[EventKind]
    EVENT_KIND_NIC_LINK_UP: _ClassVar[EventKind]
    EVENT_KIND_NIC_DRIVER_ERROR: _ClassVar[EventKind]
    EVENT_KIND_SWITCH_PORT_DOWN: _ClassVar[EventKind]
    EVENT_KIND_SWITCH_PORT_UP: _ClassVar[EventKind]
    EVENT_KIND_PFC_STORM: _ClassVar[EventKind]
    EVENT_KIND_KERNEL: _ClassVar[EventKind]
    EVENT_KIND_AGENT: _ClassVar[EventKind]
    EVENT_KIND_THERMAL_SLOWDOWN: _ClassVar[EventKind]
    EVENT_KIND_ACCEL_FAULT: _ClassVar[EventKind]
    EVENT_KIND_BUFFER_RESET: _ClassVar[EventKind]

class Severity(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEVERITY_UNSPECIFIED: _ClassVar[Severity]
    SEVERITY_INFO: _ClassVar[Severity]
    SEVERITY_WARNING: _ClassVar[Severity]
    SEVERITY_CRITICAL: _ClassVar[Severity]
    SEVERITY_FATAL: _ClassVar[Severity]
EVENT_KIND_UNSPECIFIED: EventKind
EVENT_KIND_XID: EventKind
EVENT_KIND_SXID: EventKind
EVENT_KIND_ECC_DBE: EventKind
EVENT_KIND_GPU_LOST: EventKind
EVENT_KIND_GPU_RESET_REQUIRED: EventKind
EVENT_KIND_GPU_RECOVERY_ACTION: EventKind
EVENT_KIND_ROW_REMAP_FAILURE: EventKind
EVENT_KIND_NVLINK_DOWN: EventKind
EVENT_KIND_NIC_LINK_DOWN: EventKind
EVENT_KIND_NIC_LINK_UP: EventKind
EVENT_KIND_NIC_DRIVER_ERROR: EventKind
EVENT_KIND_SWITCH_PORT_DOWN: EventKind
EVENT_KIND_SWITCH_PORT_UP: EventKind
EVENT_KIND_PFC_STORM: EventKind
EVENT_KIND_KERNEL: EventKind
EVENT_KIND_AGENT: EventKind
EVENT_KIND_THERMAL_SLOWDOWN: EventKind
EVENT_KIND_ACCEL_FAULT: EventKind
EVENT_KIND_BUFFER_RESET: EventKind
SEVERITY_UNSPECIFIED: Severity
SEVERITY_INFO: Severity
SEVERITY_WARNING: Severity
SEVERITY_CRITICAL: Severity
SEVERITY_FATAL: Severity

class NvLinkSample(_message.Message):
    __slots__ = ("link", "up", "replay_errors", "recovery_errors", "crc_flit_errors", "crc_data_errors", "ecc_data_errors")
    LINK_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    REPLAY_ERRORS_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_ERRORS_FIELD_NUMBER: _ClassVar[int]
    CRC_FLIT_ERRORS_FIELD_NUMBER: _ClassVar[int]
    CRC_DATA_ERRORS_FIELD_NUMBER: _ClassVar[int]
    ECC_DATA_ERRORS_FIELD_NUMBER: _ClassVar[int]
    link: int
    up: bool
    replay_errors: int
    recovery_errors: int
    crc_flit_errors: int
    crc_data_errors: int
    ecc_data_errors: int
    def __init__(self, link: _Optional[int] = ..., up: _Optional[bool] = ..., replay_errors: _Optional[int] = ..., recovery_errors: _Optional[int] = ..., crc_flit_errors: _Optional[int] = ..., crc_data_errors: _Optional[int] = ..., ecc_data_errors: _Optional[int] = ...) -> None: ...

class RasBlockSample(_message.Message):
    __slots__ = ("block", "correctable", "uncorrectable", "deferred")
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    CORRECTABLE_FIELD_NUMBER: _ClassVar[int]
    UNCORRECTABLE_FIELD_NUMBER: _ClassVar[int]
    DEFERRED_FIELD_NUMBER: _ClassVar[int]
    block: str
    correctable: int
    uncorrectable: int
    deferred: int
    def __init__(self, block: _Optional[str] = ..., correctable: _Optional[int] = ..., uncorrectable: _Optional[int] = ..., deferred: _Optional[int] = ...) -> None: ...

class AcceleratorLinkSample(_message.Message):
    __slots__ = ("link", "up", "errors")
    LINK_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    link: int
    up: bool
    errors: int
    def __init__(self, link: _Optional[int] = ..., up: _Optional[bool] = ..., errors: _Optional[int] = ...) -> None: ...

class GpuSample(_message.Message):
    __slots__ = ("index", "uuid", "temperature_c", "power_w", "power_limit_w", "utilization_gpu_pct", "utilization_memory_pct", "memory_used_bytes", "memory_total_bytes", "sm_clock_mhz", "memory_clock_mhz", "clock_event_reasons", "ecc_sbe_volatile", "ecc_dbe_volatile", "ecc_sbe_aggregate", "ecc_dbe_aggregate", "remapped_rows_correctable", "remapped_rows_uncorrectable", "remap_pending", "remap_failure", "retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending", "pcie_replay_count", "nvlinks", "recovery_action", "lost", "reset_required", "memory_temperature_c", "performance_state", "pcie_link_width", "pcie_link_width_max", "pcie_link_gen", "pcie_link_gen_max", "memory_errors_correctable", "memory_errors_uncorrectable", "ras_blocks", "links", "thermal_slowdown", "vendor_health", "links_down")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_W_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_GPU_PCT_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_MEMORY_PCT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    MEMORY_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    CLOCK_EVENT_REASONS_FIELD_NUMBER: _ClassVar[int]
    ECC_SBE_VOLATILE_FIELD_NUMBER: _ClassVar[int]
    ECC_DBE_VOLATILE_FIELD_NUMBER: _ClassVar[int]
    ECC_SBE_AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    ECC_DBE_AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    REMAPPED_ROWS_CORRECTABLE_FIELD_NUMBER: _ClassVar[int]
    REMAPPED_ROWS_UNCORRECTABLE_FIELD_NUMBER: _ClassVar[int]
    REMAP_PENDING_FIELD_NUMBER: _ClassVar[int]
    REMAP_FAILURE_FIELD_NUMBER: _ClassVar[int]
    RETIRED_PAGES_SBE_FIELD_NUMBER: _ClassVar[int]
    RETIRED_PAGES_DBE_FIELD_NUMBER: _ClassVar[int]
    RETIRED_PAGES_PENDING_FIELD_NUMBER: _ClassVar[int]
    PCIE_REPLAY_COUNT_FIELD_NUMBER: _ClassVar[int]
    NVLINKS_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_ACTION_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    RESET_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    PERFORMANCE_STATE_FIELD_NUMBER: _ClassVar[int]
    PCIE_LINK_WIDTH_FIELD_NUMBER: _ClassVar[int]
    PCIE_LINK_WIDTH_MAX_FIELD_NUMBER: _ClassVar[int]
    PCIE_LINK_GEN_FIELD_NUMBER: _ClassVar[int]
    PCIE_LINK_GEN_MAX_FIELD_NUMBER: _ClassVar[int]
    MEMORY_ERRORS_CORRECTABLE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_ERRORS_UNCORRECTABLE_FIELD_NUMBER: _ClassVar[int]
    RAS_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    THERMAL_SLOWDOWN_FIELD_NUMBER: _ClassVar[int]
    VENDOR_HEALTH_FIELD_NUMBER: _ClassVar[int]
    LINKS_DOWN_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    temperature_c: float
    power_w: float
    power_limit_w: float
    utilization_gpu_pct: float
    utilization_memory_pct: float
    memory_used_bytes: int
    memory_total_bytes: int
    sm_clock_mhz: int
    memory_clock_mhz: int
    clock_event_reasons: int
    ecc_sbe_volatile: int
    ecc_dbe_volatile: int
    ecc_sbe_aggregate: int
    ecc_dbe_aggregate: int
    remapped_rows_correctable: int
    remapped_rows_uncorrectable: int
    remap_pending: bool
    remap_failure: bool
    retired_pages_sbe: int
    retired_pages_dbe: int
    retired_pages_pending: bool
    pcie_replay_count: int
    nvlinks: _containers.RepeatedCompositeFieldContainer[NvLinkSample]
    recovery_action: int
    lost: bool
    reset_required: bool
    memory_temperature_c: float
    performance_state: int
    pcie_link_width: int
    pcie_link_width_max: int
    pcie_link_gen: int
    pcie_link_gen_max: int
    memory_errors_correctable: int
    memory_errors_uncorrectable: int
    ras_blocks: _containers.RepeatedCompositeFieldContainer[RasBlockSample]
    links: _containers.RepeatedCompositeFieldContainer[AcceleratorLinkSample]
    thermal_slowdown: bool
    vendor_health: str
    links_down: int
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., temperature_c: _Optional[float] = ..., power_w: _Optional[float] = ..., power_limit_w: _Optional[float] = ..., utilization_gpu_pct: _Optional[float] = ..., utilization_memory_pct: _Optional[float] = ..., memory_used_bytes: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ..., sm_clock_mhz: _Optional[int] = ..., memory_clock_mhz: _Optional[int] = ..., clock_event_reasons: _Optional[int] = ..., ecc_sbe_volatile: _Optional[int] = ..., ecc_dbe_volatile: _Optional[int] = ..., ecc_sbe_aggregate: _Optional[int] = ..., ecc_dbe_aggregate: _Optional[int] = ..., remapped_rows_correctable: _Optional[int] = ..., remapped_rows_uncorrectable: _Optional[int] = ..., remap_pending: _Optional[bool] = ..., remap_failure: _Optional[bool] = ..., retired_pages_sbe: _Optional[int] = ..., retired_pages_dbe: _Optional[int] = ..., retired_pages_pending: _Optional[bool] = ..., pcie_replay_count: _Optional[int] = ..., nvlinks: _Optional[_Iterable[_Union[NvLinkSample, _Mapping]]] = ..., recovery_action: _Optional[int] = ..., lost: _Optional[bool] = ..., reset_required: _Optional[bool] = ..., memory_temperature_c: _Optional[float] = ..., performance_state: _Optional[int] = ..., pcie_link_width: _Optional[int] = ..., pcie_link_width_max: _Optional[int] = ..., pcie_link_gen: _Optional[int] = ..., pcie_link_gen_max: _Optional[int] = ..., memory_errors_correctable: _Optional[int] = ..., memory_errors_uncorrectable: _Optional[int] = ..., ras_blocks: _Optional[_Iterable[_Union[RasBlockSample, _Mapping]]] = ..., links: _Optional[_Iterable[_Union[AcceleratorLinkSample, _Mapping]]] = ..., thermal_slowdown: _Optional[bool] = ..., vendor_health: _Optional[str] = ..., links_down: _Optional[int] = ...) -> None: ...

class NicSample(_message.Message):
    __slots__ = ("rdma_device", "port", "netdev", "state_code", "state", "phys_state_code", "phys_state", "rate_gbps", "link_layer", "counters", "hw_counters", "netdev_stats", "netdev_operstate", "ethtool_stats")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class HwCountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class NetdevStatsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class EthtoolStatsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    RDMA_DEVICE_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    NETDEV_FIELD_NUMBER: _ClassVar[int]
    STATE_CODE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PHYS_STATE_CODE_FIELD_NUMBER: _ClassVar[int]
    PHYS_STATE_FIELD_NUMBER: _ClassVar[int]
    RATE_GBPS_FIELD_NUMBER: _ClassVar[int]
    LINK_LAYER_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    HW_COUNTERS_FIELD_NUMBER: _ClassVar[int]
    NETDEV_STATS_FIELD_NUMBER: _ClassVar[int]
    NETDEV_OPERSTATE_FIELD_NUMBER: _ClassVar[int]
    ETHTOOL_STATS_FIELD_NUMBER: _ClassVar[int]
    rdma_device: str
    port: int
    netdev: str
    state_code: int
    state: str
    phys_state_code: int
    phys_state: str
    rate_gbps: float
    link_layer: str
    counters: _containers.ScalarMap[str, int]
    hw_counters: _containers.ScalarMap[str, int]
    netdev_stats: _containers.ScalarMap[str, int]
    netdev_operstate: str
    ethtool_stats: _containers.ScalarMap[str, int]
    def __init__(self, rdma_device: _Optional[str] = ..., port: _Optional[int] = ..., netdev: _Optional[str] = ..., state_code: _Optional[int] = ..., state: _Optional[str] = ..., phys_state_code: _Optional[int] = ..., phys_state: _Optional[str] = ..., rate_gbps: _Optional[float] = ..., link_layer: _Optional[str] = ..., counters: _Optional[_Mapping[str, int]] = ..., hw_counters: _Optional[_Mapping[str, int]] = ..., netdev_stats: _Optional[_Mapping[str, int]] = ..., netdev_operstate: _Optional[str] = ..., ethtool_stats: _Optional[_Mapping[str, int]] = ...) -> None: ...

class DiskUsage(_message.Message):
    __slots__ = ("mount", "total_bytes", "used_bytes")
    MOUNT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    mount: str
    total_bytes: int
    used_bytes: int
    def __init__(self, mount: _Optional[str] = ..., total_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ...) -> None: ...

class HostSample(_message.Message):
    __slots__ = ("cpu_percent", "memory_total_bytes", "memory_available_bytes", "load1", "load5", "load15", "uptime_s", "disks")
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_AVAILABLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOAD1_FIELD_NUMBER: _ClassVar[int]
    LOAD5_FIELD_NUMBER: _ClassVar[int]
    LOAD15_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    DISKS_FIELD_NUMBER: _ClassVar[int]
    cpu_percent: float
    memory_total_bytes: int
    memory_available_bytes: int
    load1: float
    load5: float
    load15: float
    uptime_s: float
    disks: _containers.RepeatedCompositeFieldContainer[DiskUsage]
    def __init__(self, cpu_percent: _Optional[float] = ..., memory_total_bytes: _Optional[int] = ..., memory_available_bytes: _Optional[int] = ..., load1: _Optional[float] = ..., load5: _Optional[float] = ..., load15: _Optional[float] = ..., uptime_s: _Optional[float] = ..., disks: _Optional[_Iterable[_Union[DiskUsage, _Mapping]]] = ...) -> None: ...

class SwitchPortSample(_message.Message):
    __slots__ = ("port", "oper_status", "admin_status", "speed_mbps", "counters", "pfc_rx", "pfc_tx", "pfc_wd_status", "queue_drops", "ecn_marked", "optic_temperature_c", "optic_rx_power_dbm", "optic_tx_power_dbm", "optic_temp_high_alarm_c", "optic_temp_low_alarm_c", "optic_rx_power_high_alarm_dbm", "optic_rx_power_low_alarm_dbm", "optic_tx_power_high_alarm_dbm", "optic_tx_power_low_alarm_dbm", "pfc_wd_deadlocks")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    PORT_FIELD_NUMBER: _ClassVar[int]
    OPER_STATUS_FIELD_NUMBER: _ClassVar[int]
    ADMIN_STATUS_FIELD_NUMBER: _ClassVar[int]
    SPEED_MBPS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    PFC_RX_FIELD_NUMBER: _ClassVar[int]
    PFC_TX_FIELD_NUMBER: _ClassVar[int]
    PFC_WD_STATUS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DROPS_FIELD_NUMBER: _ClassVar[int]
    ECN_MARKED_FIELD_NUMBER: _ClassVar[int]
    OPTIC_TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    OPTIC_RX_POWER_DBM_FIELD_NUMBER: _ClassVar[int]
    OPTIC_TX_POWER_DBM_FIELD_NUMBER: _ClassVar[int]
    OPTIC_TEMP_HIGH_ALARM_C_FIELD_NUMBER: _ClassVar[int]
    OPTIC_TEMP_LOW_ALARM_C_FIELD_NUMBER: _ClassVar[int]
    OPTIC_RX_POWER_HIGH_ALARM_DBM_FIELD_NUMBER: _ClassVar[int]
    OPTIC_RX_POWER_LOW_ALARM_DBM_FIELD_NUMBER: _ClassVar[int]
    OPTIC_TX_POWER_HIGH_ALARM_DBM_FIELD_NUMBER: _ClassVar[int]
    OPTIC_TX_POWER_LOW_ALARM_DBM_FIELD_NUMBER: _ClassVar[int]
    PFC_WD_DEADLOCKS_FIELD_NUMBER: _ClassVar[int]
    port: str
    oper_status: str
    admin_status: str
    speed_mbps: int
    counters: _containers.ScalarMap[str, int]
    pfc_rx: _containers.RepeatedScalarFieldContainer[int]
    pfc_tx: _containers.RepeatedScalarFieldContainer[int]
    pfc_wd_status: _containers.RepeatedScalarFieldContainer[str]
    queue_drops: int
    ecn_marked: int
    optic_temperature_c: float
    optic_rx_power_dbm: _containers.RepeatedScalarFieldContainer[float]
    optic_tx_power_dbm: _containers.RepeatedScalarFieldContainer[float]
    optic_temp_high_alarm_c: float
    optic_temp_low_alarm_c: float
    optic_rx_power_high_alarm_dbm: float
    optic_rx_power_low_alarm_dbm: float
    optic_tx_power_high_alarm_dbm: float
    optic_tx_power_low_alarm_dbm: float
    pfc_wd_deadlocks: int
    def __init__(self, port: _Optional[str] = ..., oper_status: _Optional[str] = ..., admin_status: _Optional[str] = ..., speed_mbps: _Optional[int] = ..., counters: _Optional[_Mapping[str, int]] = ..., pfc_rx: _Optional[_Iterable[int]] = ..., pfc_tx: _Optional[_Iterable[int]] = ..., pfc_wd_status: _Optional[_Iterable[str]] = ..., queue_drops: _Optional[int] = ..., ecn_marked: _Optional[int] = ..., optic_temperature_c: _Optional[float] = ..., optic_rx_power_dbm: _Optional[_Iterable[float]] = ..., optic_tx_power_dbm: _Optional[_Iterable[float]] = ..., optic_temp_high_alarm_c: _Optional[float] = ..., optic_temp_low_alarm_c: _Optional[float] = ..., optic_rx_power_high_alarm_dbm: _Optional[float] = ..., optic_rx_power_low_alarm_dbm: _Optional[float] = ..., optic_tx_power_high_alarm_dbm: _Optional[float] = ..., optic_tx_power_low_alarm_dbm: _Optional[float] = ..., pfc_wd_deadlocks: _Optional[int] = ...) -> None: ...

class CollectorStatus(_message.Message):
    __slots__ = ("name", "supported", "ok", "error", "duration_s")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    name: str
    supported: bool
    ok: bool
    error: str
    duration_s: float
    def __init__(self, name: _Optional[str] = ..., supported: _Optional[bool] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ..., duration_s: _Optional[float] = ...) -> None: ...

class JobStepSample(_message.Message):
    __slots__ = ("job", "rank", "step", "step_time_s", "last_checkpoint_step", "checkpoint_path", "last_checkpoint_ms", "pid", "world_size", "resumed_from_step", "phase", "phase_since_ms")
    JOB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    LAST_CHECKPOINT_STEP_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    LAST_CHECKPOINT_MS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FROM_STEP_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    PHASE_SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    job: str
    rank: int
    step: int
    step_time_s: float
    last_checkpoint_step: int
    checkpoint_path: str
    last_checkpoint_ms: int
    pid: int
    world_size: int
    resumed_from_step: int
    phase: str
    phase_since_ms: int
    def __init__(self, job: _Optional[str] = ..., rank: _Optional[int] = ..., step: _Optional[int] = ..., step_time_s: _Optional[float] = ..., last_checkpoint_step: _Optional[int] = ..., checkpoint_path: _Optional[str] = ..., last_checkpoint_ms: _Optional[int] = ..., pid: _Optional[int] = ..., world_size: _Optional[int] = ..., resumed_from_step: _Optional[int] = ..., phase: _Optional[str] = ..., phase_since_ms: _Optional[int] = ...) -> None: ...

class GpuProcess(_message.Message):
    __slots__ = ("gpu_index", "pid", "used_memory_bytes", "job", "job_source")
    GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    USED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    JOB_SOURCE_FIELD_NUMBER: _ClassVar[int]
    gpu_index: int
    pid: int
    used_memory_bytes: int
    job: str
    job_source: str
    def __init__(self, gpu_index: _Optional[int] = ..., pid: _Optional[int] = ..., used_memory_bytes: _Optional[int] = ..., job: _Optional[str] = ..., job_source: _Optional[str] = ...) -> None: ...

class Report(_message.Message):
    __slots__ = ("seq", "timestamp_ms", "gpus", "nics", "host", "switch_ports", "collectors", "job_steps", "lldp", "counters_delta", "gpu_processes", "probe_results")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    NICS_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    SWITCH_PORTS_FIELD_NUMBER: _ClassVar[int]
    COLLECTORS_FIELD_NUMBER: _ClassVar[int]
    JOB_STEPS_FIELD_NUMBER: _ClassVar[int]
    LLDP_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_DELTA_FIELD_NUMBER: _ClassVar[int]
    GPU_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    PROBE_RESULTS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    timestamp_ms: int
    gpus: _containers.RepeatedCompositeFieldContainer[GpuSample]
    nics: _containers.RepeatedCompositeFieldContainer[NicSample]
    host: HostSample
    switch_ports: _containers.RepeatedCompositeFieldContainer[SwitchPortSample]
    collectors: _containers.RepeatedCompositeFieldContainer[CollectorStatus]
    job_steps: _containers.RepeatedCompositeFieldContainer[JobStepSample]
    lldp: LldpUpdate
    counters_delta: bool
    gpu_processes: _containers.RepeatedCompositeFieldContainer[GpuProcess]
    probe_results: _containers.RepeatedCompositeFieldContainer[ProbeResult]
    def __init__(self, seq: _Optional[int] = ..., timestamp_ms: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[GpuSample, _Mapping]]] = ..., nics: _Optional[_Iterable[_Union[NicSample, _Mapping]]] = ..., host: _Optional[_Union[HostSample, _Mapping]] = ..., switch_ports: _Optional[_Iterable[_Union[SwitchPortSample, _Mapping]]] = ..., collectors: _Optional[_Iterable[_Union[CollectorStatus, _Mapping]]] = ..., job_steps: _Optional[_Iterable[_Union[JobStepSample, _Mapping]]] = ..., lldp: _Optional[_Union[LldpUpdate, _Mapping]] = ..., counters_delta: _Optional[bool] = ..., gpu_processes: _Optional[_Iterable[_Union[GpuProcess, _Mapping]]] = ..., probe_results: _Optional[_Iterable[_Union[ProbeResult, _Mapping]]] = ...) -> None: ...

class ProbeResult(_message.Message):
    __slots__ = ("local_nic", "peer_nic", "src_port", "sent", "lost", "rtt_p50_us", "rtt_p99_us", "rtt_stdev_us", "responder_us", "plan_version", "window_ms", "via", "peer_restarted")
    LOCAL_NIC_FIELD_NUMBER: _ClassVar[int]
    PEER_NIC_FIELD_NUMBER: _ClassVar[int]
    SRC_PORT_FIELD_NUMBER: _ClassVar[int]
    SENT_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    RTT_P50_US_FIELD_NUMBER: _ClassVar[int]
    RTT_P99_US_FIELD_NUMBER: _ClassVar[int]
    RTT_STDEV_US_FIELD_NUMBER: _ClassVar[int]
    RESPONDER_US_FIELD_NUMBER: _ClassVar[int]
    PLAN_VERSION_FIELD_NUMBER: _ClassVar[int]
    WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    VIA_FIELD_NUMBER: _ClassVar[int]
    PEER_RESTARTED_FIELD_NUMBER: _ClassVar[int]
    local_nic: str
    peer_nic: str
    src_port: int
    sent: int
    lost: int
    rtt_p50_us: float
    rtt_p99_us: float
    rtt_stdev_us: float
    responder_us: float
    plan_version: int
    window_ms: int
    via: str
    peer_restarted: bool
    def __init__(self, local_nic: _Optional[str] = ..., peer_nic: _Optional[str] = ..., src_port: _Optional[int] = ..., sent: _Optional[int] = ..., lost: _Optional[int] = ..., rtt_p50_us: _Optional[float] = ..., rtt_p99_us: _Optional[float] = ..., rtt_stdev_us: _Optional[float] = ..., responder_us: _Optional[float] = ..., plan_version: _Optional[int] = ..., window_ms: _Optional[int] = ..., via: _Optional[str] = ..., peer_restarted: _Optional[bool] = ...) -> None: ...

class LldpUpdate(_message.Message):
    __slots__ = ("neighbors",)
    NEIGHBORS_FIELD_NUMBER: _ClassVar[int]
    neighbors: _containers.RepeatedCompositeFieldContainer[_inventory_pb2.LldpNeighbor]
    def __init__(self, neighbors: _Optional[_Iterable[_Union[_inventory_pb2.LldpNeighbor, _Mapping]]] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("seq", "timestamp_ms", "kind", "component", "severity", "message", "source", "xid", "pci", "action", "attributes", "vendor", "vendor_code", "read_us", "buffered_us", "sent_us")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    COMPONENT_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    XID_FIELD_NUMBER: _ClassVar[int]
    PCI_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    VENDOR_CODE_FIELD_NUMBER: _ClassVar[int]
    READ_US_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_US_FIELD_NUMBER: _ClassVar[int]
    SENT_US_FIELD_NUMBER: _ClassVar[int]
    seq: int
    timestamp_ms: int
    kind: EventKind
    component: str
    severity: Severity
    message: str
    source: str
    xid: int
    pci: str
    action: str
    attributes: _containers.ScalarMap[str, str]
    vendor: str
    vendor_code: str
    read_us: int
    buffered_us: int
    sent_us: int
    def __init__(self, seq: _Optional[int] = ..., timestamp_ms: _Optional[int] = ..., kind: _Optional[_Union[EventKind, str]] = ..., component: _Optional[str] = ..., severity: _Optional[_Union[Severity, str]] = ..., message: _Optional[str] = ..., source: _Optional[str] = ..., xid: _Optional[int] = ..., pci: _Optional[str] = ..., action: _Optional[str] = ..., attributes: _Optional[_Mapping[str, str]] = ..., vendor: _Optional[str] = ..., vendor_code: _Optional[str] = ..., read_us: _Optional[int] = ..., buffered_us: _Optional[int] = ..., sent_us: _Optional[int] = ...) -> None: ...
