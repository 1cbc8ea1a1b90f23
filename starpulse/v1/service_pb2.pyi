from starpulse.v1 import inventory_pb2 as _inventory_pb2
from starpulse.v1 import telemetry_pb2 as _telemetry_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CommandKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMMAND_KIND_UNSPECIFIED: _ClassVar[CommandKind]
    COMMAND_KIND_CHECKPOINT_REQUEST: _ClassVar[CommandKind]
    COMMAND_KIND_RUN_DIAGNOSTIC: _ClassVar[CommandKind]
    COMMAND_KIND_GPU_RESET: _ClassVar[CommandKind]
    COMMAND_KIND_REBOOT: _ClassVar[CommandKind]
    COMMAND_KIND_COLLECT_STACKS: _ClassVar[CommandKind]
COMMAND_KIND_UNSPECIFIED: CommandKind
COMMAND_KIND_CHECKPOINT_REQUEST: CommandKind
COMMAND_KIND_RUN_DIAGNOSTIC: CommandKind
COMMAND_KIND_GPU_RESET: CommandKind
COMMAND_KIND_REBOOT: CommandKind
COMMAND_KIND_COLLECT_STACKS: CommandKind

class Hello(_message.Message):
    __slots__ = ("node_id", "role", "inventory", "agent_version", "buffer_epoch", "oldest_buffered_event_seq", "next_event_seq", "stream_generation", "boot_id")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    INVENTORY_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    BUFFER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    OLDEST_BUFFERED_EVENT_SEQ_FIELD_NUMBER: _ClassVar[int]
    NEXT_EVENT_SEQ_FIELD_NUMBER: _ClassVar[int]
    STREAM_GENERATION_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    role: _inventory_pb2.NodeRole
    inventory: _inventory_pb2.Inventory
    agent_version: str
    buffer_epoch: str
    oldest_buffered_event_seq: int
    next_event_seq: int
    stream_generation: int
    boot_id: str
    def __init__(self, node_id: _Optional[str] = ..., role: _Optional[_Union[_inventory_pb2.NodeRole, str]] = ..., inventory: _Optional[_Union[_inventory_pb2.Inventory, _Mapping]] = ..., agent_version: _Optional[str] = ..., buffer_epoch: _Optional[str] = ..., oldest_buffered_event_seq: _Optional[int] = ..., next_event_seq: _Optional[int] = ..., stream_generation: _Optional[int] = ..., boot_id: _Optional[str] = ...) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("hello", "report", "event", "command_result")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    COMMAND_RESULT_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    report: _telemetry_pb2.Report
    event: _telemetry_pb2.Event
    command_result: CommandResult
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., report: _Optional[_Union[_telemetry_pb2.Report, _Mapping]] = ..., event: _Optional[_Union[_telemetry_pb2.Event, _Mapping]] = ..., command_result: _Optional[_Union[CommandResult, _Mapping]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("acked_event_seq", "acked_report_seq", "report_interval_s", "controller_id", "accepts_delta_reports", "silence_limit_s", "replaced_live_stream")
    ACKED_EVENT_SEQ_FIELD_NUMBER: _ClassVar[int]
    ACKED_REPORT_SEQ_FIELD_NUMBER: _ClassVar[int]
    REPORT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_DELTA_REPORTS_FIELD_NUMBER: _ClassVar[int]
    SILENCE_LIMIT_S_FIELD_NUMBER: _ClassVar[int]
    REPLACED_LIVE_STREAM_FIELD_NUMBER: _ClassVar[int]
    acked_event_seq: int
    acked_report_seq: int
    report_interval_s: float
    controller_id: str
    accepts_delta_reports: bool
    silence_limit_s: float
    replaced_live_stream: bool
    def __init__(self, acked_event_seq: _Optional[int] = ..., acked_report_seq: _Optional[int] = ..., report_interval_s: _Optional[float] = ..., controller_id: _Optional[str] = ..., accepts_delta_reports: _Optional[bool] = ..., silence_limit_s: _Optional[float] = ..., replaced_live_stream: _Optional[bool] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("event_seq", "report_seq", "full_report_needed")
    EVENT_SEQ_FIELD_NUMBER: _ClassVar[int]
    REPORT_SEQ_FIELD_NUMBER: _ClassVar[int]
    FULL_REPORT_NEEDED_FIELD_NUMBER: _ClassVar[int]
    event_seq: int
    report_seq: int
    full_report_needed: bool
    def __init__(self, event_seq: _Optional[int] = ..., report_seq: _Optional[int] = ..., full_report_needed: _Optional[bool] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("id", "kind", "args")
    class ArgsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: CommandKind
    args: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[_Union[CommandKind, str]] = ..., args: _Optional[_Mapping[str, str]] = ...) -> None: ...

class CommandResult(_message.Message):
    __slots__ = ("id", "ok", "message", "payload_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    ok: bool
    message: str
    payload_json: str
    def __init__(self, id: _Optional[str] = ..., ok: _Optional[bool] = ..., message: _Optional[str] = ..., payload_json: _Optional[str] = ...) -> None: ...

class ControllerMessage(_message.Message):
    __slots__ = ("welcome", "ack", "command", "probe_plan")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    PROBE_PLAN_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    ack: Ack
    command: Command
    probe_plan: ProbePlan
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., command: _Optional[_Union[Command, _Mapping]] = ..., probe_plan: _Optional[_Union[ProbePlan, _Mapping]] = ...) -> None: ...

class ProbePlan(_message.Message):
    __slots__ = ("version", "paused", "targets", "listen", "port", "dscp", "payload_bytes", "timeout_ms", "window_s", "slow_us")
    class ListenEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    LISTEN_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    DSCP_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    SLOW_US_FIELD_NUMBER: _ClassVar[int]
    version: int
    paused: bool
    targets: _containers.RepeatedCompositeFieldContainer[ProbeTarget]
    listen: _containers.ScalarMap[str, str]
    port: int
    dscp: int
    payload_bytes: int
    timeout_ms: int
    window_s: int
    slow_us: float
    def __init__(self, version: _Optional[int] = ..., paused: _Optional[bool] = ..., targets: _Optional[_Iterable[_Union[ProbeTarget, _Mapping]]] = ..., listen: _Optional[_Mapping[str, str]] = ..., port: _Optional[int] = ..., dscp: _Optional[int] = ..., payload_bytes: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., window_s: _Optional[int] = ..., slow_us: _Optional[float] = ...) -> None: ...

class ProbeTarget(_message.Message):
    __slots__ = ("local_nic", "local_address", "peer_nic", "peer_address", "src_ports", "packets_per_s", "purpose")
    LOCAL_NIC_FIELD_NUMBER: _ClassVar[int]
    LOCAL_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PEER_NIC_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SRC_PORTS_FIELD_NUMBER: _ClassVar[int]
    PACKETS_PER_S_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    local_nic: str
    local_address: str
    peer_nic: str
    peer_address: str
    src_ports: _containers.RepeatedScalarFieldContainer[int]
    packets_per_s: float
    purpose: str
    def __init__(self, local_nic: _Optional[str] = ..., local_address: _Optional[str] = ..., peer_nic: _Optional[str] = ..., peer_address: _Optional[str] = ..., src_ports: _Optional[_Iterable[int]] = ..., packets_per_s: _Optional[float] = ..., purpose: _Optional[str] = ...) -> None: ...

class RelayHello(_message.Message):
    __slots__ = ("relay_id", "version")
    RELAY_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    relay_id: str
    version: str
    def __init__(self, relay_id: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class RelayedAgentMessage(_message.Message):
    __slots__ = ("stream", "message", "closed", "peer", "identity")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    stream: int
    message: bytes
    closed: bool
    peer: str
    identity: str
    def __init__(self, stream: _Optional[int] = ..., message: _Optional[bytes] = ..., closed: _Optional[bool] = ..., peer: _Optional[str] = ..., identity: _Optional[str] = ...) -> None: ...

class RelayUp(_message.Message):
    __slots__ = ("hello", "batch")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    hello: RelayHello
    batch: RelayedAgentBatch
    def __init__(self, hello: _Optional[_Union[RelayHello, _Mapping]] = ..., batch: _Optional[_Union[RelayedAgentBatch, _Mapping]] = ...) -> None: ...

class RelayedAgentBatch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[RelayedAgentMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[RelayedAgentMessage, _Mapping]]] = ...) -> None: ...

class RelayedControllerMessage(_message.Message):
    __slots__ = ("stream", "message", "closed", "status_code", "status_detail")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    STATUS_DETAIL_FIELD_NUMBER: _ClassVar[int]
    stream: int
    message: bytes
    closed: bool
    status_code: int
    status_detail: str
    def __init__(self, stream: _Optional[int] = ..., message: _Optional[bytes] = ..., closed: _Optional[bool] = ..., status_code: _Optional[int] = ..., status_detail: _Optional[str] = ...) -> None: ...

class RelayDown(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[RelayedControllerMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[RelayedControllerMessage, _Mapping]]] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ("lifecycle_states",)
    LIFECYCLE_STATES_FIELD_NUMBER: _ClassVar[int]
    lifecycle_states: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, lifecycle_states: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("node_id", "role", "state", "last_seen_ms", "gpu_count", "nic_count", "open_events", "agent_version", "hostname", "accelerator_vendor", "accelerator_model", "lifecycle_state", "lifecycle_since_ms", "lifecycle_reason", "drained_by", "incident_id")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_MS_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    NIC_COUNT_FIELD_NUMBER: _ClassVar[int]
    OPEN_EVENTS_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_VENDOR_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_MODEL_FIELD_NUMBER: _ClassVar[int]
    LIFECYCLE_STATE_FIELD_NUMBER: _ClassVar[int]
    LIFECYCLE_SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    LIFECYCLE_REASON_FIELD_NUMBER: _ClassVar[int]
    DRAINED_BY_FIELD_NUMBER: _ClassVar[int]
    INCIDENT_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    role: _inventory_pb2.NodeRole
    state: str
    last_seen_ms: int
    gpu_count: int
    nic_count: int
    open_events: int
    agent_version: str
    hostname: str
    accelerator_vendor: str
    accelerator_model: str
    lifecycle_state: str
    lifecycle_since_ms: int
    lifecycle_reason: str
    drained_by: str
    incident_id: str
    def __init__(self, node_id: _Optional[str] = ..., role: _Optional[_Union[_inventory_pb2.NodeRole, str]] = ..., state: _Optional[str] = ..., last_seen_ms: _Optional[int] = ..., gpu_count: _Optional[int] = ..., nic_count: _Optional[int] = ..., open_events: _Optional[int] = ..., agent_version: _Optional[str] = ..., hostname: _Optional[str] = ..., accelerator_vendor: _Optional[str] = ..., accelerator_model: _Optional[str] = ..., lifecycle_state: _Optional[str] = ..., lifecycle_since_ms: _Optional[int] = ..., lifecycle_reason: _Optional[str] = ..., drained_by: _Optional[str] = ..., incident_id: _Optional[str] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ...) -> None: ...

class ListEventsRequest(_message.Message):
    __slots__ = ("node_id", "limit")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    limit: int
    def __init__(self, node_id: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class StoredEvent(_message.Message):
    __slots__ = ("node_id", "event", "received_ms")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_MS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    event: _telemetry_pb2.Event
    received_ms: int
    def __init__(self, node_id: _Optional[str] = ..., event: _Optional[_Union[_telemetry_pb2.Event, _Mapping]] = ..., received_ms: _Optional[int] = ...) -> None: ...

class ListEventsResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[StoredEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[StoredEvent, _Mapping]]] = ...) -> None: ...

