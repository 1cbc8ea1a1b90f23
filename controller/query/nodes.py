"""Node status rows: presence from a node source (live registry or stored rows), lifecycle and
recent warnings from the SQLite file."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Protocol

from controller.heal.states import NodeHealState, lifecycle_records
from controller.store import Store
from starpulse.core.clock import Clock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb

RECENT_WINDOW_MS = 3600 * 1000


class NodeRow(Protocol):
    """What a node status is made of: a live registry record or a row replicated from etcd."""

    @property
    def node_id(self) -> str: ...
    @property
    def role(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def last_seen_ms(self) -> int: ...
    @property
    def agent_version(self) -> str: ...
    @property
    def hostname(self) -> str: ...
    @property
    def inventory(self) -> ipb.Inventory: ...


def node_statuses(
    nodes: Iterable[NodeRow],
    store: Store,
    clock: Clock,
    states: Collection[NodeHealState] = (),
) -> list[spb.NodeStatus]:
    """One row per node, by id; open_events = warning-or-worse events in the last hour (on ``clock``).

    ``state`` is presence (online/unreachable); ``lifecycle_state`` is where the node is in
    remediation, read from the same SQLite file (a node without a row is in service).
    ``states`` keeps only nodes in those lifecycle states.
    """
    recent = store.recent_event_counts(clock.time_ms() - RECENT_WINDOW_MS, tpb.SEVERITY_WARNING)
    lifecycle = lifecycle_records(store.connection)
    nodes = sorted(nodes, key=lambda n: n.node_id)
    stored_checks: dict[str, tpb.Event] | None = None
    out = []
    for node in nodes:
        rec = lifecycle.get(node.node_id)
        life = rec.state if rec is not None else NodeHealState.IN_SERVICE
        if states and life not in states:
            continue
        if hasattr(node, "not_judged_why"):  # a live record: its latest check
            why = str(node.not_judged_why)
        else:  # a stored row (a standby): the last accel_check event the node sent
            if stored_checks is None:
                stored_checks = store.latest_events_of_kind(tpb.EVENT_KIND_ACCEL_CHECK)
            why = not_judged_from_event(stored_checks.get(node.node_id))
        out.append(
            spb.NodeStatus(
                node_id=node.node_id,
                role=ipb.NodeRole.Name(node.role),
                state=node.state,
                last_seen_ms=node.last_seen_ms,
                gpu_count=len(node.inventory.gpus),
                nic_count=len(node.inventory.nics),
                open_events=recent.get(node.node_id, 0),
                agent_version=node.agent_version,
                hostname=node.hostname,
                accelerator_vendor=accelerator_vendor(node.inventory),
                accelerator_model=node.inventory.gpus[0].model if node.inventory.gpus else "",
                lifecycle_state=str(life),
                lifecycle_since_ms=rec.since_ms if rec is not None else 0,
                lifecycle_reason=rec.reason if rec is not None else "",
                drained_by=(rec.drained_by or "") if rec is not None else "",
                incident_id=(rec.incident_id or "") if rec is not None else "",
                judged=not why,
                not_judged_why=why,
            )
        )
    return out


def not_judged_from_event(event: tpb.Event | None) -> str:
    """Why a node is not judged, by its last accel_check event ("" when judged or none came)."""
    if event is None or event.attributes.get("judged") != "false":
        return ""
    return event.message.removeprefix("not judged: ")


def accelerator_vendor(inventory: ipb.Inventory) -> str:
    """The vendors of a node's accelerators, in inventory order; a GPU without one is NVIDIA (older agents)."""
    return ",".join(dict.fromkeys(g.vendor or "nvidia" for g in inventory.gpus))
