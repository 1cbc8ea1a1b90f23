"""`--json` prints plain values: numbers as numbers, enums by short name, zeros present, unset optionals null."""

from __future__ import annotations

import json

from starpulse.app.cli.common import enum_short_name, message_dict
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb


def test_node_status_is_plain() -> None:
    node = spb.NodeStatus(node_id="node-001", role=ipb.NODE_ROLE_COMPUTE, last_seen_ms=1_764_000_000_000)
    out = json.loads(json.dumps(message_dict(node)))
    assert out["role"] == "compute"  # not NODE_ROLE_COMPUTE
    assert out["last_seen_ms"] == 1_764_000_000_000  # a number, not the string protobuf's JSON writes
    assert out["gpu_count"] == 0 and out["open_events"] == 0  # zero values present


def test_report_keeps_index_zero_and_nulls_what_is_unsupported() -> None:
    report = tpb.Report(seq=2**40)
    report.gpus.add(index=0, temperature_c=41.0)
    nic = report.nics.add(rdma_device="mlx5_3")
    nic.counters["port_rcv_errors"] = 7
    out = message_dict(report)
    (gpu,) = out["gpus"]
    assert gpu["index"] == 0 and gpu["temperature_c"] == 41.0
    assert gpu["power_w"] is None  # optional and not set: unsupported, never 0
    assert out["seq"] == 2**40
    assert out["nics"][0]["counters"] == {"port_rcv_errors": 7}


def test_enum_short_names() -> None:
    role = ipb.NodeRole.DESCRIPTOR
    assert enum_short_name(role, ipb.NODE_ROLE_SWITCH) == "switch"
    assert enum_short_name(tpb.Severity.DESCRIPTOR, tpb.SEVERITY_CRITICAL) == "critical"
    assert enum_short_name(role, 999) == 999  # a number this build does not know stays a number
