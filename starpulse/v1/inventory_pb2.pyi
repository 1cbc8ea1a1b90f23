from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_ROLE_UNSPECIFIED: _ClassVar[NodeRole]
    NODE_ROLE_COMPUTE: _ClassVar[NodeRole]
    NODE_ROLE_SWITCH: _ClassVar[NodeRole]
NODE_ROLE_UNSPECIFIED: NodeRole
NODE_ROLE_COMPUTE: NodeRole
NODE_ROLE_SWITCH: NodeRole

class GpuInfo(_message.Message):
    __slots__ = ("index", "uuid", "serial", "pci_bus_id", "model", "nvlink_count", "memory_total_bytes", "vbios_version", "vendor", "interconnect", "link_count")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NVLINK_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    VBIOS_VERSION_FIELD_NUMBER: _ClassVar[int]
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    INTERCONNECT_FIELD_NUMBER: _ClassVar[int]
    LINK_COUNT_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    serial: str
    pci_bus_id: str
    model: str
    nvlink_count: int
    memory_total_bytes: int
    vbios_version: str
    vendor: str
    interconnect: str
    link_count: int
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., serial: _Optional[str] = ..., pci_bus_id: _Optional[str] = ..., model: _Optional[str] = ..., nvlink_count: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ..., vbios_version: _Optional[str] = ..., vendor: _Optional[str] = ..., interconnect: _Optional[str] = ..., link_count: _Optional[int] = ...) -> None: ...

class NicInfo(_message.Message):
    __slots__ = ("rdma_device", "port", "netdev", "link_layer", "rate_gbps", "node_guid", "mac", "pci_address", "numa_node", "paired_gpu_index", "hca_type", "fw_version", "board_id", "owner")
    RDMA_DEVICE_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    NETDEV_FIELD_NUMBER: _ClassVar[int]
    LINK_LAYER_FIELD_NUMBER: _ClassVar[int]
    RATE_GBPS_FIELD_NUMBER: _ClassVar[int]
    NODE_GUID_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    PCI_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NUMA_NODE_FIELD_NUMBER: _ClassVar[int]
    PAIRED_GPU_INDEX_FIELD_NUMBER: _ClassVar[int]
    HCA_TYPE_FIELD_NUMBER: _ClassVar[int]
    FW_VERSION_FIELD_NUMBER: _ClassVar[int]
    BOARD_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    rdma_device: str
    port: int
    netdev: str
    link_layer: str
    rate_gbps: float
    node_guid: str
    mac: str
    pci_address: str
    numa_node: int
    paired_gpu_index: int
    hca_type: str
    fw_version: str
    board_id: str
    owner: str
    def __init__(self, rdma_device: _Optional[str] = ..., port: _Optional[int] = ..., netdev: _Optional[str] = ..., link_layer: _Optional[str] = ..., rate_gbps: _Optional[float] = ..., node_guid: _Optional[str] = ..., mac: _Optional[str] = ..., pci_address: _Optional[str] = ..., numa_node: _Optional[int] = ..., paired_gpu_index: _Optional[int] = ..., hca_type: _Optional[str] = ..., fw_version: _Optional[str] = ..., board_id: _Optional[str] = ..., owner: _Optional[str] = ...) -> None: ...

class LldpNeighbor(_message.Message):
    __slots__ = ("local_interface", "chassis_name", "chassis_id", "port_id", "port_description", "management_address")
    LOCAL_INTERFACE_FIELD_NUMBER: _ClassVar[int]
    CHASSIS_NAME_FIELD_NUMBER: _ClassVar[int]
    CHASSIS_ID_FIELD_NUMBER: _ClassVar[int]
    PORT_ID_FIELD_NUMBER: _ClassVar[int]
    PORT_DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    MANAGEMENT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    local_interface: str
    chassis_name: str
    chassis_id: str
    port_id: str
    port_description: str
    management_address: str
    def __init__(self, local_interface: _Optional[str] = ..., chassis_name: _Optional[str] = ..., chassis_id: _Optional[str] = ..., port_id: _Optional[str] = ..., port_description: _Optional[str] = ..., management_address: _Optional[str] = ...) -> None: ...

class HostFacts(_message.Message):
    __slots__ = ("hostname", "kernel", "driver_version", "cpu_count", "memory_total_bytes", "os", "nvml_version", "cuda_driver_version")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    KERNEL_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    CPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    OS_FIELD_NUMBER: _ClassVar[int]
    NVML_VERSION_FIELD_NUMBER: _ClassVar[int]
    CUDA_DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    kernel: str
    driver_version: str
    cpu_count: int
    memory_total_bytes: int
    os: str
    nvml_version: str
    cuda_driver_version: str
    def __init__(self, hostname: _Optional[str] = ..., kernel: _Optional[str] = ..., driver_version: _Optional[str] = ..., cpu_count: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ..., os: _Optional[str] = ..., nvml_version: _Optional[str] = ..., cuda_driver_version: _Optional[str] = ...) -> None: ...

class SwitchPortInfo(_message.Message):
    __slots__ = ("name", "speed_mbps", "alias", "lanes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SPEED_MBPS_FIELD_NUMBER: _ClassVar[int]
    ALIAS_FIELD_NUMBER: _ClassVar[int]
    LANES_FIELD_NUMBER: _ClassVar[int]
    name: str
    speed_mbps: int
    alias: str
    lanes: int
    def __init__(self, name: _Optional[str] = ..., speed_mbps: _Optional[int] = ..., alias: _Optional[str] = ..., lanes: _Optional[int] = ...) -> None: ...

class Inventory(_message.Message):
    __slots__ = ("gpus", "nics", "lldp_neighbors", "host", "switch_ports")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    NICS_FIELD_NUMBER: _ClassVar[int]
    LLDP_NEIGHBORS_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    SWITCH_PORTS_FIELD_NUMBER: _ClassVar[int]
    gpus: _containers.RepeatedCompositeFieldContainer[GpuInfo]
    nics: _containers.RepeatedCompositeFieldContainer[NicInfo]
    lldp_neighbors: _containers.RepeatedCompositeFieldContainer[LldpNeighbor]
    host: HostFacts
    switch_ports: _containers.RepeatedCompositeFieldContainer[SwitchPortInfo]
    def __init__(self, gpus: _Optional[_Iterable[_Union[GpuInfo, _Mapping]]] = ..., nics: _Optional[_Iterable[_Union[NicInfo, _Mapping]]] = ..., lldp_neighbors: _Optional[_Iterable[_Union[LldpNeighbor, _Mapping]]] = ..., host: _Optional[_Union[HostFacts, _Mapping]] = ..., switch_ports: _Optional[_Iterable[_Union[SwitchPortInfo, _Mapping]]] = ...) -> None: ...
