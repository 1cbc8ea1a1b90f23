"""Self-healing end to end against real Slurm 22.05 (slurmctld and four slurmd on this host).

A 3-node training job (examples/train.py under srun, one rank per node, each rank
reporting to its node's starpulse agent and checkpointing) runs on node-000..node-002;
node-003 is the fabric's hot spare. A GPU fault is injected through node-001's agent
(its simulated NVML and kernel log). The controller detects it, drains node-001 in
Slurm with a reason, requeues the job onto the spare, and the job resumes from its last
complete checkpoint. Also: a leaf-switch incident drains nothing, and a mass failure
opens the circuit breaker instead of draining. Skips when Slurm/munge are not installed.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.factory import build_agent
from agent.runtime import Agent, AgentConfig
from agent.sim.node import SimNode
from controller.detect.correlate import CorrelationConfig
from controller.detect.model import Incident
from controller.detect.pipeline import DetectionConfig
from controller.fabric import generate_fabric
from controller.heal.healer import HealConfig
from controller.heal.scheduler import SlurmScheduler
from controller.service import Controller, ControllerConfig, HealSettings
from starpulse.core.clock import SYSTEM_CLOCK
from tests.helpers import free_port, wait_for
from tests.slurm_cluster import SlurmCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
NODES = ["node-000", "node-001", "node-002", "node-003"]

BATCH = """#!/bin/bash
srun --kill-on-bad-exit=0 bash -c 'exec {python} {train} --job "$SLURM_JOB_ID" --steps 3000 \\
    --step-time 0.1 --checkpoint-dir {ck} --checkpoint-every 10 --socket {sockets}/"$SLURMD_NODENAME".sock'
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[SlurmCluster]:
    with SlurmCluster(tmp_path / "slurm", node_names=NODES) as c:
        yield c


def _controller(
    tmp_path: Path, cluster: SlurmCluster, policy_path: Path | None = None, repair_poke_s: float = 5.0
) -> Controller:
    """The controller over the four Slurm nodes (``policy_path``: another policy file, the repair tests')."""
    fabric = generate_fabric(nodes=3, gpus_per_node=8, rails=8, nodes_per_block=4, spines=1, spares=1)
    assert fabric.nodes() == NODES and fabric.spares() == ["node-003"]
    return Controller(
        ControllerConfig(
            listen=f"127.0.0.1:{free_port()}",
            http="127.0.0.1:0",
            db_path=tmp_path / "controller.db",
            fabric=fabric,
            sweep_interval_s=0.2,
            detection=DetectionConfig(correlation=CorrelationConfig(settle_s=1.0)),
            heal=HealSettings(
                scheduler=SlurmScheduler(conf_path=cluster.conf, timeout_s=15),
                policy_path=policy_path,
                heal=HealConfig(checkpoint_timeout_s=5.0, retry_delay_s=0.5, repair_poke_s=repair_poke_s),
            ),
        ),
        clock=SYSTEM_CLOCK,
    )


def _agent(
    node: str,
    tmp_path: Path,
    port: int,
    sockets: Path,
    sim: SimNode | None = None,
    allowed_commands: dict[str, list[str]] | None = None,
) -> Agent:
    agent = build_agent(
        AgentConfig(
            node_id=node,
            controllers=[f"127.0.0.1:{port}"],
            interval_s=0.5,
            buffer_path=str(tmp_path / node / "buffer.db"),
            job_socket=str(sockets / f"{node}.sock"),
            allowed_commands=allowed_commands or {},
        ),
        "sim",
        sim=sim or SimNode(node, tmp_path / node / "hw", seed=NODES.index(node)),
    )
    agent.link.backoff.initial_s = 0.1
    return agent


def _sinfo(cluster: SlurmCluster, node: str) -> dict[str, str]:
    return next(r for r in cluster.sinfo_rows() if r["node"] == node)


