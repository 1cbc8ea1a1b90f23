"""SimScheduler (in memory) and ExecScheduler (real hook scripts in a temp dir)."""

from __future__ import annotations

import json
import os
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest

from controller.heal.scheduler import ExecScheduler, Scheduler, SimScheduler, SlurmScheduler
from controller.heal.scheduler.base import ActionResult, SchedulerError, sanitize_reason, validate_job_id
from controller.heal.scheduler.slurm import expand_hostlist
from starpulse.core.names import InvalidName

ROOT = Path(__file__).resolve().parents[4]
T = TypeVar("T")


def test_backends_implement_the_protocol() -> None:
    for backend in (SimScheduler(), ExecScheduler({}), SlurmScheduler()):
        assert isinstance(backend, Scheduler)


def test_reason_and_name_checks() -> None:
    assert sanitize_reason("xid 79\nState=DOWN\x00 \t GPU3") == "xid 79 State=DOWN GPU3"
    assert len(sanitize_reason("y" * 500)) == 120
    assert sanitize_reason("") == "unspecified"
    assert validate_job_id("12345") == "12345"
    for bad in ("", "-rf", "1;2", "a b", "$(id)"):
        with pytest.raises(InvalidName):
            validate_job_id(bad)


def test_expand_hostlist() -> None:
    assert expand_hostlist("gpu[01,03-04]") == ["gpu01", "gpu03", "gpu04"]
    assert expand_hostlist("gpu01,cpu[9-10]") == ["gpu01", "cpu9", "cpu10"]
    assert expand_hostlist("(null)") == []


