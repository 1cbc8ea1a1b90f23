"""Who stalled a hung job: ranks grouped by normalised stack (and last collective); the largest
group waits, the others are named; one group, or a tie, names nobody."""

from __future__ import annotations

from typing import Any

from controller.jobs.stacks import group_stacks, normalise, rank_stacks

WAIT = [
    {"name": "wait_for_peers", "file": "train_ranks.py", "line": 52},
    {"name": "main", "file": "train_ranks.py", "line": 120},
    {"name": "<module>", "file": "train_ranks.py", "line": 130},
]
SPIN = [
    {"name": "stuck_in_data_loader", "file": "train_ranks.py", "line": 58},
    {"name": "main", "file": "train_ranks.py", "line": 118},
    {"name": "<module>", "file": "train_ranks.py", "line": 130},
]


def _payload(ranks: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    return {
        "job": "llm",
        "py_spy": True,
        "ranks": [{"rank": r, "pid": 1000 + r, "frames": f} for r, f in ranks.items()],
    }


def test_frames_match_without_line_numbers_or_paths() -> None:
    moved = [{**f, "line": f["line"] + 7, "file": "/other/checkout/" + f["file"]} for f in WAIT]
    assert normalise(WAIT) == normalise(moved) == ("wait_for_peers (train_ranks.py)", "main (train_ranks.py)")


def test_one_odd_rank_out_is_named_with_its_node() -> None:
    stacks = rank_stacks("node-000", _payload({0: WAIT, 1: WAIT})) + rank_stacks(
        "node-001", _payload({2: WAIT, 3: SPIN})
    )
    verdict = group_stacks(stacks)
    assert [(o.rank, o.node) for o in verdict.outliers] == [(3, "node-001")]
    evidence = verdict.to_evidence()
    assert [g["role"] for g in evidence["groups"]] == ["outlier", "waiters"]  # outliers first
    assert evidence["groups"][0]["frames"][0] == "stuck_in_data_loader (train_ranks.py)"


def test_two_suspects_on_two_nodes() -> None:
    stacks = []
    for n in range(4):
        frames = {2 * n: WAIT, 2 * n + 1: SPIN if n in (1, 3) else WAIT}
        stacks += rank_stacks(f"node-00{n}", _payload(frames))
    verdict = group_stacks(stacks)
    assert [(o.rank, o.node) for o in verdict.outliers] == [(3, "node-001"), (7, "node-003")]


def test_every_rank_waiting_in_the_same_place_names_nobody() -> None:
    verdict = group_stacks(rank_stacks("node-000", _payload({0: WAIT, 1: WAIT, 2: WAIT})))
    assert verdict.outliers == [] and "no rank named" in verdict.reason


def test_the_last_collective_splits_ranks_with_the_same_frames() -> None:
    payload = _payload({0: WAIT, 1: WAIT, 2: WAIT})
    for r in payload["ranks"]:
        seq = 42 if r["rank"] != 2 else 41  # rank 2 never entered collective 42
        r["last_collective"] = {"profiling_name": "nccl:all_reduce", "collective_seq_id": seq, "state": "started"}
    verdict = group_stacks(rank_stacks("node-000", payload))
    assert [o.rank for o in verdict.outliers] == [2]


def test_a_tie_names_nobody_and_unread_stacks_are_listed() -> None:
    payload = _payload({0: WAIT, 1: SPIN, 2: []})
    payload["ranks"][2]["error"] = "py-spy exited 1: Permission denied"
    verdict = group_stacks(rank_stacks("node-000", payload))
    assert verdict.outliers == [] and "no group is larger" in verdict.reason
    assert verdict.to_evidence()["unread"] == [
        {"rank": 2, "node": "node-000", "error": "py-spy exited 1: Permission denied"}
    ]


def test_incident_show_prints_the_groups_outliers_first() -> None:
    from starpulse.app.cli.incident import stacks_lines

    stacks = rank_stacks("node-000", _payload({0: WAIT, 1: WAIT})) + rank_stacks(
        "node-001", _payload({2: WAIT, 3: SPIN})
    )
    text = stacks_lines(group_stacks(stacks).to_evidence())
    lines = text.splitlines()
    assert "not there: rank 3 on node-001" in lines[0]
    assert lines[1].split() == ["outlier", "ranks", "3", "on", "node-001"]
    assert lines[2].strip() == "stuck_in_data_loader (train_ranks.py)"
    assert any(line.split()[:2] == ["waiters", "ranks"] for line in lines)


def test_hardware_incidents_on_the_named_nodes_join_the_evidence() -> None:
    from controller.detect.model import Incident
    from controller.jobs.stacks import hardware_on

    def inc(iid: str, kind: str, nodes: list[str]) -> Incident:
        return Incident(iid, kind, nodes[0], "node", nodes, [], "critical", "reboot", [], 1000)

    incidents = [inc("i1", "gpu_fault", ["node-001"]), inc("i2", "nic_fault", ["node-002"]),
                 inc("i3", "job_hang", ["node-001", "node-002"])]  # fmt: skip
    assert [h["id"] for h in hardware_on({"node-001"}, incidents)] == ["i1"]
    assert hardware_on(set(), incidents) == []
