"""Per job, how its GPUs on one node look in one report: the least busy and the hungriest.

Read where the report is decoded (in detection, or in its shard), so only these few numbers
travel to the jobs floor, where ``controller.jobs.stall`` judges a job across its nodes.
A GPU belongs to a job when one of its compute processes does (``Report.gpu_processes``,
the job as the scheduler names it); processes of no known job are left out.
"""

from __future__ import annotations

from starpulse.v1 import telemetry_pb2 as tpb


def job_gpu_signature(report: tpb.Report) -> dict[str, tuple[float, float]]:
    """job -> (lowest utilisation %, highest power as a fraction of its limit) over the job's GPUs.

    A GPU without a utilisation or a power reading (or without a limit) is left out; a job
    none of whose GPUs has both is left out (absent means unknown, never 0).
    """
    if not report.gpu_processes:
        return {}
    gpus = {g.index: g for g in report.gpus}
    by_job: dict[str, set[int]] = {}
    for p in report.gpu_processes:
        if p.job:
            by_job.setdefault(p.job, set()).add(p.gpu_index)
    out: dict[str, tuple[float, float]] = {}
    for job, indexes in by_job.items():
        utils: list[float] = []
        powers: list[float] = []
        for i in indexes:
            g = gpus.get(i)
            if g is None or not (g.HasField("utilization_gpu_pct") and g.HasField("power_w")):
                continue
            if not g.HasField("power_limit_w") or g.power_limit_w <= 0:
                continue
            utils.append(g.utilization_gpu_pct)
            powers.append(g.power_w / g.power_limit_w)
        if utils:
            out[job] = (min(utils), max(powers))
    return out