# -- sim ---------------------------------------------------------------------------
def without_suspending(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to its end in one step; fail if it ever yields to the loop (a sleep or a wait)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    coro.close()
    raise AssertionError("the coroutine suspended: it slept or waited")


async def test_sim_drain_resume_and_foreign_drain() -> None:
    s = SimScheduler(["gpu01", "gpu02", "gpu03", "gpu04"])
    s.add_job("7", ["gpu01", "gpu02", "gpu03"])
    assert (await s.drain("gpu02", "xid 79")).ok
    st = await s.node_status("gpu02")
    assert (st.state, st.reason, st.drained_by_us, st.jobs) == ("draining", "starpulse: xid 79", True, ["7"])
    assert "already drained by us" in (await s.drain("gpu02", "again")).detail
    s.drain_external("gpu04", "ops: PSU swap")
    res = await s.resume("gpu04", "x")
    assert not res.ok and res.permanent
    assert (await s.resume("gpu01", "not drained")).ok
    bad = await s.drain("gpu01;reboot", "x")
    assert not bad.ok and bad.permanent
    with pytest.raises(SchedulerError):
        await s.node_status("gpu99")


async def test_sim_requeue_moves_job_to_spare_deterministically() -> None:
    s = SimScheduler(["gpu01", "gpu02", "gpu03", "gpu04", "gpu05"])
    s.add_job("7", ["gpu01", "gpu02", "gpu03"])
    await s.drain("gpu02", "xid 79")
    res = without_suspending(s.requeue("7", exclude=["gpu02"], prefer=["gpu05"]))  # no sleeps, no waits
    assert res.ok and await s.job_nodes("7") == ["gpu01", "gpu03", "gpu05"]
    assert s.jobs["7"].restarts == 1
    assert (await s.node_status("gpu02")).state == "drained"
    again = await s.requeue("7", exclude=["gpu02"], prefer=["gpu05"])
    assert "already running" in again.detail and s.jobs["7"].restarts == 1
    # no spare left: falls back to free nodes, then pending
    await s.drain("gpu05", "ecc")
    assert (await s.requeue("7", exclude=["gpu05"], prefer=[])).ok
    assert await s.job_nodes("7") == ["gpu01", "gpu03", "gpu04"]
    await s.drain("gpu04", "ecc")
    res = await s.requeue("7", exclude=["gpu04"], prefer=[])
    assert "pending" in res.detail and s.jobs["7"].state == "pending"
    assert (await s.signal_job("7", "USR1")).permanent  # not running
    busy = ActionResult.temporary("busy")
    s.inject_failure("drain", "gpu01", busy)
    assert await s.drain("gpu01", "x") is busy
    assert [a[0] for a in s.actions].count("requeue") == 3


async def test_sim_a_pending_job_starts_when_a_node_comes_back() -> None:
    """The pool empty, the job waits in the queue; the repaired node's resume starts it (no job stays down)."""
    s = SimScheduler(["gpu01", "gpu02", "gpu03"])
    s.add_job("7", ["gpu01", "gpu02", "gpu03"])
    await s.drain("gpu02", "xid 79")
    res = await s.requeue("7", exclude=["gpu02"], prefer=[])
    assert "waiting for capacity" in res.detail and s.jobs["7"].state == "pending"
    back = await s.resume("gpu02", "repaired")
    assert "started pending 7" in back.detail
    assert s.jobs["7"].state == "running" and await s.job_nodes("7") == ["gpu01", "gpu02", "gpu03"]


async def test_sim_a_job_that_allows_fewer_nodes_is_requeued_on_fewer() -> None:
    s = SimScheduler(["gpu01", "gpu02", "gpu03", "gpu04"])
    s.add_job("elastic", ["gpu01", "gpu02", "gpu03", "gpu04"], min_nodes=3)
    await s.drain("gpu04", "xid 79")
    res = await s.requeue("elastic", exclude=["gpu04"], prefer=[])
    assert res.ok and "fewer nodes: 3 of 4 (it allows 3)" in res.detail
    assert s.jobs["elastic"].state == "running" and await s.job_nodes("elastic") == ["gpu01", "gpu02", "gpu03"]
    await s.drain("gpu03", "ecc")
    res = await s.requeue("elastic", exclude=["gpu03"], prefer=[])
    assert s.jobs["elastic"].state == "pending" and "needs 3 free nodes, 2 free" in res.detail
    with pytest.raises(ValueError, match=r"min_nodes of job x must be 1\.\.2"):
        s.add_job("x", ["gpu01", "gpu02"], min_nodes=3)


async def test_sim_signal() -> None:
    s = SimScheduler()
    s.add_job("9", ["gpu01"])
    assert (await s.signal_job("9", "SIGUSR1")).ok and s.jobs["9"].signals == ["USR1"]
    assert (await s.signal_job("9", "SEGV")).permanent


# -- exec --------------------------------------------------------------------------
HOOK = """#!/bin/sh
printf '%s|' "$@" >> "{log}"; echo "$STARPULSE_ACTION $STARPULSE_NODE $STARPULSE_JOB $STARPULSE_EXCLUDE" >> "{log}"
case "$1" in
  node_status) [ "$2" = gpu09 ] && echo '{{"state": "drained", "reason": "ops", "drained_by_us": false}}' \
               || echo '{{"state": "drained", "reason": "starpulse: x", "drained_by_us": true, "jobs": ["7"]}}'
               exit 0 ;;
  job_nodes) echo "gpu01 gpu02"; exit 0 ;;
  list_nodes) echo '[{{"node": "gpu01", "state": "idle"}}]'; exit 0 ;;
  drain) [ "$2" = gpu05 ] && exit 75; [ "$2" = gpu06 ] && exit 3; [ "$2" = gpu07 ] && sleep 5 ;;
esac
echo "did $1"
"""


@pytest.fixture
def hook(tmp_path: Path) -> tuple[Path, Path]:
    log = tmp_path / "calls.log"
    script = tmp_path / "hook.sh"
    script.write_text(HOOK.format(log=log))
    script.chmod(0o755)
    return script, log


async def test_exec_hooks_argv_env_and_exit_codes(hook: tuple[Path, Path]) -> None:
    script, log = hook
    hooks = {
        a: [str(script)]
        for a in ("cordon", "drain", "resume", "requeue", "signal_job", "node_status", "job_nodes", "list_nodes")
    }
    ex = ExecScheduler(hooks, timeout_s=1.0)
    res = await ex.drain("gpu01", "xid 79\n; rm -rf /")
    assert res.ok and res.detail == "did drain"
    assert log.read_text().splitlines()[0].rstrip() == "drain|gpu01|xid 79 ; rm -rf /|drain gpu01"
    tmp = await ex.drain("gpu05", "x")
    assert not tmp.ok and not tmp.permanent  # 75 = EX_TEMPFAIL
    perm = await ex.drain("gpu06", "x")
    assert not perm.ok and perm.permanent
    slow = await ex.drain("gpu07", "x")
    assert not slow.ok and not slow.permanent and "timed out" in slow.detail
    assert (await ex.requeue("7", ["gpu02"], ["gpu04"])).ok
    assert "requeue  7 gpu02" in log.read_text()
    assert (await ex.signal_job("7", "USR1")).ok
    st = await ex.node_status("gpu01")
    assert (st.state, st.drained_by_us, st.jobs) == ("drained", True, ["7"])
    assert await ex.job_nodes("7") == ["gpu01", "gpu02"]
    assert [n.node for n in await ex.list_nodes()] == ["gpu01"]
    refused = await ex.resume("gpu09", "x")  # node_status hook says someone else drained it
    assert not refused.ok and refused.permanent
    assert (await ex.resume("gpu01", "ok")).ok
    n_calls = len(log.read_text().splitlines())
    assert (await ex.drain("gpu01 x", "y")).permanent
    assert len(log.read_text().splitlines()) == n_calls  # never ran


async def test_exec_missing_hook_and_missing_script(tmp_path: Path) -> None:
    ex = ExecScheduler({"drain": [str(tmp_path / "nope.sh")]})
    res = await ex.drain("gpu01", "x")
    assert not res.ok and res.permanent
    res = await ex.cordon("gpu01", "x")
    assert not res.ok and res.permanent and "no hook" in res.detail
    with pytest.raises(ValueError):
        ExecScheduler({"reboot": ["/bin/true"]})


async def test_example_drain_hook(tmp_path: Path) -> None:
    script = ROOT / "deploy" / "hooks" / "example-drain.sh"
    log = tmp_path / "hooks.log"
    ex = ExecScheduler(
        {"drain": [str(script)]}, env={"STARPULSE_HOOK_LOG": str(log), "STARPULSE_HOOK_LOCK": str(tmp_path / "lock")}
    )
    res = await ex.drain("gpu03", "nvlink 'down'")
    assert res.ok, res
    assert log.read_text().split(" ", 1)[1] == "drain gpu03 nvlink 'down'\n"
    (tmp_path / "lock").touch()
    res = await ex.drain("gpu03", "x")
    assert not res.ok and not res.permanent
    assert os.access(script, os.X_OK)
    assert json.dumps(res.detail)
