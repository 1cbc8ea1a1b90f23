"""Hot spares: a health-gated pool, and a topology-aware choice of the replacement.

Why topology: a training job's collectives are tuned to where its ranks sit. A spare on
the same leaves (same block, same rails) keeps the job's traffic on the switches it
already used, so the replacement does not turn a rail-local all-reduce into a
cross-spine one. Preference, best first:

1. same leaves as the evicted node (same block, and so the same rail leaves),
2. same block,
3. same set of rails (a different block, but rail-aligned),
4. the same number of rails,
5. any healthy spare,

ties broken by name, so the choice is deterministic. A spare is eligible only when the
health callback says so, its remediation state is in service (in_service/spare) and it is
not allocated. Allocations live in SQLite, with the spare as primary key, so two
controllers (or one restarted) never hand the same spare to two nodes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from controller.fabric.model import Fabric
from controller.heal.states import AUTOMATIC, NodeHealState, RemediationStore
from controller.store import transaction

log = structlog.get_logger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS heal_spares (
    node TEXT PRIMARY KEY,
    marked_by TEXT NOT NULL,
    marked_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS heal_spare_allocations (
    spare TEXT PRIMARY KEY,
    for_node TEXT NOT NULL,
    job TEXT,
    allocated_ms INTEGER NOT NULL
);
"""

_USABLE = frozenset({NodeHealState.IN_SERVICE, NodeHealState.SPARE})


class SpareError(ValueError):
    """A spare that cannot be allocated (unknown, unhealthy, or already taken)."""


@dataclass(frozen=True)
class SpareStatus:
    """One row of ``starpulse heal spares``."""

    spare: str
    healthy: bool
    allocated_to: str | None
    job: str | None
    block: int | None
    source: str  # "fabric" (declared spare) or "runtime" (marked by a person or the controller)