class IncidentInfo(_message.Message):
    __slots__ = ("id", "kind", "root_cause", "component_type", "affected_nodes", "affected_jobs", "severity", "action", "evidence_json", "opened_ms", "resolved_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ROOT_CAUSE_FIELD_NUMBER: _ClassVar[int]
    COMPONENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    AFFECTED_NODES_FIELD_NUMBER: _ClassVar[int]
    AFFECTED_JOBS_FIELD_NUMBER: _ClassVar[int]
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_JSON_FIELD_NUMBER: _ClassVar[int]
    OPENED_MS_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_MS_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: str
    root_cause: str
    component_type: str
    affected_nodes: _containers.RepeatedScalarFieldContainer[str]
    affected_jobs: _containers.RepeatedScalarFieldContainer[str]
    severity: str
    action: str
    evidence_json: str
    opened_ms: int
    resolved_ms: int
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[str] = ..., root_cause: _Optional[str] = ..., component_type: _Optional[str] = ..., affected_nodes: _Optional[_Iterable[str]] = ..., affected_jobs: _Optional[_Iterable[str]] = ..., severity: _Optional[str] = ..., action: _Optional[str] = ..., evidence_json: _Optional[str] = ..., opened_ms: _Optional[int] = ..., resolved_ms: _Optional[int] = ...) -> None: ...

