"""`starpulse simulate`: months of a fleet's faults through the controller's own decisions, in seconds.

The fault mix (default: Llama 3's interruptions by cause), the fleet (nodes, spares, jobs with
their checkpointing) and the controller's settings and policy files go in; ETTR, MTTR,
interruptions by cause, faults per 1,000 GPU-days, spares used, the time jobs waited for
capacity and breaker trips come out, for one run or for each value of a swept parameter.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starpulse.app.cli.common import JSON_HELP, count_flag, print_json
from starpulse.app.cli.report import duration

# --sweep KEY: what it changes (a SimSettings field, a job's field, or a guard setting).
SWEEPS = {
    "spares": "spare nodes: a count (16) or a share of the working nodes (0.8%)",
    "checkpoint_interval": "each job's checkpoint interval (a duration: 30m)",
    "checkpoint_write": "each job's checkpoint write time",
    "restart_overhead": "each job's restart overhead",
    "budget": "guards.max_evictions_per_window",
    "budget_share": "guards.max_evictions_share (a share of the fleet per window, at least the budget)",
    "fleet_share": "guards.max_fleet_share",
    "rate_scale": "a factor on the mix's rates",
}


class SweepError(ValueError):
    pass


def _days(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of days > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number of days > 0, got {text}")
    return value


def _spares(text: str) -> str:
    """``--spares``: a count of nodes (16) or a share of the working nodes (0.8%), checked here."""
    try:
        spare_count(text, 1)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def spare_count(text: str, nodes: int) -> int:
    """Spare nodes for ``text``: a whole number as it is; a share (``0.8%``) of ``nodes`` as the
    policy's ``spare_share`` counts it (rounded up, at least 1; 0% none)."""
    from controller.heal.ladder import RepairPolicy

    text = text.strip()
    if text.endswith("%"):
        try:
            share = float(text[:-1])
        except ValueError:
            share = -1.0
        if not 0 <= share <= 100:
            raise ValueError(f"must be a share like 0.8%, got {text!r}")
        return RepairPolicy(spare_share_pct=share).spare_target_for(nodes)
    if not text.isdigit():
        raise ValueError(f"must be a whole number >= 0 or a share like 0.8%, got {text!r}")
    return int(text)


def fleet_fraction(text: str) -> float:
    """A share of the fleet as written in a sweep: ``0.03%`` or ``0.0003``, in [0, 1]."""
    text = text.strip()
    value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    if not 0 <= value <= 1:
        raise ValueError(f"must be a share of the fleet like 0.03% or 0.0003, got {text!r}")
    return value


def parse_sweep(text: str) -> tuple[str, list[str]]:
    key, sep, values = text.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or key not in SWEEPS or not values.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=V1,V2,... with KEY one of {', '.join(SWEEPS)}; got {text!r}")
    return key, [v.strip() for v in values.split(",") if v.strip()]


