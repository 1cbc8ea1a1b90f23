"""The repair loop against real Slurm 22.05: a node starpulse drained comes back, someone else's does not.

Same cluster as test_self_healing_slurm (four slurmd on this host, a 3-node training job
under srun, node-003 the hot spare). Xid 95 (reset the GPU) on node-001: drained by
starpulse, the job requeued onto node-003 and resumed; then the repair loop resets the GPU
through node-001's agent (the simulated reset, agent.sim.repairs: the hardware edge), waits
for the Xid not to come again, runs the node's burn-in diagnostic (a real subprocess under
its limit), resumes node-001 in Slurm (only because the reason is still starpulse's) and
counts it back in the spare pool. node-002, drained by an operator before, is never
touched. A second run with a burn-in that fails climbs the ladder to retirement.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from agent.runtime import Agent
from agent.sim.node import SimNode
from agent.sim.repairs import SimRepairs
from controller.heal.policy import default_policy_path
from controller.heal.states import NodeHealState
from controller.service import Controller
from tests.e2e.test_self_healing_slurm import BATCH, NODES, ROOT, _agent, _controller, _sinfo
from tests.helpers import wait_for
from tests.slurm_cluster import SlurmCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
S = NodeHealState


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[SlurmCluster]:
    with SlurmCluster(tmp_path / "slurm", node_names=NODES) as c:
        yield c


@pytest.fixture
def rebooting_cluster(tmp_path: Path) -> Iterator[SlurmCluster]:
    """The same cluster whose RebootProgram restarts a node's slurmd as after a boot."""
    with SlurmCluster(tmp_path / "slurm", node_names=NODES, reboot_program=True) as c:
        yield c


def _policy(tmp_path: Path, ladder: tuple[str, ...] = ("reset_gpu", "retire")) -> Path:
    doc = yaml.safe_load(default_policy_path().read_text())
    doc["repair"] = {
        "ladders": {"gpu_fault": list(ladder)},
        "timeouts": {"reset_gpu": "20s", "reboot": "60s"},
        "validation": {
            "default": {
                "clear_within": "30s",
                "evidence_quiet": "3s",
                "diagnostics": [{"name": "burn_in", "timeout": "20s", "pass": "regex:0 errors"}],
            }
        },
        "spare_target": 1,
    }
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _repairable(node: str, tmp_path: Path, port: int, sockets: Path, burn_in: str) -> tuple[Agent, SimRepairs]:
    sim = SimNode(node, tmp_path / node / "hw", seed=NODES.index(node))
    agent = _agent(node, tmp_path, port, sockets, sim, {"diagnostic.burn_in": [sys.executable, "-c", burn_in]})
    return agent, SimRepairs(agent, sim)


async def _host_reboots(cluster: SlurmCluster, node: str, repairs: SimRepairs, seen: list[dict[str, str]]) -> None:
    """The rest of a host's reboot: once Slurm's RebootProgram restarted the node's slurmd (its
    boot time moved on), the node's agent comes back too, with a new boot id. ``seen``: the
    node as Slurm showed it once back, before anyone validated it."""
    booted = cluster.boot_time(node)
    await wait_for(lambda: cluster.boot_time(node) != booted, 150, f"{node}'s slurmd restarted by RebootProgram")
    await wait_for(lambda: "down" in _sinfo(cluster, node)["state"], 30, f"{node} back DOWN")
    seen.append(_sinfo(cluster, node))
    await repairs.reboot({"reason": "the host rebooted"})


async def _scenario(
    tmp_path: Path,
    cluster: SlurmCluster,
    burn_in: str,
    ladder: tuple[str, ...] = ("reset_gpu", "retire"),
    seen_after_reboot: list[dict[str, str]] | None = None,
) -> tuple[Controller, dict[str, float]]:
    """Start everything, drain node-002 as an operator, fault node-001, wait out its repair
    (``seen_after_reboot``: a reboot rung is expected; node-001 as Slurm showed it once back)."""
    sockets = tmp_path / "sockets"
    sockets.mkdir()
    ctl = _controller(tmp_path, cluster, _policy(tmp_path, ladder), repair_poke_s=1.0)
    await ctl.start()
    pairs = {n: _repairable(n, tmp_path, ctl.grpc_port, sockets, burn_in) for n in NODES}
    stop = asyncio.Event()
    tasks = [asyncio.create_task(a.run(stop)) for a, _ in pairs.values()]
    if seen_after_reboot is not None:
        tasks.append(asyncio.create_task(_host_reboots(cluster, "node-001", pairs["node-001"][1], seen_after_reboot)))
    ctl._test_cleanup = (stop, tasks)  # type: ignore[attr-defined]
    await wait_for(lambda: len(ctl.registry.nodes) == 4, 30, "four agents")
    # An operator's drain, before anything happens: nobody but the operator may undo it.
    cluster.run("scontrol", "update", "NodeName=node-002", "State=DRAIN", "Reason=bob: fan replacement")
    await wait_for(lambda: "drain" in _sinfo(cluster, "node-002")["state"], 30, "node-002 drained by bob")
    script = BATCH.format(python=sys.executable, train=ROOT / "examples" / "train.py", ck=tmp_path / "ckpt",
                          sockets=sockets)  # fmt: skip
    job = cluster.sbatch(script, nodes=2, nodelist=["node-000", "node-001"], output=tmp_path / "train.out")
    await wait_for(lambda: (r := ctl.jobs.job(job)) is not None and r.last_complete_step >= 10, 60, "checkpoints")
    t0 = time.monotonic()
    pairs["node-001"][1].inject("gpu_xid", "gpu-2", xid=95)
    await wait_for(lambda: "drain" in _sinfo(cluster, "node-001")["state"], 60, "node-001 drained")
    times = {"drained": time.monotonic() - t0}
    assert ctl.healer is not None
    await wait_for(lambda: ctl.healer.store.state("node-001") in (S.SPARE, S.IN_SERVICE, S.RETIRED), 120,
                   "node-001 through its repair")  # fmt: skip
    times["repair_done"] = time.monotonic() - t0
    return ctl, times


