"""The leader's answers: open incidents, the topology, jobs and presence from its in-memory state.

Everything else (the incident list as written, history, timeline, acks, lifecycle, events)
is the same SQLite read a standby makes (``StoreQueries``), on the leader's own connection.
"""

from __future__ import annotations

from collections.abc import Iterable

from controller.detect.model import Incident
from controller.detect.pipeline import Detection
from controller.fabric import Fabric
from controller.ingest.registry import NodeRegistry
from controller.jobs.registry import JobRecord, JobRegistry
from controller.query.nodes import NodeRow
from controller.query.store import StoreQueries
from controller.query.surface import TopologyView
from controller.store import Store


class LiveQueries(StoreQueries):
    """``Queries`` on a running controller: detection's correlator and topology, the registries."""

    def __init__(self, store: Store, detection: Detection, registry: NodeRegistry, jobs: JobRegistry | None) -> None:
        super().__init__(store, registry.clock, detection.fabric)
        self._detection = detection
        self._registry = registry
        self._jobs = jobs

    def open_incidents(self, limit: int = 100) -> list[Incident]:
        return self._detection.correlator.incidents(active_only=True, limit=limit)

    def incident(self, incident_id: str) -> Incident | None:
        return self._detection.correlator.get(incident_id)

    def fabric(self) -> Fabric | None:
        return self._detection.fabric

    def topology(self) -> TopologyView | None:
        fabric = self._detection.fabric
        tracker = self._detection.topology
        probes = self._detection.probes
        return TopologyView(
            fabric.summary() if fabric is not None else {},
            tracker.report,
            tracker.nodes_reporting,
            probe_worst=tuple(probes.worst()) if probes is not None else (),
            probe_health=probes.fabric_health if probes is not None else {},
        )

    def jobs(self) -> list[JobRecord] | None:
        return self._jobs.jobs() if self._jobs is not None else None

    def nodes(self) -> Iterable[NodeRow]:
        return self._registry.nodes.values()


class LiveIncidentCommands:
    """``IncidentCommands`` on a running controller: through detection's correlator."""

    def __init__(self, detection: Detection) -> None:
        self._detection = detection

    def resolve_incident(self, incident_id: str, reason: str, actor: str) -> Incident | None:
        closed = self._detection.correlator.resolve_on_evidence(incident_id, reason, actor)
        self._detection.tick()  # tell the listeners (the webhook) now, not at the next sweep
        return closed
