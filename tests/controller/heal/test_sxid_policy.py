"""An NVSwitch SXid, from its kernel-log line to the heal decision.

A fatal SXid (or a non-fatal one whose recovery in NVIDIA's Fabric Manager guide is a
restart) takes the node's NVLink fabric down: the node is rebooted. A non-fatal one leaves
the fabric working: an alert, the node keeps its job. An SXid's number is an NVSwitch code,
never read as a GPU Xid (SXid 12022 is not an "unknown Xid").
"""

from __future__ import annotations

import pytest

from agent.collectors.kmsg.reader import classify
from controller.detect.model import Incident
from controller.heal.policy import ALERT_ONLY, evidence_xids, load_policy
from tests.support.conditions import compute_node, make_engine
from tests.support.correlate import opened_incidents

# Line shapes as the driver prints them (Fabric Manager user guide; public bug reports).
FATAL = "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 12022, Fatal, Link 36 (0x00000011 0x00000000 0x00000000)"
NON_FATAL = "nvidia-nvswitch3: SXid (PCI:0000:89:00.0): 22013, Non-fatal, Link 46 Minion Link DLREQ interrupt"
RESTART = "nvidia-nvswitch1: SXid (PCI:0000:86:00.0): 12028, Non-fatal, Link 41 egress non-posted PRIV error (First)"


def _incident(line: str) -> Incident:
    finding = classify(line)
    assert finding is not None and finding.kind == "sxid"
    engine, clock = make_engine()
    event = finding.to_event(seq=1)
    event.timestamp_ms = clock.time_ms()
    opened = opened_incidents(engine.on_events(compute_node(), [event]), clock)
    assert len(opened) == 1, opened
    return opened[0]


@pytest.mark.parametrize(("line", "sxid"), [(FATAL, 12022), (RESTART, 12028)])
def test_a_fatal_sxid_reboots_the_node(line: str, sxid: int) -> None:
    inc = _incident(line)
    assert (inc.kind, inc.action) == ("node_fault", "reboot")
    assert load_policy().decide(inc).action == "reboot"
    assert evidence_xids(inc) == []  # not a GPU Xid: by_xid and the Xid escalation never see it
    assert [e["evidence"].get("sxid") for e in inc.evidence] == [sxid]


def test_a_non_fatal_sxid_alerts_and_keeps_the_node() -> None:
    inc = _incident(NON_FATAL)
    assert (inc.kind, inc.severity, inc.action) == ("node_fault", "warning", "check_hardware")
    assert load_policy().decide(inc).action == ALERT_ONLY