class TestSelfHealingOnSlurm:
    # Real Slurm and real time: once, in a loaded parallel run, the resume step was not confirmed
    # within 30 s (issue 16 note).
    @pytest.mark.flaky(reruns=2, reruns_delay=1)
    async def test_gpu_fault_drains_requeues_onto_spare_and_resumes_from_checkpoint(
        self, tmp_path: Path, cluster: SlurmCluster
    ) -> None:
        """Xid 79 on node-001: drained with a reason, job requeued on node-003, resumed from its checkpoint."""
        sockets = tmp_path / "sockets"
        sockets.mkdir()
        ctl = _controller(tmp_path, cluster)
        await ctl.start()
        agents = {n: _agent(n, tmp_path, ctl.grpc_port, sockets) for n in NODES}
        stop = asyncio.Event()
        tasks = [asyncio.create_task(a.run(stop)) for a in agents.values()]
        out = tmp_path / "train.out"
        try:
            await wait_for(lambda: len(ctl.registry.nodes) == 4, 30, "four agents")
            script = BATCH.format(
                python=sys.executable, train=ROOT / "examples" / "train.py", ck=tmp_path / "ckpt", sockets=sockets
            )
            job = cluster.sbatch(script, nodes=3, nodelist=NODES[:3], output=out)

            def progress() -> int:
                record = ctl.jobs.job(job)
                return 0 if record is None else record.last_complete_step

            await wait_for(lambda: progress() >= 20, 60, "the job's first complete checkpoints")
            assert sorted(ctl.jobs.nodes_of(job)) == NODES[:3]

            t_fault = time.monotonic()
            _inject_xid79(agents["node-001"])
            await wait_for(lambda: "drain" in _sinfo(cluster, "node-001")["state"], 60, "node-001 drained")
            t_drain = time.monotonic()
            row = _sinfo(cluster, "node-001")
            assert row["reason"].startswith("starpulse:") and "gpu_fault" in row["reason"], row

            def resumed_lines() -> list[int]:
                text = out.read_text() if out.exists() else ""
                return [int(m) for m in re.findall(r"^resumed from step (\d+)", text, re.M)]

            await wait_for(lambda: len(resumed_lines()) >= 3, 90, "three ranks resumed after the requeue")
            t_resumed = time.monotonic()
            resumed = resumed_lines()

            def confirmed() -> bool:  # the ranks' next reports carry the step they resumed from
                rec = ctl.jobs.job(job)
                return rec is not None and rec.resumed_from_step == min(resumed)

            await wait_for(confirmed, 30, "the registry to confirm the resume step from the job's reports")
            record = ctl.jobs.job(job)
            assert record is not None and record.restarts == 1
            assert min(resumed) >= 20
            squeue = [r for r in cluster.squeue_rows() if str(r.get("job_id")) == job]
            nodes = str(squeue[0].get("nodes", "")) if squeue else ""
            assert "node-003" in nodes or "003" in nodes, squeue
            evictions = ctl.healer.evictions if ctl.healer else []
            assert [(e.node, e.replacement) for e in evictions] == [("node-001", "node-003")]
            print(
                f"\nslurm self-healing: fault->drain {t_drain - t_fault:.1f} s, "
                f"fault->resumed {t_resumed - t_fault:.1f} s, resumed from step {min(resumed)}, "
                f"steps lost {record.steps_lost}"
            )
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            await ctl.stop()

    async def test_leaf_fault_drains_nothing_and_mass_failure_opens_the_breaker(
        self, tmp_path: Path, cluster: SlurmCluster
    ) -> None:
        """A switch incident never drains; GPU faults on 3 of 4 nodes at once open the breaker, no drain."""
        ctl = _controller(tmp_path, cluster)
        assert ctl.healer is not None
        healer = ctl.healer
        now = int(time.time() * 1000)
        leaf = Incident(
            "inc-l", "switch_fault", "leaf-b0-r3", "switch", NODES[:3], [], "critical", "investigate_switch", [], now
        )
        await healer.handle(leaf)
        gpu_faults = [
            Incident(f"inc-g{i}", "gpu_fault", f"{n}/gpu-0", "gpu", [n], [], "critical", "reset_gpu", [], now)
            for i, n in enumerate(NODES[:3])
        ]
        ctl.detection.correlator.incidents = lambda active_only=True, limit=100: gpu_faults  # type: ignore[method-assign]
        for incident in gpu_faults:
            healer.guards.observe(gpu_faults, 4)
            await healer.handle(incident)
        assert healer.guards.breaker.is_open
        states = {r["node"]: r["state"] for r in cluster.sinfo_rows()}
        assert all("drain" not in s for s in states.values()), states
        assert healer.evictions == []
        assert [d["outcome"] for d in healer.decisions] == [
            "alert_only",
            "breaker_open",
            "breaker_open",
            "breaker_open",
        ]
        ctl.store.close()


def _inject_xid79(agent: Agent) -> None:
    """Fault at the hardware edge: the simulated node's NVML and kernel log report Xid 79 on GPU 2."""
    sim = agent._before_collect.__self__  # type: ignore[union-attr]  # SimNode.advance is bound to the sim
    sim.inject("gpu_xid", "gpu-2", xid=79)