async def _stop(ctl: Controller) -> None:
    stop, tasks = ctl._test_cleanup  # type: ignore[attr-defined]
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    await ctl.stop()


class TestRepairOnSlurm:
    @pytest.mark.flaky(reruns=1, reruns_delay=1)
    async def test_reset_validate_resume_back_in_the_pool_and_the_operators_node_untouched(
        self, tmp_path: Path, cluster: SlurmCluster
    ) -> None:
        ctl, times = await _scenario(tmp_path, cluster, "import time; time.sleep(0.5); print('burn-in: 0 errors')")
        try:
            assert ctl.healer is not None
            assert ctl.healer.store.state("node-001") == S.SPARE
            row = _sinfo(cluster, "node-001")
            assert "drain" not in row["state"] and "down" not in row["state"], row  # resumed in Slurm
            assert ctl.healer.spares is not None and "node-001" in ctl.healer.spares.spares()
            assert ctl.healer.spares.is_available("node-001")
            bob = _sinfo(cluster, "node-002")
            assert "drain" in bob["state"] and bob["reason"] == "bob: fan replacement", bob
            assert ctl.healer.store.state("node-002") != S.REPAIRING
            (inc,) = [i for i in ctl.detection.incidents.list_incidents(active_only=False, limit=50)
                      if "node-001" in i.affected_nodes and i.kind == "gpu_fault"]  # fmt: skip
            assert inc.resolved_ms is not None  # on the evidence, long before its hold
            history = ctl.detection.incidents.history(inc.id)
            assert history[-1]["change"] == "resolved" and "repaired and validated" in history[-1]["detail"]["reason"]
            print(
                f"\nslurm repair: fault->drain {times['drained']:.1f} s, "
                f"fault->back in pool {times['repair_done']:.1f} s"
            )
        finally:
            await _stop(ctl)

    async def test_a_reboot_through_slurm_comes_back_down_then_is_validated_and_resumed(
        self, tmp_path: Path, rebooting_cluster: SlurmCluster
    ) -> None:
        """The reboot rung: `scontrol reboot ASAP nextstate=DOWN`, the RebootProgram restarts
        node-001's slurmd as after a boot, the node comes back DOWN with starpulse's reason
        (it takes no job unvalidated); its agent says hello with a new boot id, validation
        passes, and starpulse resumes it, its reason still starpulse's. Bob's node stays his."""
        cluster, seen = rebooting_cluster, []
        ok = "import time; time.sleep(0.5); print('burn-in: 0 errors')"
        ctl, times = await _scenario(tmp_path, cluster, ok, ladder=("reboot", "retire"), seen_after_reboot=seen)
        try:
            assert ctl.healer is not None and ctl.healer.repairs is not None
            assert seen and seen[0]["reason"].startswith("starpulse: reboot for"), seen  # down, ours, unvalidated
            assert ctl.healer.store.state("node-001") == S.SPARE
            row = _sinfo(cluster, "node-001")
            assert "drain" not in row["state"] and "down" not in row["state"], row  # resumed in Slurm
            rep = ctl.healer.repairs.repair("node-001")
            assert rep is not None
            steps = {e["step"]: e for e in rep.evidence}
            assert steps["reboot"]["ok"] and "boot id" in steps["reboot"]["detail"]
            assert steps["diagnostic:burn_in"]["ok"] and steps["return"]["ok"]
            bob = _sinfo(cluster, "node-002")
            assert "drain" in bob["state"] and bob["reason"] == "bob: fan replacement", bob
            print(f"\nslurm reboot repair: fault->drain {times['drained']:.1f} s, "
                  f"fault->back in pool {times['repair_done']:.1f} s")  # fmt: skip
        finally:
            await _stop(ctl)

    async def test_a_failing_burn_in_retires_the_node(self, tmp_path: Path, cluster: SlurmCluster) -> None:
        ctl, _ = await _scenario(tmp_path, cluster, "print('burn-in: 12 errors on GPU 2'); raise SystemExit(1)")
        try:
            assert ctl.healer is not None and ctl.healer.store.state("node-001") == S.RETIRED
            row = _sinfo(cluster, "node-001")
            assert "drain" in row["state"] and row["reason"].startswith("starpulse:"), row  # never resumed
            assert ctl.healer.spares is not None and "node-001" not in ctl.healer.spares.spares()
        finally:
            await _stop(ctl)
