"""The vocabulary detection speaks: conditions (a standing state on one component) and
incidents (conditions grouped on the fabric, with one root cause).

Events say something happened; a condition says something *is* wrong, since when, how
often; an incident says what the culprit is. Components are named as in the fabric:
"node-003", "node-003/gpu-5", "node-003/nic-5", "leaf-b0-r3", "spine-2",
"node-003/nic-5<->leaf-b0-r5" (a cable), "leaf-b0-r3:Ethernet8" (a switch port).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from starpulse.core.vocab import Severity

ComponentType = Literal["gpu", "nic", "node", "switch", "link", "network", "job"]

# What a condition is about, for correlation: which failure domain it can implicate.
CATEGORIES = (
    "gpu",  # a GPU fault (Xid, ECC, remap, lost, NVLink, thermal): blames the GPU / node
    "nic_link",  # a host NIC port down or flapping: may implicate its cable, leaf or spine
    "nic_errors",  # error-counter rates, rate below nominal, PFC pause storm on a host NIC
    "switch",  # a switch's own condition (silent, PFC watchdog storm, optics)
    "switch_port",  # a switch port down / erroring
    "heartbeat",  # a node not heard from
    "host",  # disk, memory
    "failslow",  # a node persistently slower than its peers
    "agent",  # the node's agent itself: two agents claiming the node (controller.detect.agent_conflict)
    "hang",  # a job whose steps stopped moving (controller.jobs.hang): blames its suspects, if any
    "path",  # probes lose or slow down above a leaf, on an uplink not yet traced (controller.detect.probes)
)


@dataclass
class Condition:
    """A standing state on one component, raised by one rule."""

    rule: str  # rule id from the rules file
    component: str  # fabric name (see module docstring)
    component_type: ComponentType
    category: str  # one of CATEGORIES
    node: str | None  # the compute node it belongs to (None for switches and cables)
    severity: Severity
    action: str  # recommended action (starpulse.core.vocab.ACTIONS vocabulary, plus rule-specific ones)
    message: str
    first_seen_ms: int
    last_seen_ms: int
    count: int = 1  # how many times it was observed (10,000 identical XIDs -> count 10,000)
    evidence: dict[str, Any] = field(default_factory=dict)
    resolved_ms: int | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.rule, self.component)

    @property
    def active(self) -> bool:
        return self.resolved_ms is None


ConditionChangeKind = Literal["opened", "updated", "resolved"]


@dataclass
class ConditionChange:
    kind: ConditionChangeKind
    condition: Condition


@dataclass(frozen=True, slots=True)
class Defaults:
    """A rules file's ``defaults:`` section (controller.detect.rules)."""

    hold_s: float = 600.0
    flap_window_s: float = 600.0
    resolve_after: int = 2
    update_interval_s: float = 1.0
    saturated_fires: bool = True  # a counter that reaches its maximum inside the window fires (see evaluators.counters)
    counter_interval_s: float = 0.0  # read a node's cumulative counters at most this often (0: every report)


@dataclass(frozen=True, slots=True)
class Rule:
    """One validated rule. ``params`` holds the kind's parsed parameters (Quantity for thresholds)."""

    id: str
    description: str
    category: str
    severity: str
    action: str
    kind: str
    params: Mapping[str, Any]
    hold_ms: int
    resolve_after: int
    index: int = 0
    # Precomputed for the hot path, by the kind's evaluator when the file loads.
    threshold: float = 0.0  # canonical value of params["threshold"] when present
    threshold_is_rate: bool = False
    window_s: float = 0.0  # 0 = per-interval rate
    counter_keys: tuple[str, ...] = ()
    spec: Any = None  # what the kind compiled from its parameters (the field kinds' comparison)

    def p(self, key: str) -> Any:
        return self.params.get(key)


IncidentKind = str  # e.g. "gpu_fault", "nic_fault", "link_fault", "switch_fault", "partition", ...


@dataclass
class Incident:
    """Conditions grouped by what they share on the fabric, blaming one component."""

    id: str
    kind: IncidentKind
    root_cause: str  # fabric component name; "" for a partition (blames no node)
    component_type: ComponentType
    affected_nodes: list[str]
    affected_jobs: list[str]
    severity: Severity
    action: str
    evidence: list[dict[str, Any]]  # condition summaries (rule, component, message, count, first/last seen)
    opened_ms: int
    resolved_ms: int | None = None
    condition_keys: list[tuple[str, str]] = field(default_factory=list)
    updated_ms: int = 0

    @property
    def active(self) -> bool:
        return self.resolved_ms is None