class SparePool:
    """The spare nodes, their health, and who has them."""

    def __init__(self, fabric: Fabric, is_healthy: Callable[[str], bool], store: RemediationStore) -> None:
        self.fabric = fabric
        self._healthy = is_healthy
        self.store = store
        self._db: sqlite3.Connection = store.conn
        self._db.executescript(_SCHEMA)

    # -- membership --------------------------------------------------------------------------

    def spares(self) -> list[str]:
        """Declared spares plus runtime-marked ones, by name."""
        runtime = [r[0] for r in self._db.execute("SELECT node FROM heal_spares")]
        return sorted(set(self.fabric.spares()) | set(runtime))

    def fleet_nodes(self) -> int:
        """The fleet's compute nodes (the declared spares among them): what a spare share is of."""
        return len(self.fabric.nodes())

    def mark_spare(self, node: str, actor: str = AUTOMATIC) -> None:
        """Add a node to the pool at runtime (a repaired node parked as a spare, say)."""
        if node not in self.fabric or self.fabric.kind(node) != "node":
            raise SpareError(f"{node!r} is not a compute node of the fabric")
        with transaction(self._db):
            self._db.execute(
                "INSERT OR IGNORE INTO heal_spares(node, marked_by, marked_ms) VALUES (?, ?, ?)",
                (node, actor, self.store.clock.time_ms()),
            )
        log.info("heal_spare_marked", node=node, actor=actor)

    def unmark_spare(self, node: str) -> None:
        with transaction(self._db):
            self._db.execute("DELETE FROM heal_spares WHERE node = ?", (node,))

    def allocated_to(self, spare: str) -> tuple[str, str | None] | None:
        """(evicted node, job) the spare stands in for, or None when free."""
        row = self._db.execute("SELECT for_node, job FROM heal_spare_allocations WHERE spare = ?", (spare,)).fetchone()
        return (row[0], row[1]) if row else None

    def is_available(self, spare: str) -> bool:
        return self.allocated_to(spare) is None and self.store.state(spare) in _USABLE and self._is_healthy(spare)

    def _is_healthy(self, node: str) -> bool:
        try:
            return bool(self._healthy(node))
        except Exception as err:  # a broken health source must not crash healing; it gates instead
            log.warning("heal_spare_health_error", node=node, error=str(err))
            return False

    # -- choice ------------------------------------------------------------------------------

    def _leaves(self, node: str) -> frozenset[str]:
        return frozenset(leaf for nic in self.fabric.nics_of(node) if (leaf := self.fabric.leaf_of(nic)))

    def _rails(self, node: str) -> frozenset[int]:
        return frozenset(self.fabric.rail_of(nic) for nic in self.fabric.nics_of(node))

    def rank(self, evicted_node: str, spare: str) -> tuple[bool, bool, bool, bool, str]:
        """Sort key of ``spare`` as a replacement for ``evicted_node``: lower is better."""
        if evicted_node not in self.fabric:
            return (True, True, True, True, spare)
        leaves, rails = self._leaves(evicted_node), self._rails(evicted_node)
        s_rails = self._rails(spare)
        return (
            self._leaves(spare) != leaves,
            self.fabric.block_of(spare) != self.fabric.block_of(evicted_node),
            s_rails != rails,
            len(s_rails) != len(rails),
            spare,
        )

    def choose(self, evicted_node: str) -> str | None:
        """The best available spare for ``evicted_node`` (see module docstring), or None."""
        candidates = [s for s in self.spares() if s != evicted_node and self.is_available(s)]
        if not candidates:
            log.warning("heal_no_spare", for_node=evicted_node)
            return None
        best = min(candidates, key=lambda s: self.rank(evicted_node, s))
        log.info("heal_spare_chosen", for_node=evicted_node, spare=best, rank=self.rank(evicted_node, best)[:4])
        return best

    # -- allocation --------------------------------------------------------------------------

    def allocate(self, spare: str, for_node: str, job: str | None = None) -> None:
        """Hand ``spare`` to stand in for ``for_node``. Idempotent for the same node and job;
        SpareError when it is not a spare, unhealthy, out of service, or taken by another."""
        if spare not in self.spares():
            raise SpareError(f"{spare!r} is not in the spare pool")
        with transaction(self._db):
            held = self.allocated_to(spare)
            if held is not None:
                if held == (for_node, job):
                    return
                raise SpareError(f"{spare} is already allocated to {held[0]} (job {held[1]})")
            if self.store.state(spare) not in _USABLE:
                raise SpareError(f"{spare} is {self.store.state(spare)}, not in service")
            if not self._is_healthy(spare):
                raise SpareError(f"{spare} is not healthy")
            self._db.execute(
                "INSERT INTO heal_spare_allocations(spare, for_node, job, allocated_ms) VALUES (?, ?, ?, ?)",
                (spare, for_node, job, self.store.clock.time_ms()),
            )
        log.info("heal_spare_allocated", spare=spare, for_node=for_node, job=job)

    def release(self, spare: str) -> bool:
        """Return ``spare`` to the pool; True when it was allocated."""
        with transaction(self._db):
            cur = self._db.execute("DELETE FROM heal_spare_allocations WHERE spare = ?", (spare,))
        if cur.rowcount:
            log.info("heal_spare_released", spare=spare)
        return bool(cur.rowcount)

    def counts(self) -> dict[str, int]:
        """Spares by state: available (free, healthy, in service), allocated, unavailable."""
        out = {"available": 0, "allocated": 0, "unavailable": 0}
        for st in self.list():
            out["allocated" if st.allocated_to else "available" if st.healthy else "unavailable"] += 1
        return out

    def list(self) -> list[SpareStatus]:
        """Every spare with its health, allocation and block, by name (for the CLI)."""
        declared = set(self.fabric.spares())
        out: list[SpareStatus] = []
        for s in self.spares():
            held = self.allocated_to(s)
            block = self.fabric.block_of(s) if s in self.fabric else None
            out.append(
                SpareStatus(
                    s,
                    self._is_healthy(s) and self.store.state(s) in _USABLE,
                    held[0] if held else None,
                    held[1] if held else None,
                    block,
                    "fabric" if s in declared else "runtime",
                )
            )
        return out
