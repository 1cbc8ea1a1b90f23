"""SlurmScheduler against real Slurm 22.05: slurmctld and four slurmd (gpu01..gpu04) on this host.

The "training" job is a 3-node batch job (gpu01-03, gpu04 is the spare). Its batch shell
runs on the first node and writes a checkpoint file every second (step number, written to
a temp name then renamed so a checkpoint is always complete); on start it resumes from
the newest checkpoint and prints SLURM_RESTART_COUNT. The test drains gpu02, requeues the
job excluding it and preferring gpu04, and checks the job runs again on gpu01,03,04 and
resumed from its last checkpoint. Skips when Slurm/munge are not installed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.heal.scheduler import SlurmScheduler
from controller.heal.scheduler.base import SchedulerError
from tests.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow

TRAIN = """#!/bin/bash
CK={ck}/ckpt
step=0
latest=$(ls $CK.* 2>/dev/null | sort -t. -k2 -n | tail -1)
[ -n "$latest" ] && step=$(cat "$latest")
trap 'echo "checkpoint-signal step=$step"' USR1
echo "start node=$SLURMD_NODENAME nodes=$SLURM_JOB_NODELIST restart=${{SLURM_RESTART_COUNT:-0}} from=$step"
while [ $step -lt 90 ]; do
  step=$((step+1)); echo $step > $CK.tmp; mv $CK.tmp $CK.$step
  sleep 1
done
echo "finished step=$step"
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[SlurmCluster]:
    with SlurmCluster(tmp_path, nodes=4) as c:
        yield c


@pytest.fixture
def sched(cluster: SlurmCluster) -> SlurmScheduler:
    return SlurmScheduler(conf_path=cluster.conf, timeout_s=15)


def row(cluster: SlurmCluster, node: str) -> dict[str, str]:
    return next(r for r in cluster.sinfo_rows() if r["node"] == node)


async def wait_until(cond, timeout: float, what: str) -> None:  # noqa: ASYNC109
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def test_drain_with_reason_then_resume(cluster: SlurmCluster, sched: SlurmScheduler) -> None:
    res = await sched.drain("gpu02", "xid 79 on GPU3 (fell off the bus)")
    assert res.ok, res
    r = row(cluster, "gpu02")
    assert r["state"] in {"drained", "draining"}
    assert r["reason"] == "starpulse: xid 79 on GPU3 (fell off the bus)"
    st = await sched.node_status("gpu02")
    assert (st.state, st.drained_by_us) == ("drained", True)
    assert (await sched.drain("gpu02", "again")).ok  # idempotent, reason kept
    assert row(cluster, "gpu02")["reason"].endswith("(fell off the bus)")

    res = await sched.resume("gpu02", "burn-in passed")
    assert res.ok, res
    # "idle*": after RESUME slurmctld marks the node not-responding until its next ping.
    assert row(cluster, "gpu02")["state"].rstrip("*") == "idle"
    assert (await sched.resume("gpu02", "again")).ok
    assert (await sched.node_status("gpu02")).drained_by_us is None
    assert {s.node for s in await sched.list_nodes()} == {"gpu01", "gpu02", "gpu03", "gpu04"}


async def test_someone_elses_drain_is_not_resumed(cluster: SlurmCluster, sched: SlurmScheduler) -> None:
    cluster.run("scontrol", "update", "NodeName=gpu03", "State=DRAIN", "Reason=ops: PSU swap")
    st = await sched.node_status("gpu03")
    assert (st.state, st.drained_by_us, st.reason) == ("drained", False, "ops: PSU swap")
    res = await sched.resume("gpu03", "looks healthy")
    assert not res.ok and res.permanent and "someone else" in res.detail
    res = await sched.drain("gpu03", "xid 48")
    assert res.ok and "someone else" in res.detail
    assert row(cluster, "gpu03") == {"node": "gpu03", "state": "drained", "reason": "ops: PSU swap"}


async def test_names_validated_and_reason_is_one_argument(cluster: SlurmCluster, sched: SlurmScheduler) -> None:
    res = await sched.drain("gpu01 State=DOWN", "x")
    assert not res.ok and res.permanent
    res = await sched.drain("gpu04", "nvlink\nState=DOWN Reason=pwned \x1b[31m")
    assert res.ok, res
    r = row(cluster, "gpu04")
    assert r["state"] == "drained"  # not down: the newline did not start a new argument
    assert r["reason"] == "starpulse: nvlink State=DOWN Reason=pwned [31m"
    res = await sched.resume("nosuchnode", "x")
    assert not res.ok and res.permanent
    assert not (await sched.requeue("12; rm -rf /", [], [])).ok
    with pytest.raises(SchedulerError):
        await sched.job_nodes("999999")


