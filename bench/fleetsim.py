"""The fleet simulator measured (issue 28): the Llama 3 mix at 16,384 GPUs for 60 days, the
agreement with Kokolis et al.'s closed form and the Young/Daly optimum, sweeps of spares and of
the checkpoint interval, and the simulator's speed.

    python -m bench.fleetsim            # everything (about 10 minutes on 2 cores)
    python -m bench.fleetsim --quick    # the literature check only (about 2 minutes)

Measured, not asserted (the short versions are tests/app/fleetsim/test_fleetsim.py); figures go to
bench/README.md ("Fleet reliability, simulated").
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import quiet_logging, write_result
from controller.heal.guards import GuardConfig
from controller.heal.scheduler.sim import SimScheduler
from controller.settings import ControllerConfig, HealSettings
from starpulse.app.fleetsim.engine import JobSpec, SimSettings, simulate
from starpulse.app.fleetsim.mix import Mix, load_mix
from starpulse.core.logs import configure_logging

NAME = "fleetsim"
GENEROUS = GuardConfig(max_evictions_per_window=100_000, max_fleet_share=1.0)


def one_cause_mix(folder: Path, per_node_day: float, repair_h: float = 0.5, gpus_per_node: int = 8) -> Mix:
    """A single GPU-fault cause at a given rate per node-day: the closed form's one r_f."""
    path = folder / f"mix-{per_node_day}.yaml"
    path.write_text(
        f"source: one cause, {per_node_day}/node-day\ndays: 100\ngpus: {1000 * gpus_per_node}\ncauses:\n"
        f"  - {{name: xid79, cause: gpu, count: {round(per_node_day * 100 * 1000)}, rule: gpu.xid.reboot, "
        f"component: gpu, repair_h: {repair_h}, repair_source: bench}}\n"
    )
    return load_mix(path)


def closed_form(n: int, r_per_s: float, u0: float, dt: float, w: float) -> float:
    """Kokolis et al.: E[ETTR] ~ (1 - N r_f (u0 + dt/2)) / (1 + w/dt)."""
    return (1 - n * r_per_s * (u0 + dt / 2)) / (1 + w / dt)


def literature(folder: Path) -> dict[str, Any]:
    """Three settings against the closed form; a Δt sweep against sqrt(2w / (N r_f))."""
    base = ControllerConfig(heal=HealSettings(SimScheduler([]), guards=GENEROUS))
    cfg = base.detection.correlation
    window = min(cfg.node_window_s, cfg.settle_s)
    settings = [  # (nodes, failures per node-day, dt, w, u0)
        (32, 0.4, 1800.0, 60.0, 600.0),
        (64, 0.2, 900.0, 30.0, 300.0),
        (16, 0.5, 3600.0, 120.0, 120.0),
    ]
    rows = []
    for nodes, rate, dt, w, u0 in settings:
        mix = one_cause_mix(folder, rate)
        job = JobSpec("job", nodes, dt, w, u0)
        r = simulate(SimSettings(nodes, 16, 60.0, (job,), planned=False, seed=5), mix, base)
        expected = closed_form(nodes, rate / 86400, u0 + window, dt, w)
        lost, lost_expected = 1 - r.ettr, 1 - expected
        rows.append({"nodes": nodes, "r_f_per_node_day": rate, "dt_s": dt, "w_s": w, "u0_s": u0,
                     "interruptions": r.jobs["job"]["interruptions"], "sim_ettr": r.ettr, "closed_form_ettr": expected,
                     "sim_lost": lost, "closed_form_lost": lost_expected,
                     "lost_rel_err": (lost - lost_expected) / lost_expected})  # fmt: skip
    nodes, rate, w, u0 = 32, 0.4, 60.0, 300.0
    best = math.sqrt(2 * w / (nodes * rate / 86400))
    sweep = []
    mix = one_cause_mix(folder, rate)
    for factor in (0.25, 0.5, 1.0, 2.0, 4.0):
        dt = best * factor
        r = simulate(
            SimSettings(nodes, 16, 60.0, (JobSpec("job", nodes, dt, w, u0),), planned=False, seed=9), mix, base
        )
        sweep.append({"dt_s": dt, "factor": factor, "sim_ettr": r.ettr,
                      "closed_form_ettr": closed_form(nodes, rate / 86400, u0 + window, dt, w)})  # fmt: skip
    return {"closed_form": rows, "young_daly": {"best_s": best, "sweep": sweep}}


