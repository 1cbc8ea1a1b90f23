"""Hot spares: topology-aware choice, health gate, persisted allocations."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from controller.fabric.generate import generate_fabric
from controller.fabric.model import Fabric
from controller.heal.spares import SpareError, SparePool
from controller.heal.states import NodeHealState, RemediationStore
from starpulse.core.clock import FakeClock


@pytest.fixture(scope="module")
def fabric() -> Fabric:
    # 18 nodes + 4 spares, 10 per block: node-018/019 are spares in block 1, node-020/021 in block 2
    return generate_fabric(18, gpus_per_node=2, rails=2, nodes_per_block=10, spines=1, spares=4)


def pool(db: Path, fabric: Fabric, unhealthy: frozenset[str] = frozenset()) -> SparePool:
    store = RemediationStore(sqlite3.connect(str(db), isolation_level=None), FakeClock(1_000))
    return SparePool(fabric, lambda n: n not in unhealthy, store)


def test_fabric_spares(fabric: Fabric) -> None:
    assert fabric.spares() == ["node-018", "node-019", "node-020", "node-021"]
    assert [fabric.block_of(s) for s in fabric.spares()] == [1, 1, 2, 2]


def test_same_block_preferred(tmp_path: Path, fabric: Fabric) -> None:
    p = pool(tmp_path / "c.db", fabric)
    assert p.choose("node-012") == "node-018"  # block 1: same leaves
    p.allocate("node-018", "node-012", "job-1")
    assert p.choose("node-013") == "node-019"  # still block 1
    p.allocate("node-019", "node-013", "job-1")
    assert p.choose("node-014") == "node-020"  # block 1 exhausted: next by rails, then name


def test_rank_orders_leaves_block_rails(tmp_path: Path, fabric: Fabric) -> None:
    p = pool(tmp_path / "c.db", fabric)
    assert p.rank("node-012", "node-018") < p.rank("node-012", "node-020")
    assert p.rank("node-012", "node-018")[:4] == (False, False, False, False)
    assert p.rank("node-012", "node-020")[:4] == (True, True, False, False)
    # a node outside the fabric gets any spare, by name
    assert p.choose("ghost-1") == "node-018"


def test_runtime_marked_spare_in_same_block_wins(tmp_path: Path, fabric: Fabric) -> None:
    p = pool(tmp_path / "c.db", fabric)
    assert p.choose("node-003") == "node-018"  # nothing in block 0
    p.mark_spare("node-009", actor="alice")
    assert p.choose("node-003") == "node-009"
    assert {s.spare: s.source for s in p.list()}["node-009"] == "runtime"
    p.unmark_spare("node-009")
    assert p.choose("node-003") == "node-018"
    with pytest.raises(SpareError):
        p.mark_spare("leaf-b0-r0")


def test_health_gate(tmp_path: Path, fabric: Fabric) -> None:
    p = pool(tmp_path / "c.db", fabric, unhealthy=frozenset({"node-018"}))
    assert p.choose("node-012") == "node-019"
    with pytest.raises(SpareError, match="not healthy"):
        p.allocate("node-018", "node-012")
    # a spare that is itself out of service is not eligible either
    p.store.transition("node-019", NodeHealState.CORDONED, "xid", "inc-1")
    assert p.choose("node-012") == "node-020"
    with pytest.raises(SpareError, match="not in service"):
        p.allocate("node-019", "node-012")


def test_broken_health_source_gates(tmp_path: Path, fabric: Fabric) -> None:
    store = RemediationStore(sqlite3.connect(str(tmp_path / "c.db"), isolation_level=None), FakeClock(1_000))

    def boom(node: str) -> bool:
        raise RuntimeError("prometheus down")

    assert SparePool(fabric, boom, store).choose("node-012") is None


def test_no_spare_left(tmp_path: Path, fabric: Fabric) -> None:
    p = pool(tmp_path / "c.db", fabric)
    for i, s in enumerate(fabric.spares()):
        p.allocate(s, f"node-00{i}")
    assert p.choose("node-012") is None


def test_no_double_allocation_across_reopen(tmp_path: Path, fabric: Fabric) -> None:
    db = tmp_path / "c.db"
    a = pool(db, fabric)
    a.allocate("node-018", "node-012", "job-7")
    a.allocate("node-018", "node-012", "job-7")  # idempotent
    a.store.conn.close()

    b = pool(db, fabric)
    assert b.allocated_to("node-018") == ("node-012", "job-7")
    with pytest.raises(SpareError, match="already allocated to node-012"):
        b.allocate("node-018", "node-013", "job-8")
    assert b.choose("node-013") == "node-019"
    assert b.release("node-018")
    assert not b.release("node-018")
    b.allocate("node-018", "node-013", "job-8")


def test_allocate_requires_a_spare(tmp_path: Path, fabric: Fabric) -> None:
    with pytest.raises(SpareError, match="not in the spare pool"):
        pool(tmp_path / "c.db", fabric).allocate("node-001", "node-002")


def test_list_for_cli(tmp_path: Path, fabric: Fabric) -> None:
    p = pool(tmp_path / "c.db", fabric, unhealthy=frozenset({"node-021"}))
    p.allocate("node-018", "node-012", "job-1")
    rows = {s.spare: s for s in p.list()}
    assert list(rows) == ["node-018", "node-019", "node-020", "node-021"]
    assert (rows["node-018"].allocated_to, rows["node-018"].job, rows["node-018"].block) == ("node-012", "job-1", 1)
    assert rows["node-019"].healthy and rows["node-019"].allocated_to is None
    assert not rows["node-021"].healthy and rows["node-021"].source == "fabric"


def test_same_rails_preferred_over_name(tmp_path: Path) -> None:
    fab = generate_fabric(18, gpus_per_node=2, rails=2, nodes_per_block=10, spines=1, spares=4)
    fab.graph.nodes["node-020/nic-1"]["rail"] = 5  # node-020 is no longer rail-aligned with the fleet
    fab.reindex()
    p = pool(tmp_path / "c.db", fab)
    p.allocate("node-018", "x")
    p.allocate("node-019", "y")
    assert p.choose("node-003") == "node-021"
    assert p.rank("node-003", "node-020")[:4] == (True, True, True, False)