def run(args: argparse.Namespace) -> int:
    """The command's body (imports the controller lazily: `starpulse --help` stays fast)."""
    from starpulse.app.fleetsim.engine import JobSpec, SimSettings, simulate
    from starpulse.core.logs import configure_logging

    configure_logging("error", fmt="console", stream=sys.stderr)  # every remediation logs a warning
    from starpulse.app.fleetsim.mix import MixError, load_mix
    from starpulse.core.schema import ConfigError

    try:
        mix = load_mix(args.mix)
    except MixError as exc:
        print(f"starpulse simulate: --mix {exc}", file=sys.stderr)
        return 2
    try:
        base = _base_config(args)
    except (ConfigError, OSError, ValueError) as exc:
        print(f"starpulse simulate: --config {args.config}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    job_nodes = args.job_nodes or args.nodes
    if job_nodes > args.nodes:
        print(f"starpulse simulate: --job-nodes {job_nodes} exceeds --nodes {args.nodes}", file=sys.stderr)
        return 2
    job = JobSpec("job-0", job_nodes, args.checkpoint_interval, args.checkpoint_write, args.restart_overhead)
    spares = spare_count(args.spares, args.nodes) if args.spares is not None else _policy_spares(base, args.nodes)
    settings = SimSettings(
        nodes=args.nodes, spares=spares, days=args.days, jobs=(job,), gpus_per_node=args.gpus_per_node,
        seed=args.seed, planned=not args.no_planned, manual_s=args.manual,
    )  # fmt: skip
    key, values = args.sweep if args.sweep else ("", [""])
    rows = []
    for value in values:
        try:
            st, cfg = _swept(settings, base, key, value)
        except SweepError as exc:
            print(f"starpulse simulate: --sweep {key}: {exc}", file=sys.stderr)
            return 2
        result = simulate(st, mix, cfg)
        rows.append({"sweep": {key: value} if key else {}, **result.to_dict()})
        if not args.json and not key:
            _print_one(result.to_dict(), mix.source)
    if args.json:
        print_json("simulation", {"mix": mix.source, "runs": rows})
    elif key:
        _print_sweep(key, rows)
    return 0


def _base_config(args: argparse.Namespace) -> Any:
    from controller.heal.scheduler.sim import SimScheduler
    from controller.settings import ControllerConfig, HealSettings
    from starpulse.app.config.controller import load_controller_settings

    base = (
        load_controller_settings(args.config, env={}, connect=False).controller if args.config else ControllerConfig()
    )
    heal = base.heal or HealSettings(SimScheduler([]))
    if args.policy is not None:
        if not Path(args.policy).is_file():
            raise ValueError(f"--policy {args.policy}: no such file")
        from controller.heal.policy import load_policy

        load_policy(args.policy)  # refused here, with the policy loader's message, rather than mid-run
        heal = dataclasses.replace(heal, policy_path=Path(args.policy))
    return dataclasses.replace(base, heal=heal)


def _policy_spares(base: Any, nodes: int) -> int:
    """The spares the policy keeps for ``nodes`` working nodes (its spare_share, or spare_target)."""
    from controller.heal.policy import load_policy

    return int(load_policy(base.heal.policy_path).repair.spare_target_for(nodes))


def _swept(settings: Any, base: Any, key: str, value: str) -> tuple[Any, Any]:
    if not key:
        return settings, base
    try:
        if key == "spares":
            return dataclasses.replace(settings, spares=spare_count(value, settings.nodes)), base
        if key == "rate_scale":
            return dataclasses.replace(settings, rate_scale=float(value)), base
        if key in ("checkpoint_interval", "checkpoint_write", "restart_overhead"):
            field = {"checkpoint_interval": "checkpoint_interval_s", "checkpoint_write": "checkpoint_write_s",
                     "restart_overhead": "restart_overhead_s"}[key]  # fmt: skip
            seconds = duration(value)
            jobs = tuple(dataclasses.replace(j, **{field: seconds}) for j in settings.jobs)
            return dataclasses.replace(settings, jobs=jobs), base
        guards_of: dict[str, tuple[str, Callable[[str], Any]]] = {
            "budget": ("max_evictions_per_window", int),
            "fleet_share": ("max_fleet_share", float),
            "budget_share": ("max_evictions_share", fleet_fraction),
        }
        guard = guards_of[key]
        guards = dataclasses.replace(base.heal.guards, **{guard[0]: guard[1](value)})
        return settings, dataclasses.replace(base, heal=dataclasses.replace(base.heal, guards=guards))
    except (ValueError, argparse.ArgumentTypeError) as exc:
        raise SweepError(f"bad value {value!r}: {exc}") from None


def _h(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:.2f} h"


def _print_one(r: dict[str, Any], source: str) -> None:
    s = r["settings"]
    print(f"simulated {s['days']:g} days: {s['nodes']} nodes + {s['spares']} spares x {s['gpus_per_node']} GPUs; "
          f"mix: {source}")  # fmt: skip
    for j in s["jobs"]:
        print(f"  job {j['name']}: {j['nodes']} nodes, checkpoint every {j['checkpoint_interval_s']:g} s "
              f"(write {j['checkpoint_write_s']:g} s), restart {j['restart_overhead_s']:g} s")  # fmt: skip
    print(f"ETTR {r['ettr']:.4f}; waiting for capacity {100 * r['capacity_wait_share']:.2f} % of job time")
    print(f"faults per 1,000 GPU-days {r['faults_per_1000_gpu_days'] or 0:.3f}; "
          f"MTTR (fault -> node back in pool) {_h(r['mttr_node_back_in_pool_s'])}")  # fmt: skip
    print("faults by cause: " + ", ".join(f"{k} {v}" for k, v in sorted(r["faults_by_cause"].items())))
    by_cause = sorted(r["interruptions_by_cause"].items())
    print("job interruptions by cause: " + ", ".join(f"{k} {v}" for k, v in by_cause))
    print(f"evictions {r['evictions']}, spares used {r['spares_used']}, "
          f"without a spare {r['evictions_without_spare']}, "
          f"breaker trips {r['breaker_trips']}, refused {r['refused'] or 'none'}")  # fmt: skip
    if r.get("repairs"):
        print("repair ladder: " + ", ".join(f"{k} {v}" for k, v in sorted(r["repairs"].items())))
    print(f"({r['wall_s']:.1f} s of real time)")


def _print_sweep(key: str, rows: list[dict[str, Any]]) -> None:
    print(f"{key:>20} {'ETTR':>8} {'WAIT %':>7} {'MTTR H':>7} {'FAULTS/1kGPUd':>14} {'SPARES USED':>11} "
          f"{'NO SPARE':>8} {'TRIPS':>5} {'REFUSED':>7}")  # fmt: skip
    for r in rows:
        mttr = r["mttr_node_back_in_pool_s"]
        print(f"{r['sweep'][key]:>20} {r['ettr']:>8.4f} {100 * r['capacity_wait_share']:>7.2f} "
              f"{(mttr or 0) / 3600:>7.2f} {r['faults_per_1000_gpu_days'] or 0:>14.3f} {r['spares_used']:>11} "
              f"{r['evictions_without_spare']:>8} {r['breaker_trips']:>5} {sum(r['refused'].values()):>7}")  # fmt: skip


def register(sub: Any) -> None:
    """Add `starpulse simulate` to the top-level subparsers."""
    p = sub.add_parser("simulate", help="simulate months of faults through the controller's own decisions")
    count_flag(p, "--nodes", 2048, "working nodes")
    p.add_argument("--spares", type=_spares, default=None, metavar="N|P%",
                   help="spare nodes besides them: a count, or a share of them like 0.8%% (default: the "
                   "policy's spare_share, or its spare_target)")  # fmt: skip
    count_flag(p, "--gpus-per-node", 8, "GPUs per node")
    p.add_argument("--days", type=_days, default=60.0, metavar="D", help="simulated days (default: 60)")
    count_flag(p, "--job-nodes", 0, "the job's nodes; 0: every working node", minimum=0)
    count_flag(p, "--seed", 1, "random seed", minimum=0)
    p.add_argument("--checkpoint-interval", type=duration, default=1800.0, metavar="DURATION",
                   help="compute between two checkpoints (default: 30m)")  # fmt: skip
    p.add_argument("--checkpoint-write", type=duration, default=60.0, metavar="DURATION",
                   help="time to write one checkpoint (default: 60s)")  # fmt: skip
    p.add_argument("--restart-overhead", type=duration, default=600.0, metavar="DURATION",
                   help="from nodes ready to training again (default: 10m)")  # fmt: skip
    p.add_argument("--manual", type=duration, default=3600.0, metavar="DURATION",
                   help="assumption: a person acts on a refused eviction this much later (default: 1h)")  # fmt: skip
    p.add_argument("--mix", default=None, metavar="FILE",
                   help="fault mix file (default: the packaged Llama 3 table, llama3_mix.yaml)")  # fmt: skip
    p.add_argument("--no-planned", action="store_true", help="leave out the mix's planned interruptions")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="the controller's settings file (guards, breaker, heal timings, policy path)")  # fmt: skip
    p.add_argument("--policy", default=None, metavar="FILE", help="the controller's remediation policy file")
    p.add_argument("--sweep", type=parse_sweep, default=None, metavar="KEY=V1,V2",
                   help=f"one run per value; KEY: {', '.join(SWEEPS)}")  # fmt: skip
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(func=run)