def llama(days: float = 60.0) -> dict[str, Any]:
    """The default policy and guards on the Llama 3 mix at 16,384 GPUs; sweeps of spares and Δt."""
    mix = load_mix()
    job = JobSpec("llm", 2048, 1800.0, 60.0, 600.0)  # the command's defaults: checkpoint every 30 min, 60 s write,
    # 10 min restart
    settings = SimSettings(2048, 16, days, (job,))
    started = time.perf_counter()
    default = simulate(settings, mix).to_dict()
    default["total_s"] = time.perf_counter() - started
    spares = {}
    for n in (0, 8, 32):
        spares[n] = _brief(simulate(dataclasses.replace(settings, spares=n), mix).to_dict())
    spares[16] = _brief(default)
    intervals = {}
    for minutes in (10, 60):
        job_dt = dataclasses.replace(job, checkpoint_interval_s=minutes * 60.0)
        intervals[minutes] = _brief(simulate(dataclasses.replace(settings, jobs=(job_dt,)), mix).to_dict())
    intervals[30] = _brief(default)
    return {"default": default, "sweep_spares": spares, "sweep_checkpoint_min": intervals,
            "input_rate_per_1000_gpu_days": 1000 * mix.rate_per_gpu_day()}  # fmt: skip


def _brief(r: dict[str, Any]) -> dict[str, Any]:
    keys = ("ettr", "capacity_wait_share", "mttr_node_back_in_pool_s", "faults_per_1000_gpu_days", "evictions",
            "spares_used", "evictions_without_spare", "breaker_trips", "refused", "repairs", "wall_s")  # fmt: skip
    return {k: r[k] for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the literature check only")
    parser.add_argument("--skip-literature", action="store_true", help="the Llama 3 runs only")
    args = parser.parse_args()
    quiet_logging()
    configure_logging("error")  # every remediation logs a warning: the simulator's speed must not include them
    with tempfile.TemporaryDirectory() as folder:
        lit = literature(Path(folder)) if not args.skip_literature else {"closed_form": [], "young_daly": {}}
    print("closed form (Kokolis et al.) vs simulated lost time 1 - ETTR:")
    for r in lit["closed_form"]:
        print(f"  N={r['nodes']:>3} r_f={r['r_f_per_node_day']}/node-day dt={r['dt_s']:g}s w={r['w_s']:g}s "
              f"u0={r['u0_s']:g}s: {r['interruptions']} interruptions, sim {r['sim_lost']:.4f} vs "
              f"{r['closed_form_lost']:.4f} ({100 * r['lost_rel_err']:+.1f} %)")  # fmt: skip
    yd = lit["young_daly"]
    if yd:
        print(f"Young/Daly: sqrt(2w/(N r_f)) = {yd['best_s']:.0f} s")
    for r in yd.get("sweep", []):
        print(f"  dt {r['dt_s']:>6.0f} s (x{r['factor']:g}): sim ETTR {r['sim_ettr']:.4f}, "
              f"closed form {r['closed_form_ettr']:.4f}")  # fmt: skip
    figures: dict[str, Any] = {"literature": lit}
    if not args.quick:
        figures["llama3"] = ll = llama()
        d = ll["default"]
        print(f"Llama 3 mix, 16,384 GPUs, 60 days, default policy: ETTR {d['ettr']:.4f}, "
              f"MTTR to pool {d['mttr_node_back_in_pool_s'] / 3600:.1f} h, "
              f"{d['faults_per_1000_gpu_days']:.3f} faults per 1,000 GPU-days "
              f"(input {ll['input_rate_per_1000_gpu_days']:.3f}), run {d['wall_s']:.1f} s "
              f"(with set-up {d['total_s']:.1f} s)")  # fmt: skip
        print(f"  repair ladder: {d.get('repairs')}")
        for name in ("sweep_spares", "sweep_checkpoint_min"):
            for k, r in sorted(ll[name].items()):
                print(f"  {name} {k}: ETTR {r['ettr']:.4f}, waiting {100 * r['capacity_wait_share']:.2f} %, "
                      f"MTTR to pool {(r['mttr_node_back_in_pool_s'] or 0) / 3600:.1f} h, "
                      f"spares used {r['spares_used']}, without a spare {r['evictions_without_spare']}, "
                      f"trips {r['breaker_trips']}, refused {r['refused']}")  # fmt: skip
    path = write_result(NAME, {"quick": args.quick, "skip_literature": args.skip_literature}, figures)
    print(f"written {path}")


if __name__ == "__main__":
    main()
