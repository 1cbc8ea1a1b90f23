"""The correlator's settings: how long to wait, how many make a pattern, how long to hold."""

from __future__ import annotations

from dataclasses import dataclass

from starpulse.core.schema import setting


@dataclass
class CorrelationConfig:
    """How long to wait, how many make a pattern, how long to hold. Times in seconds."""

    settle_s: float = setting(
        15.0,
        "Seconds: the longest a new condition waits for its siblings before it is grouped, and the wait "
        "while the fleet's report interval is not measured yet (controller.detect.grouping derives the rest)",
        ge=0,
    )
    node_window_s: float = setting(
        0.05,
        "Seconds a node-local condition (a GPU's Xid, lost GPU, DBE, a disk) waits for the same node's "
        "other devices, whose events arrive together: several GPUs failing at once are one node fault",
        ge=0,
    )
    sibling_slack_s: float = setting(
        0.25,
        "Seconds added to the siblings' measured report interval before a condition a shared component "
        "could explain (NIC, switch port, heartbeat) is grouped: transit and decision",
        ge=0,
    )
    event_window_s: float = setting(
        0.5,
        "Seconds such a condition waits when an event raised it (a port down, sent at once by the agents' "
        "link watch): its siblings' events arrive as fast (a 0.1 s poll, transit, decision)",
        ge=0,
    )
    min_nodes_for_switch: int = setting(
        2, "Distinct nodes whose NICs on one leaf must fail together to blame the leaf", ge=1
    )
    min_leaves_for_spine: int = setting(
        2, "Distinct leaves whose uplinks to one spine must fail together to blame the spine", ge=1
    )
    node_device_threshold: int = setting(
        3, "GPUs (or NICs) of one node failing at once that make it a node fault, not a device fault", ge=1
    )
    partition_min_nodes: int = setting(
        3, "Lost heartbeats behind one switch that make a partition rather than dead nodes", ge=1
    )
    partition_fleet_share: float = setting(
        0.2, "Share of the fleet (0..1): lost heartbeats above it make a partition wherever they are", gt=0, le=1
    )
    resolve_hold_s: float = setting(
        60.0,
        "Seconds of flap damping: an incident resolves only after all its conditions stayed resolved "
        "this long; a recurrence within it keeps (or reopens) the same incident",
        ge=0,
    )
    restart_grace_s: float = setting(
        300.0,
        "Seconds a resumed incident waits after a restart for its conditions to be raised again before "
        "it resolves (the condition engine rebuilds its state from fresh reports)",
        ge=0,
    )

    def __post_init__(self) -> None:
        if self.settle_s < 0 or self.resolve_hold_s < 0 or self.restart_grace_s < 0:
            raise ValueError("settle_s, resolve_hold_s and restart_grace_s must be >= 0")
        if min(self.min_nodes_for_switch, self.min_leaves_for_spine, self.node_device_threshold) < 1:
            raise ValueError("node/leaf/device thresholds must be >= 1")
        if self.partition_min_nodes < 1 or not 0 < self.partition_fleet_share <= 1:
            raise ValueError("partition_min_nodes must be >= 1 and partition_fleet_share in (0, 1]")
