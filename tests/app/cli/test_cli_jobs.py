"""``starpulse jobs``: each job's phase and the time since its last step, in the table and in
``--json`` (64-bit numbers as JSON numbers), read from the Admin service's JobInfo."""

from __future__ import annotations

import json
from typing import Any

import pytest

from starpulse.app import cli
from starpulse.app.cli import query
from starpulse.v1 import service_pb2 as spb


def _jobs() -> spb.JobsResponse:
    hung = spb.JobInfo(job="llm", state="running", nodes=["node-000"], step=40, phase="training",
                       last_step_ms=1_765_000_000_123, since_step_s=42.25)  # fmt: skip
    fresh = spb.JobInfo(job="declared", state="running", nodes=["node-001"])
    return spb.JobsResponse(jobs=[hung, fresh])


@pytest.fixture
def listing(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_call(what: str, args: Any, method: str, request: Any) -> spb.JobsResponse:
        assert method == "ListJobs"
        return _jobs()

    monkeypatch.setattr(query, "admin_call", fake_call)


def run(argv: list[str]) -> int:
    args = cli.build_parser().parse_args(argv)
    return int(args.func(args))


def test_json_has_phase_and_since_step_as_numbers(listing: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["jobs", "--json"]) == 0
    rows = {r["job"]: r for r in json.loads(capsys.readouterr().out)["jobs"]}
    assert rows["llm"]["phase"] == "training"
    assert rows["llm"]["last_step_ms"] == 1_765_000_000_123 and isinstance(rows["llm"]["last_step_ms"], int)
    assert rows["llm"]["since_step_s"] == 42.2 or rows["llm"]["since_step_s"] == 42.3
    assert rows["declared"]["phase"] is None and rows["declared"]["since_step_s"] is None
    assert rows["declared"]["last_step_ms"] is None


def test_table_shows_phase_and_since_step(listing: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["jobs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert header[:5] == ["JOB", "STATE", "PHASE", "STEP", "SINCE"]
    llm = next(line.split() for line in lines if line.startswith("llm"))
    assert llm[2] == "training" and llm[3] == "40" and llm[4] in ("42.2", "42.3")
    declared = next(line.split() for line in lines if line.startswith("declared"))
    assert declared[2] == "-" and declared[4] == "-"
