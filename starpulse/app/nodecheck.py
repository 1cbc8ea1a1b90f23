"""A node's verdict by the controller's own rules: one definition of a healthy node, not two.

``starpulse scan`` samples this node twice over a short window and hands the samples, its
kernel-log findings and (optionally) the inventory it is expected to have to the same
``ConditionEngine`` and default rules the controller runs. The engine's clock is a
``FakeClock`` stepped past the rules' counter interval between the two samples, so counter
rates are judged over the real window (the samples carry real timestamps) without waiting
the controller's 15 s. What opens is what the controller would open for this node.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from controller.detect.conditions import ConditionEngine
from controller.detect.model import Condition
from controller.detect.rules import RuleSet, load_rules
from controller.ingest.registry import NodeRecord
from starpulse.core import vocab
from starpulse.core.clock import FakeClock
from starpulse.core.findings import Finding
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

HEALTHY, UNHEALTHY, UNKNOWN = "healthy", "unhealthy", "unknown"
ACCELERATOR_COLLECTOR = "gpu"  # every accelerator backend's collector name
NIC_MISSING_RULE = "nic.missing"  # its conditions are the verdict's "missing" list, for tools
EXIT_CODES = {HEALTHY: 0, UNHEALTHY: 1, UNKNOWN: 2}
# A warning that asks for nothing of the node (an application to restart, a person to look, a
# degraded part to see to at a service window) leaves it in service.
_BENIGN_ACTIONS = frozenset({vocab.ACTION_NONE, vocab.ACTION_RESTART_APP, vocab.ACTION_INVESTIGATE, "check_hardware"})


_PORT_RE = re.compile(r"[^/\s]+/\d+")


class ExpectError(ValueError):
    """The expected-inventory file is unreadable or malformed (one line naming the file and key)."""


@dataclass(frozen=True)
class Expected:
    """What the node should have: GPU count and the RDMA ports (``mlx5_0/1``) that must be there."""

    gpus: int | None = None
    nics: tuple[str, ...] = ()


def load_expected(path: str) -> Expected:
    """Read ``--expect FILE`` (YAML or JSON: ``gpus: 8``, ``nics: [mlx5_0/1, ...]``)."""
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ExpectError(f"--expect {path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ExpectError(f"--expect {path}: not YAML/JSON: {str(exc).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise ExpectError(f"{path}: expected a mapping with 'gpus' and/or 'nics'")
    unknown = set(raw) - {"gpus", "nics"}
    if unknown:
        raise ExpectError(f"{path}: unknown key {sorted(unknown)[0]!r} (known: gpus, nics)")
    gpus = raw.get("gpus")
    if gpus is not None and (not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0):
        raise ExpectError(f"{path}: 'gpus' must be a whole number, got {gpus!r}")
    nics = raw.get("nics", [])
    if not isinstance(nics, list) or not all(isinstance(n, str) and _PORT_RE.fullmatch(n) for n in nics):
        raise ExpectError(f"{path}: 'nics' must be a list of RDMA ports like 'mlx5_0/1'")
    return Expected(gpus, tuple(nics))


@dataclass
class Verdict:
    """The node's state, the conditions behind it and what could not be checked."""

    status: str
    conditions: list[Condition] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # what could not be checked

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "exit_code": self.exit_code,
            "conditions": [
                {
                    "rule": c.rule,
                    "component": c.component,
                    "severity": c.severity,
                    "action": c.action,
                    "message": c.message,
                }
                for c in self.conditions
            ],
            "missing": list(self.missing),
            "problems": list(self.problems),
        }


def unhealthy(c: Condition) -> bool:
    """Whether a condition takes the node out of service (critical, or a warning that asks for work)."""
    if vocab.SEVERITY_ORDER.get(c.severity, 0) >= vocab.SEVERITY_ORDER["critical"]:
        return True
    return c.severity == "warning" and c.action not in _BENIGN_ACTIONS


def _expected_inventory(actual: ipb.Inventory, expected: Expected | None) -> ipb.Inventory:
    """The inventory the rules judge against: the actual one, with the expected GPUs and RDMA
    ports added where it lacks them, so the controller's gpu.missing / nic.missing rules say
    what is missing (one definition, not a comparison of scan's own)."""
    inv = ipb.Inventory()
    inv.CopyFrom(actual)
    if expected is None:
        return inv
    if expected.gpus is not None and expected.gpus > len(inv.gpus):
        have = {g.index for g in inv.gpus}
        for index in range(expected.gpus):
            if index not in have:
                inv.gpus.add(index=index, uuid=f"expected-gpu-{index}")
    present = {f"{n.rdma_device}/{n.port}" for n in inv.nics}
    for port in expected.nics:
        if port not in present:
            device, _, number = port.rpartition("/")
            inv.nics.add(rdma_device=device, port=int(number))
    return inv


def judge(
    node_id: str,
    inventory: ipb.Inventory,
    reports: Sequence[tpb.Report],
    findings: Sequence[Finding],
    expected: Expected | None = None,
    rules: RuleSet | None = None,
) -> Verdict:
    """Run the controller's rules over this node's samples and findings; the node's verdict."""
    rules = rules or load_rules()
    last = reports[-1] if reports else None
    check = last.accelerator_check if last is not None and last.HasField("accelerator_check") else None
    problems = [
        f"collector {c.name}: {c.error}"
        for c in (last.collectors if last is not None else [])
        if c.supported and not c.ok and not (check is not None and c.name == ACCELERATOR_COLLECTOR)
    ]
    if check is not None and not check.judged:
        problems.insert(0, check.reason)  # never healthy for what was not read
    if not reports:
        return Verdict(UNKNOWN, problems=["no sample taken"])
    clock = FakeClock(start_ms=reports[0].timestamp_ms or 1_700_000_000_000)
    engine = ConditionEngine(rules, clock=clock)
    node = NodeRecord(
        node_id=node_id,
        role=ipb.NODE_ROLE_COMPUTE,
        state="online",
        first_seen_ms=0,
        last_seen_ms=0,
        inventory=_expected_inventory(inventory, expected),
    )
    step_s = rules.defaults.counter_interval_s + 1.0
    for i, report in enumerate(reports):
        if i:
            clock.advance(step_s)  # the counter interval passes between samples
        engine.on_report(node, report)
    events = [f.to_event(seq=n + 1) for n, f in enumerate(findings)]
    if events:
        engine.on_events(node, events)
    conditions = sorted(engine.active(), key=lambda c: (-vocab.SEVERITY_ORDER.get(c.severity, 0), c.rule, c.component))
    missing = [f"nic {c.evidence['port']}" for c in conditions if c.rule == NIC_MISSING_RULE]
    bad = any(unhealthy(c) for c in conditions)
    unread = check is not None and not check.judged
    status = UNHEALTHY if bad else (UNKNOWN if unread or (problems and not reports[-1].nics) else HEALTHY)
    return Verdict(status, conditions, missing, problems)