class ListIncidentsRequest(_message.Message):
    __slots__ = ("include_resolved", "limit")
    INCLUDE_RESOLVED_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    include_resolved: bool
    limit: int
    def __init__(self, include_resolved: _Optional[bool] = ..., limit: _Optional[int] = ...) -> None: ...

class ListIncidentsResponse(_message.Message):
    __slots__ = ("incidents",)
    INCIDENTS_FIELD_NUMBER: _ClassVar[int]
    incidents: _containers.RepeatedCompositeFieldContainer[IncidentInfo]
    def __init__(self, incidents: _Optional[_Iterable[_Union[IncidentInfo, _Mapping]]] = ...) -> None: ...

class TopologyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TopologyResponse(_message.Message):
    __slots__ = ("summary_json", "miswired", "unknown_devices", "missing_links", "nodes_reporting_lldp")
    SUMMARY_JSON_FIELD_NUMBER: _ClassVar[int]
    MISWIRED_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_DEVICES_FIELD_NUMBER: _ClassVar[int]
    MISSING_LINKS_FIELD_NUMBER: _ClassVar[int]
    NODES_REPORTING_LLDP_FIELD_NUMBER: _ClassVar[int]
    summary_json: str
    miswired: _containers.RepeatedScalarFieldContainer[str]
    unknown_devices: _containers.RepeatedScalarFieldContainer[str]
    missing_links: _containers.RepeatedScalarFieldContainer[str]
    nodes_reporting_lldp: int
    def __init__(self, summary_json: _Optional[str] = ..., miswired: _Optional[_Iterable[str]] = ..., unknown_devices: _Optional[_Iterable[str]] = ..., missing_links: _Optional[_Iterable[str]] = ..., nodes_reporting_lldp: _Optional[int] = ...) -> None: ...

class IncidentRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class IncidentDetail(_message.Message):
    __slots__ = ("incident", "timeline_json", "acked_by", "acked_ms", "message")
    INCIDENT_FIELD_NUMBER: _ClassVar[int]
    TIMELINE_JSON_FIELD_NUMBER: _ClassVar[int]
    ACKED_BY_FIELD_NUMBER: _ClassVar[int]
    ACKED_MS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    incident: IncidentInfo
    timeline_json: str
    acked_by: str
    acked_ms: int
    message: str
    def __init__(self, incident: _Optional[_Union[IncidentInfo, _Mapping]] = ..., timeline_json: _Optional[str] = ..., acked_by: _Optional[str] = ..., acked_ms: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class NodeActionRequest(_message.Message):
    __slots__ = ("node", "reason", "actor", "force")
    NODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    node: str
    reason: str
    actor: str
    force: bool
    def __init__(self, node: _Optional[str] = ..., reason: _Optional[str] = ..., actor: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class NodeActionResponse(_message.Message):
    __slots__ = ("ok", "message", "state", "drained_by", "node")
    OK_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DRAINED_BY_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    message: str
    state: str
    drained_by: str
    node: str
    def __init__(self, ok: _Optional[bool] = ..., message: _Optional[str] = ..., state: _Optional[str] = ..., drained_by: _Optional[str] = ..., node: _Optional[str] = ...) -> None: ...

class ApproveRequest(_message.Message):
    __slots__ = ("incident_id", "actor", "node")
    INCIDENT_ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    incident_id: str
    actor: str
    node: str
    def __init__(self, incident_id: _Optional[str] = ..., actor: _Optional[str] = ..., node: _Optional[str] = ...) -> None: ...

class ApproveResponse(_message.Message):
    __slots__ = ("ok", "message", "nodes", "outcome", "outcome_reason")
    OK_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_REASON_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    message: str
    nodes: _containers.RepeatedScalarFieldContainer[str]
    outcome: str
    outcome_reason: str
    def __init__(self, ok: _Optional[bool] = ..., message: _Optional[str] = ..., nodes: _Optional[_Iterable[str]] = ..., outcome: _Optional[str] = ..., outcome_reason: _Optional[str] = ...) -> None: ...

class BreakerRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BreakerResetRequest(_message.Message):
    __slots__ = ("actor", "reason")
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    actor: str
    reason: str
    def __init__(self, actor: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class BreakerStatus(_message.Message):
    __slots__ = ("open", "opened_ms", "reason", "closed_by", "closed_ms", "changed", "pending_approvals", "mode")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    OPENED_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CLOSED_BY_FIELD_NUMBER: _ClassVar[int]
    CLOSED_MS_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    PENDING_APPROVALS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    open: bool
    opened_ms: int
    reason: str
    closed_by: str
    closed_ms: int
    changed: bool
    pending_approvals: int
    mode: str
    def __init__(self, open: _Optional[bool] = ..., opened_ms: _Optional[int] = ..., reason: _Optional[str] = ..., closed_by: _Optional[str] = ..., closed_ms: _Optional[int] = ..., changed: _Optional[bool] = ..., pending_approvals: _Optional[int] = ..., mode: _Optional[str] = ...) -> None: ...

class SparesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SpareInfo(_message.Message):
    __slots__ = ("spare", "healthy", "allocated_to", "job", "block", "source")
    SPARE_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_TO_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    spare: str
    healthy: bool
    allocated_to: str
    job: str
    block: int
    source: str
    def __init__(self, spare: _Optional[str] = ..., healthy: _Optional[bool] = ..., allocated_to: _Optional[str] = ..., job: _Optional[str] = ..., block: _Optional[int] = ..., source: _Optional[str] = ...) -> None: ...

class SparesResponse(_message.Message):
    __slots__ = ("spares",)
    SPARES_FIELD_NUMBER: _ClassVar[int]
    spares: _containers.RepeatedCompositeFieldContainer[SpareInfo]
    def __init__(self, spares: _Optional[_Iterable[_Union[SpareInfo, _Mapping]]] = ...) -> None: ...

class JobsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class JobInfo(_message.Message):
    __slots__ = ("job", "state", "nodes", "world_size", "step", "checkpoint_dir", "last_complete_step", "last_complete_path", "last_complete_ms", "restarts", "steps_lost", "downtime_s", "resumed_from_step", "resumed_from_checkpoint")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    LAST_COMPLETE_STEP_FIELD_NUMBER: _ClassVar[int]
    LAST_COMPLETE_PATH_FIELD_NUMBER: _ClassVar[int]
    LAST_COMPLETE_MS_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    STEPS_LOST_FIELD_NUMBER: _ClassVar[int]
    DOWNTIME_S_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FROM_STEP_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FROM_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    job: str
    state: str
    nodes: _containers.RepeatedScalarFieldContainer[str]
    world_size: int
    step: int
    checkpoint_dir: str
    last_complete_step: int
    last_complete_path: str
    last_complete_ms: int
    restarts: int
    steps_lost: int
    downtime_s: float
    resumed_from_step: int
    resumed_from_checkpoint: bool
    def __init__(self, job: _Optional[str] = ..., state: _Optional[str] = ..., nodes: _Optional[_Iterable[str]] = ..., world_size: _Optional[int] = ..., step: _Optional[int] = ..., checkpoint_dir: _Optional[str] = ..., last_complete_step: _Optional[int] = ..., last_complete_path: _Optional[str] = ..., last_complete_ms: _Optional[int] = ..., restarts: _Optional[int] = ..., steps_lost: _Optional[int] = ..., downtime_s: _Optional[float] = ..., resumed_from_step: _Optional[int] = ..., resumed_from_checkpoint: _Optional[bool] = ...) -> None: ...

class JobsResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobInfo]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobInfo, _Mapping]]] = ...) -> None: ...

class IncidentActionRequest(_message.Message):
    __slots__ = ("id", "actor", "reason")
    ID_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    id: str
    actor: str
    reason: str
    def __init__(self, id: _Optional[str] = ..., actor: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ApprovalsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ApprovalInfo(_message.Message):
    __slots__ = ("incident_id", "node", "action", "requested_ms", "reason")
    INCIDENT_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    incident_id: str
    node: str
    action: str
    requested_ms: int
    reason: str
    def __init__(self, incident_id: _Optional[str] = ..., node: _Optional[str] = ..., action: _Optional[str] = ..., requested_ms: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class ApprovalsResponse(_message.Message):
    __slots__ = ("approvals",)
    APPROVALS_FIELD_NUMBER: _ClassVar[int]
    approvals: _containers.RepeatedCompositeFieldContainer[ApprovalInfo]
    def __init__(self, approvals: _Optional[_Iterable[_Union[ApprovalInfo, _Mapping]]] = ...) -> None: ...
