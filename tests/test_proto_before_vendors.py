"""Messages from agents built before issue 21 (vendors) still decode and are judged the same.

The contract grew by fields only. ``tests/fixtures/proto_before_21/`` holds the two .proto files
as they were; a subprocess generates them with protoc and encodes an inventory, a report with a
fault in it and events with the old code alone, so nothing of today's contract is imported there.
Today's code decodes those bytes and the condition engine judges them exactly as it judges the same
values built with today's code.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from grpc_tools import protoc

from controller.detect.conditions import ConditionEngine
from controller.detect.rules import load_rules
from controller.ingest.registry import NodeRecord
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

OLD_PROTO = Path(__file__).parent / "fixtures" / "proto_before_21"

# Built by the old code and by today's, from the same literal values.
BUILD = textwrap.dedent(
    """
    def build(ipb, tpb):
        inv = ipb.Inventory()
        for i in range(2):
            inv.gpus.add(index=i, uuid=f"GPU-{i}", pci_bus_id=f"00000000:{0x17 + i:02X}:00.0",
                         model="NVIDIA H100 80GB HBM3", nvlink_count=2)
        inv.host.hostname = "node-001"
        report = tpb.Report(seq=7, timestamp_ms=1_000_000)
        report.collectors.add(name="gpu", supported=True, ok=True)
        for i in range(2):
            g = report.gpus.add(index=i, uuid=f"GPU-{i}", temperature_c=60, remap_pending=False,
                                remap_failure=i == 1, recovery_action=0, clock_event_reasons=0x40 if i else 0x1,
                                ecc_dbe_volatile=0, pcie_link_width=16, pcie_link_width_max=16)
            for link in range(2):
                g.nvlinks.add(link=link, up=not (i == 1 and link == 1), replay_errors=0, crc_flit_errors=0)
        events = [
            tpb.Event(seq=1, timestamp_ms=1_000_000, kind=tpb.EVENT_KIND_XID, component="gpu-0",
                      severity=tpb.SEVERITY_CRITICAL, source="kmsg", xid=79, pci="0000:17:00", action="reboot"),
            tpb.Event(seq=2, timestamp_ms=1_000_000, kind=tpb.EVENT_KIND_ECC_DBE, component="gpu-1",
                      severity=tpb.SEVERITY_CRITICAL, source="nvml", action="reset_gpu"),
        ]
        return inv, report, events
    """
)

ENCODE = BUILD + textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from starpulse.v1 import inventory_pb2, telemetry_pb2
    assert Path(telemetry_pb2.__file__).parent == Path(sys.argv[2]), telemetry_pb2.__file__
    inv, report, events = build(inventory_pb2, telemetry_pb2)
    out = Path(sys.argv[1])
    (out / "inventory.bin").write_bytes(inv.SerializeToString())
    (out / "report.bin").write_bytes(report.SerializeToString())
    for n, ev in enumerate(events):
        (out / f"event{n}.bin").write_bytes(ev.SerializeToString())
    """
)


@pytest.fixture(scope="module")
def old_bytes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """What the contract before issue 21 encodes, generated and run apart from today's code."""
    gen = tmp_path_factory.mktemp("old_contract")
    include = Path(protoc.__file__).parent / "_proto"
    for name in ("inventory.proto", "telemetry.proto"):
        rc = protoc.main(["protoc", f"-I{OLD_PROTO}", f"-I{include}", f"--python_out={gen}", f"starpulse/v1/{name}"])
        assert rc == 0, f"protoc failed on the old {name}"
    for pkg in (gen / "starpulse", gen / "starpulse" / "v1"):
        (pkg / "__init__.py").write_text("")
    out = tmp_path_factory.mktemp("old_bytes")
    script = gen / "encode.py"
    script.write_text(ENCODE)
    subprocess.run(
        [sys.executable, str(script), str(out), str(gen / "starpulse" / "v1")],
        check=True,
        env={"PYTHONPATH": str(gen), "PATH": "/usr/bin:/bin"},
        cwd=gen,
        timeout=60,
    )
    return {p.stem: p.read_bytes() for p in out.iterdir()}


def today() -> tuple[ipb.Inventory, tpb.Report, list[tpb.Event]]:
    scope: dict[str, object] = {}
    exec(BUILD, scope)  # the same literal values, built with today's generated code
    return scope["build"](ipb, tpb)  # type: ignore[operator, no-any-return]


def judge(inv: ipb.Inventory, report: tpb.Report, events: list[tpb.Event]) -> list[tuple[str, tuple[str, str]]]:
    node = NodeRecord(
        node_id="node-001", role=ipb.NODE_ROLE_COMPUTE, state="online", first_seen_ms=0, last_seen_ms=0, inventory=inv
    )
    engine = ConditionEngine(load_rules(), clock=FakeClock(1_000_000))
    changes = engine.on_report(node, report) + engine.on_events(node, events)
    return sorted((c.kind, c.condition.key) for c in changes)


class TestBeforeVendors:
    def test_old_messages_decode_to_the_same_values(self, old_bytes: dict[str, bytes]) -> None:
        """Every old message decodes with today's code into what today's code builds from the same values."""
        inv, report, events = today()
        assert ipb.Inventory.FromString(old_bytes["inventory"]) == inv
        assert tpb.Report.FromString(old_bytes["report"]) == report
        assert [tpb.Event.FromString(old_bytes[f"event{n}"]) for n in range(len(events))] == events

    def test_new_fields_read_as_absent_in_old_messages(self, old_bytes: dict[str, bytes]) -> None:
        """An old agent's GPUs have no vendor (NVIDIA by the contract) and none of the neutral fields."""
        inv = ipb.Inventory.FromString(old_bytes["inventory"])
        assert [g.vendor for g in inv.gpus] == ["", ""]
        gpu = tpb.Report.FromString(old_bytes["report"]).gpus[1]
        assert not gpu.HasField("memory_errors_uncorrectable")
        assert not gpu.HasField("thermal_slowdown")
        assert list(gpu.ras_blocks) == [] and list(gpu.links) == []
        assert tpb.Event.FromString(old_bytes["event0"]).vendor_code == ""

    def test_old_messages_are_judged_the_same(self, old_bytes: dict[str, bytes]) -> None:
        """The condition engine opens the same conditions from the old bytes as from today's messages."""
        old = judge(
            ipb.Inventory.FromString(old_bytes["inventory"]),
            tpb.Report.FromString(old_bytes["report"]),
            [tpb.Event.FromString(old_bytes[f"event{n}"]) for n in range(2)],
        )
        assert old == judge(*today())
        rules = {key[0] for kind, key in old if kind == "opened"}
        # The fault in the report and both events are seen: the test would pass vacuously otherwise.
        assert {"gpu.xid.reboot", "gpu.ecc_dbe", "gpu.remap_failure"} <= rules, rules