async def test_requeue_onto_spare_resumes_from_checkpoint(
    cluster: SlurmCluster, sched: SlurmScheduler, tmp_path: Path
) -> None:
    ck = tmp_path / "ckpt"
    ck.mkdir()
    out = tmp_path / "train.out"
    job = cluster.sbatch(TRAIN.format(ck=ck), nodes=3, nodelist=["gpu01", "gpu02", "gpu03"], output=out)

    def steps() -> int:
        return max((int(p.suffix[1:]) for p in ck.glob("ckpt.[0-9]*")), default=0)

    await wait_until(lambda: steps() >= 3, 30, "three checkpoints")
    assert await sched.job_nodes(job) == ["gpu01", "gpu02", "gpu03"]
    assert (await sched.signal_job(job, "USR1")).ok
    await wait_until(lambda: "checkpoint-signal" in out.read_text(), 10, "USR1 reached the batch script")

    t0 = time.monotonic()
    assert (await sched.drain("gpu02", "xid 79 GPU fell off the bus")).ok
    draining = row(cluster, "gpu02")
    last_step = steps()
    res = await sched.requeue(job, exclude=["gpu02"], prefer=["gpu04"])
    assert res.ok, res
    await wait_until(lambda: cluster.job(job).get("JobState") == "RUNNING", 30, "job running again")
    elapsed = time.monotonic() - t0
    await wait_until(lambda: "restart=1" in out.read_text(), 10, "restarted run's output")

    print(f"\nslurm drain -> job running again on the spare: {elapsed:.2f} s ({res.detail})")
    print(f"sinfo while draining: {draining}; after: {row(cluster, 'gpu02')}")
    print(out.read_text())
    assert draining["state"] == "draining" and draining["reason"] == "starpulse: xid 79 GPU fell off the bus"
    reason = "starpulse: xid 79 GPU fell off the bus"
    assert row(cluster, "gpu02") == {"node": "gpu02", "state": "drained", "reason": reason}
    assert await sched.job_nodes(job) == ["gpu01", "gpu03", "gpu04"]
    starts = [ln for ln in out.read_text().splitlines() if ln.startswith("start ")]
    assert len(starts) == 2
    resumed_from = int(starts[1].rsplit("from=", 1)[1])
    assert resumed_from >= last_step - 1 and resumed_from > 0, (resumed_from, last_step)
    assert "restart=1" in starts[1] and "nodes=gpu[01,03-04]" in starts[1]
    assert cluster.job(job)["Restarts"] == "1"

    again = await sched.requeue(job, exclude=["gpu02"], prefer=["gpu04"])
    assert again.ok and "already running" in again.detail
    assert cluster.job(job)["Restarts"] == "1"
    st = await sched.node_status("gpu04")
    assert st.state == "allocated" and job in st.jobs


async def test_reboot_comes_back_down_with_our_reason_and_only_our_reason_is_resumed(tmp_path: Path) -> None:
    """`scontrol reboot ASAP nextstate=DOWN`: the cluster's RebootProgram restarts that node's
    slurmd as after a boot (its boot time moves on); the node comes back DOWN, unvalidated,
    with starpulse's reason, and takes no job until starpulse resumes it, which it does only
    while that reason is still starpulse's. A node someone else drained is never rebooted."""
    with SlurmCluster(tmp_path, nodes=3, reboot_program=True) as cluster:
        sched = SlurmScheduler(conf_path=cluster.conf, timeout_s=15)
        assert (await sched.drain("gpu01", "xid 79 (inc-1)")).ok
        booted = cluster.boot_time("gpu01")
        asked = await sched.reboot("gpu01", "reboot for inc-1")
        assert asked.ok and "starpulse: reboot for inc-1" in asked.detail
        await wait_until(lambda: cluster.boot_time("gpu01") != booted, 30, "gpu01's new boot time")
        await wait_until(lambda: row(cluster, "gpu01")["state"] == "down", 30, "gpu01 back DOWN")
        status = await sched.node_status("gpu01")
        assert status.state == "down" and status.drained_by_us and status.reason.startswith("starpulse:")
        assert (await sched.resume("gpu01", "repaired and validated (inc-1)")).ok  # validated: ours to resume
        await wait_until(lambda: row(cluster, "gpu01")["state"] == "idle", 30, "gpu01 idle")

        # Rebooted for starpulse, then taken over by an operator while down: left to them.
        booted = cluster.boot_time("gpu02")
        assert (await sched.drain("gpu02", "nvlink down (inc-2)")).ok
        assert (await sched.reboot("gpu02", "reboot for inc-2")).ok
        await wait_until(lambda: cluster.boot_time("gpu02") != booted, 30, "gpu02's new boot time")
        await wait_until(lambda: row(cluster, "gpu02")["state"] == "down", 30, "gpu02 back DOWN")
        cluster.run("scontrol", "update", "NodeName=gpu02", "State=DRAIN", "Reason=ops: keep for the vendor")
        refused = await sched.resume("gpu02", "repaired and validated (inc-2)")
        assert not refused.ok and "ops: keep for the vendor" in row(cluster, "gpu02")["reason"]

        cluster.run("scontrol", "update", "NodeName=gpu03", "State=DRAIN", "Reason=maintenance by bob")
        booted = cluster.boot_time("gpu03")
        assert not (await sched.reboot("gpu03", "reboot for inc-3")).ok
        assert cluster.boot_time("gpu03") == booted and row(cluster, "gpu03")["reason"] == "maintenance by bob"
