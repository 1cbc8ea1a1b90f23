"""Trace one Xid 79 kernel line through the real controller, from ingest to the notifier.

How it counts: the line is read by the agent's own kernel-log parser (agent.collectors.kmsg)
into an event, outside the trace. Then, with a ``sys.setprofile`` hook on, the controller
takes what an agent sends after the line (the event, then the node's next report, as
``TelemetryServicer`` hands them on: ``registry.record_events`` and the decider's
``decide``), the grouping window passes on a fake clock and detection groups (what the
grouping task runs), and the incident reaches the notifier's outbox. Counted:

- files passed: distinct source files of this repository in which a Python function was
  entered (generated protobuf modules and the standard library are not counted);
- entries into detect/pipeline.py: calls into that file from a frame in another file,
  counted per input (the event, the report, the grouping); a re-entry is every entry of
  one input after its first (detection called again for what it already took).

    PYTHONPATH=CHECKOUT python tools/xid_trace.py
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

import structlog

LINE = "[ 100.000001] NVRM: Xid (PCI:0000:9b:00): 79, pid=0, name=<unknown>, GPU has fallen off the bus."
NODE = "node-002"


class Tracer:
    """A profile hook: repo files entered, and entries into detect/pipeline.py from outside it."""

    def __init__(self, root: Path) -> None:
        self.root = str(root) + "/"
        self.files: set[str] = set()
        self.phase = ""
        self.entries: dict[str, int] = {}  # input -> entries into detect/pipeline.py while it was taken

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        name = frame.f_code.co_filename
        if not name.startswith(self.root) or "/starpulse/v1/" in name:
            return
        rel = name[len(self.root) :]
        self.files.add(rel)
        if rel.endswith("controller/detect/pipeline.py"):
            back = frame.f_back
            if back is None or back.f_code.co_filename != name:
                self.entries[self.phase] = self.entries.get(self.phase, 0) + 1

    @property
    def reentries(self) -> int:
        return sum(max(0, n - 1) for n in self.entries.values())


def xid_event() -> Any:
    """The event the agent makes of LINE (component named as the agent names GPU 3)."""
    from agent.collectors.kmsg.family import State
    from agent.collectors.kmsg.lines import parse_line
    from agent.collectors.kmsg.nvidia import match_xid
    from starpulse.core.findings import Finding

    record = parse_line(LINE)
    assert record is not None
    finding = match_xid(record.message, State())
    assert isinstance(finding, Finding), finding
    finding.component = "gpu-3"
    return finding.to_event(seq=1)


def trace(workdir: Path) -> Tracer:
    import controller
    from controller.fabric import generate_fabric
    from controller.outputs.notify import parse_notify_config
    from controller.service import Controller, ControllerConfig
    from starpulse.core.clock import FakeClock
    from starpulse.v1 import inventory_pb2 as ipb
    from starpulse.v1 import service_pb2 as spb
    from starpulse.v1 import telemetry_pb2 as tpb

    fabric = generate_fabric(nodes=4, gpus_per_node=8, rails=2, nodes_per_block=4, spines=1, spares=0)
    notify = parse_notify_config(
        {"receivers": [{"name": "hook", "type": "webhook", "url": "http://127.0.0.1:9/", "secret": "s" * 32}]}
    )
    clock = FakeClock()
    ctl = Controller(ControllerConfig(db_path=workdir / "c.db", fabric=fabric, notify=notify), clock=clock)
    inventory = ipb.Inventory(gpus=[ipb.GpuInfo(index=i) for i in range(8)])
    node = ctl.registry.register(spb.Hello(node_id=NODE, role=ipb.NODE_ROLE_COMPUTE, inventory=inventory))
    event = xid_event()
    report = spb.AgentMessage(report=tpb.Report(seq=1, timestamp_ms=clock.time_ms()))
    tracer = Tracer(Path(controller.__file__).resolve().parents[1])  # the checkout on PYTHONPATH
    queued_before = ctl.notifier.outbox_depth()
    sys.setprofile(tracer)
    try:
        tracer.phase = "event"
        ctl.registry.record_events(node, [event])  # what the servicer does with an event batch
        tracer.phase = "report"
        ctl.telemetry.decider.decide(node, report, time.perf_counter())  # and with the next report
        tracer.phase = "grouping"
        clock.advance(60.0)  # past any grouping window
        ctl.detection.group()  # what the grouping task runs when the window closes
    finally:
        sys.setprofile(None)
    try:
        if ctl.notifier.outbox_depth() <= queued_before:
            raise SystemExit("xid_trace: no notice reached the notifier's outbox: the trace did not cover the path")
    finally:
        ctl.store.close()
    return tracer


def main() -> int:
    logging.disable(logging.CRITICAL)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    with tempfile.TemporaryDirectory() as tmp:
        tracer = trace(Path(tmp))
    print(f"files passed: {len(tracer.files)}")
    per_input = ", ".join(f"{k} {v}" for k, v in tracer.entries.items())
    print(f"detect/pipeline.py re-entries: {tracer.reentries} (entries per input: {per_input})")
    for name in sorted(tracer.files):
        print(f"  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
