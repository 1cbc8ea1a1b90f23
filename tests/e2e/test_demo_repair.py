"""The demo's repair story, short (CI): real agents on simulated hardware, real training
ranks (starpulse.app.train, shipped in the package, through each node's job socket), the
in-memory scheduler.

Two tests on a 4+1-node cluster, each ending once its faults were followed through and the
cluster settled:

- two drawn faults: each evicted node comes back (repaired by the simulated GPU reset or
  reboot, validated by its agent's real burn-in subprocess) or is retired, never stays in
  repair; the job runs at the end, resumed from its checkpoints, and the pool is at target;
- a seeded run: a leaf switch down, a bad board, a second GPU fault while the pool is
  empty: one switch incident and no eviction for it, the empty pool said (the alert, the
  job waiting for capacity), the bad board climbing its ladder to retirement with an RMA
  notice, and the job running again once the second node is back.

The 10-minute unattended run is bench/demo_repair.py (not run in CI).
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import time
from pathlib import Path

import pytest

from controller.query.fleet import fleet_report
from starpulse.app.demo import _demo
from starpulse.app.demo_faults import ScriptedFault

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _summary(out: str) -> str:
    assert "demo over" in out, out[-3000:]
    return out[out.index("demo over") :]


async def test_two_faults_followed_through_to_a_settled_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await asyncio.wait_for(_demo(4, 170.0, "127.0.0.1:0", "127.0.0.1:0", tmp_path, max_faults=2), 200)
    out = capsys.readouterr().out
    injected = re.findall(r"inject (\w+)", out)
    assert len(injected) == 2, out[-3000:]
    evicted = re.findall(r"healer: evicted (node-\d+)", out)
    assert evicted, out[-3000:]
    ended = re.findall(r"repair: (node-\d+) -> (spare|in_service|retired)", out)
    assert sorted(n for n, _ in ended) == sorted(evicted), out[-3000:]  # every evicted node came back or retired
    assert any(o in ("spare", "in_service") for _, o in ended)
    summary = _summary(out)
    found = re.search(r"spare pool: (\d+) available of target (\d+)", summary)
    assert found is not None, summary
    available, target = map(int, found.groups())
    assert available >= target, summary
    assert "repairing" not in summary and "validating" not in summary and "evicted" not in summary, summary
    # The job trained for real: it runs at the end, each fault's resume timed, ETTR stated.
    running = re.search(r"job demo-train: running at step \d+, (\d+) restarts?", summary)
    assert running, summary
    resumes = re.findall(r"fault \d+ \(.*\): resumed after ([\d.]+)s from step (\d+)", summary)
    # Every interruption resumed. Two evictions close together (the second before the first
    # resume, on a loaded machine) are one interruption and one restart, never more restarts.
    assert 1 <= len(resumes) == int(running.group(1)) <= len(evicted), summary
    assert all(int(step) > 0 for _, step in resumes), summary  # from a checkpoint, not from scratch
    ettr = re.search(r"ETTR ([\d.]+)%", summary)
    assert ettr is not None and 0 < float(ettr.group(1)) <= 100, summary
    assert "ETTR = productive training time / wall time" in summary
    # Each evicted node's ladder, as it happened: onto its rung, the repair's result, the
    # validation's checks, and back in the pool.
    for node in evicted:
        steps = re.findall(rf"ladder: {node} (\S+) (ok|failed)", out)
        assert any(s in ("reset_gpu", "reboot") for s, _ in steps), out[-3000:]
        assert {"scan", "evidence_quiet", "diagnostic:burn_in"} <= {s for s, _ in steps}, out[-3000:]
        assert re.search(rf"ladder: {node} evicted -> repairing \((reset_gpu|reboot): rung", out), out[-3000:]
        assert re.search(rf"ladder: {node} validating -> (spare|in_service|retired)", out), out[-3000:]
    # It ends with what `starpulse report` gives for the same history.
    figures = summary[summary.index("the same run as `starpulse report") :]
    with sqlite3.connect(tmp_path / "controller.db") as conn:
        report = fleet_report(conn, 0, int(time.time() * 1000) + 1)
    faults = re.search(r"faults: (\d+)  per 1,000 GPU-days", figures)
    assert faults is not None and int(faults.group(1)) == report.faults >= 1, figures
    job = re.search(r"demo-train +\d+ GPUs  ETTR ([\d.]+)\S*  (\d+) interruption", figures)
    (figured,) = [j for j in report.jobs if j.job == "demo-train"]
    assert job is not None and int(job.group(2)) == figured.interruptions >= 1, figures
    evictions = re.search(r"evictions: (\d+), wrongful", figures)
    assert evictions is not None and int(evictions.group(1)) == report.evictions == len(evicted), figures


async def test_seeded_run_switch_fault_empty_pool_and_a_retirement(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = [
        ScriptedFault("switch_down", node="node-000"),
        ScriptedFault("gpu_xid", node="node-000", index=2, params={"xid": 95}, after_s=12.0),
        ScriptedFault("gpu_xid", node="node-001", index=5, params={"xid": 95}, after_s=6.0),
    ]
    run = _demo(4, 200.0, "127.0.0.1:0", "127.0.0.1:0", tmp_path, script=script, bad_boards=frozenset({"node-000"}))
    await asyncio.wait_for(run, 230)
    out = capsys.readouterr().out
    # The leaf: one switch incident, alert only, and no node evicted for it.
    assert re.search(r"inject switch_down on leaf-\S+ \((\d+) cables down at once\)", out), out[-3000:]
    assert len(re.findall(r"healer: inc-\d+ switch fault at .*: alert only", out)) == 1, out[-4000:]
    assert sorted(re.findall(r"healer: evicted (node-\d+)", out)) == ["node-000", "node-001"], out[-4000:]
    # The pool ran dry: said as an alert, and the second job's eviction waited for capacity.
    assert "alert: spare pool empty (0 of target 1): StarpulseSparePoolEmpty" in out, out[-4000:]
    second = re.search(r"healer: evicted node-001, jobs \[demo-train\]: no spare free; (.*)", out)
    assert second is not None and "waiting for capacity" in second.group(1), out[-4000:]
    # The bad board failed validation after the reset and after the reboot: retired, with an RMA notice.
    retired = re.search(r"repair: node-000 -> retired \(RMA notice: out for hardware inspection\): (.*)", out)
    assert retired is not None and "burn_in" in retired.group(1), out[-4000:]
    assert re.search(r"repair: node-001 -> (spare|in_service)", out), out[-4000:]
    summary = _summary(out)
    assert "retired: 1" in summary and "retired 1" in summary, summary
    assert re.search(r"job demo-train: running at step \d+", summary), summary  # nobody's job stays down
