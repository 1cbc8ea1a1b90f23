"""`starpulse scan --prolog` as the Prolog of a real Slurm 22.05 cluster (two slurmd on this host).

gpu02's simulated GPU 0 has a pending row remap (an uncorrectable ECC error); gpu01 is
healthy. A job sent to gpu02 is refused there: the prolog drains gpu02 with a starpulse
reason and fails, and with nohold_on_prolog_fail Slurm requeues the job rather than
holding it. A job sent to gpu01 runs. Skips when Slurm/munge are not installed.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]

PROLOG = """#!/bin/bash
export PYTHONPATH={repo}
export SLURM_CONF={conf}
fault=""
[ "$SLURMD_NODENAME" = gpu02 ] && fault="--sim-fault gpu_ecc_dbe:0"
echo "prolog $SLURMD_NODENAME job $SLURM_JOB_ID" >> {log}
{python} -m starpulse.app.cli scan --prolog --backend sim $fault --timeout 10 2>> {log}
rc=$?
echo "prolog $SLURMD_NODENAME rc=$rc" >> {log}
exit $rc
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[SlurmCluster]:
    prolog = tmp_path / "prolog.sh"
    conf = tmp_path / "slurm" / "slurm.conf"
    with SlurmCluster(
        tmp_path / "slurm",
        nodes=2,
        extra_conf=[f"Prolog={prolog}"],
        scheduler_parameters="sched_interval=1,nohold_on_prolog_fail",
    ) as c:
        # The cluster writes its slurm.conf when it starts; the prolog reads it for scontrol.
        prolog.write_text(PROLOG.format(repo=REPO, conf=c.conf, log=tmp_path / "prolog.log", python=sys.executable))
        prolog.chmod(0o755)
        assert c.conf == conf or c.conf.exists()
        yield c


def wait(cond, timeout: float, what: str, cluster: SlurmCluster, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            prolog = log.read_text() if log.exists() else "(no prolog log)"
            raise AssertionError(f"timed out waiting for {what}\n{prolog}\n{cluster.logs()}")
        time.sleep(0.2)


def node_row(cluster: SlurmCluster, node: str) -> dict[str, str]:
    return next(r for r in cluster.sinfo_rows() if r["node"] == node)


def test_prolog_refuses_a_job_on_an_unhealthy_node_and_accepts_one_on_a_healthy(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    log = tmp_path / "prolog.log"
    bad = cluster.sbatch("#!/bin/bash\nhostname\n", nodelist=["gpu02"], job_name="on-bad", output=tmp_path / "bad.out")
    wait(lambda: "starpulse" in node_row(cluster, "gpu02")["reason"], 60, "gpu02 drained by starpulse", cluster, log)
    row = node_row(cluster, "gpu02")
    assert row["state"].rstrip("*") in {"drained", "draining", "drained*"}, row
    assert row["reason"].startswith("starpulse: scan prolog: "), row
    assert "gpu.remap_pending" in row["reason"] or "gpu.ecc_dbe" in row["reason"], row
    # Refused, not held: the job went back to the queue and never ran to completion on gpu02.
    wait(lambda: cluster.job(bad).get("JobState") == "PENDING", 60, "the refused job requeued", cluster, log)
    job = cluster.job(bad)
    assert job.get("Reason") != "launch_failed_requeued_held" and "held" not in job.get("Reason", "").lower(), job
    assert int(job.get("Restarts", "0")) >= 1 or job.get("BatchHost") in (None, "", "(null)"), job

    good = cluster.sbatch(
        "#!/bin/bash\nhostname\n", nodelist=["gpu01"], job_name="on-good", output=tmp_path / "good.out"
    )
    wait(lambda: cluster.job(good).get("JobState") == "COMPLETED", 60, "the job on gpu01 completed", cluster, log)
    assert node_row(cluster, "gpu01")["state"].rstrip("*") in {"idle", "mixed", "allocated"}
    text = log.read_text()
    assert "prolog gpu01 rc=0" in text and "prolog gpu02 rc=1" in text, text
    assert os.environ.get("SLURMD_NODENAME") is None  # the node came from slurmd's environment, not ours
