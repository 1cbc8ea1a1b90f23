"""The questions outputs may ask (``Queries``), and the shapes of the answers that are not rows.

A protocol rather than a base class: the leader's answer reads live state, a standby's reads
SQLite, and a test may answer from a list.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller.detect.model import Incident
from controller.fabric import Fabric
from controller.fabric.reconcile import ReconcileReport
from controller.heal.acks import Ack
from controller.heal.states import NodeHealState
from controller.heal.states import NodeRecord as LifecycleRecord
from controller.jobs.registry import JobRecord
from controller.query.fleet import FleetReport, ReportSettings
from controller.store import StoredEventRow
from starpulse.v1 import service_pb2 as spb


@dataclass(frozen=True)
class TopologyView:
    """The declared fabric against what LLDP shows, as the leader last reconciled it."""

    summary: Mapping[str, Any]  # the declared fabric's counts; {} without one
    report: ReconcileReport
    nodes_reporting_lldp: int
    # The probe mesh's worst probed links and switches over its last window, worst first (issue 29):
    # {"component", "kind", "sent", "lost", "loss", "p99_us"}; () where probing is off.
    probe_worst: tuple[Mapping[str, Any], ...] = ()
    # each probed leaf, spine and leaf-spine cable (the localiser's fabric_health; NICs and hosts are not shown)
    probe_health: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


class Queries(Protocol):
    """Read-only questions about the fleet, answerable from the controller's SQLite file alone."""

    def incidents(self, include_resolved: bool = False, limit: int = 100) -> list[Incident]:
        """Open incidents (``include_resolved``: every one) as last written to SQLite, newest first."""
        ...

    def open_incidents(self, limit: int = 100) -> list[Incident]:
        """Open incidents as they are now, newest first (on the leader: with the latest evidence,
        which is written to SQLite only when something an operator sees changes)."""
        ...

    def incident(self, incident_id: str) -> Incident | None:
        """One incident by id, open or resolved; None when there is no such incident."""
        ...

    def incident_timeline(self, incident_id: str) -> list[dict[str, Any]]:
        """What happened to an incident, oldest first: its history, the remediation of its nodes, the ack."""
        ...

    def incident_ack(self, incident_id: str) -> Ack | None: ...

    def topology(self) -> TopologyView | None:
        """The LLDP reconciliation; None where it is not computed (a standby: only the leader reconciles)."""
        ...

    def fabric(self) -> Fabric | None:
        """The declared fabric (None: none declared, or not known here)."""
        ...

    def jobs(self) -> list[JobRecord] | None:
        """Every known job; None when this controller keeps no job registry."""
        ...

    def node_statuses(self, states: Collection[NodeHealState] = ()) -> list[spb.NodeStatus]:
        """One row per node, by id (``states``: only nodes in those lifecycle states)."""
        ...

    def lifecycle(self) -> Mapping[str, LifecycleRecord]:
        """Every node's lifecycle row (a node without one is in service)."""
        ...

    def events(self, node_id: str | None, limit: int) -> list[StoredEventRow]:
        """Stored events, newest first (``node_id``: that node's only)."""
        ...

    def fleet_report(self, window_s: float, settings: ReportSettings | None = None) -> FleetReport:
        """Fault rates, MTBF, MTTR, ETTR, wrongful evictions and lemons over the last ``window_s``
        seconds, by this side's clock (controller.query.fleet; docs/reliability.md)."""
        ...

    def fleet_series(self, window_s: float, buckets: int) -> list[FleetReport]:
        """The fleet report of each of ``buckets`` equal spans of the last ``window_s`` seconds,
        oldest first: the dashboard's plots over time."""
        ...


class IncidentCommands(Protocol):
    """The one change to incidents a person makes through the Admin service (acks are heal's rows)."""

    def resolve_incident(self, incident_id: str, reason: str, actor: str) -> Incident | None:
        """Close an open incident on a person's word; its listeners (the webhook) hear it at once.
        Returns the closed incident, or None when it was not open."""
        ...
