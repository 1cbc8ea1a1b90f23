"""`starpulse scan --prolog | --epilog`: the node verdict as a Slurm prolog or epilog.

The scan runs in a child process under a time limit, so a hung driver or a crash cannot hold
the job: a scan that times out, crashes or could not check (exit 2) never drains (fail
open). An unhealthy verdict drains the node through Slurm with a reason carrying the
starpulse prefix (only starpulse ever resumes it), if the fleet-share guard every other
drain obeys allows it; the prolog then fails, so Slurm requeues the job elsewhere
(``SchedulerParameters=nohold_on_prolog_fail``). The node comes from ``SLURMD_NODENAME``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from typing import Any

from starpulse.app.cli.common import seconds_flag

PROLOG_WINDOW_S = 0.5  # the quick subset: one short sampling window
MAX_REASON = 200


def _child_argv(args: argparse.Namespace, node: str) -> list[str]:
    argv = [sys.executable, "-m", "starpulse.app.cli", "scan", "--json", "--node", node]
    argv += ["--backend", args.backend, "--window", str(min(args.window, PROLOG_WINDOW_S))]
    for flag, value in (("--sysfs-root", args.sysfs_root), ("--kmsg", args.kmsg), ("--expect", args.expect)):
        if value:
            argv += [flag, value]
    for fault in args.sim_fault or ():
        argv += ["--sim-fault", fault]
    if args.backend == "sim":
        argv += ["--seed", str(args.seed)]
    return argv


def reason_for(verdict: dict[str, Any]) -> str:
    """A drain reason a person can act on: the worst conditions, short (Slurm keeps it whole)."""
    parts = [f"{c['rule']} {c['component']}" for c in verdict.get("conditions", [])[:3]]
    parts += list(verdict.get("missing", []))[:2]
    text = (
        "scan " + ("prolog" if verdict.get("phase") == "prolog" else "check") + ": " + "; ".join(parts or ["unhealthy"])
    )
    return text[:MAX_REASON]


async def _drain(node: str, reason: str, max_share: float) -> tuple[bool, str]:
    """Drain through Slurm unless the fleet-share guard refuses; (drained, what happened)."""
    from controller.heal.guards import fleet_share_refusal
    from controller.heal.scheduler import SlurmScheduler

    sched = SlurmScheduler(conf_path=os.environ.get("SLURM_CONF"), timeout_s=5)
    nodes = await sched.list_nodes()
    out = {n.node for n in nodes if n.drained_by_us}
    refusal = fleet_share_refusal(node, out, len(nodes), max_share)
    if refusal is not None:
        return False, refusal
    res = await sched.drain(node, reason)
    return res.ok, res.detail


def run(args: argparse.Namespace) -> int:
    """The prolog/epilog: 0 lets the job run (healthy, or could not check), 1 refuses it."""
    from controller.heal.guards import GuardConfig

    phase = "prolog" if args.prolog else "epilog"
    node = os.environ.get("SLURMD_NODENAME", "")
    if not node:
        print(f"starpulse scan --{phase}: SLURMD_NODENAME is not set: not checking (fail open)", file=sys.stderr)
        return 0
    try:
        proc = subprocess.run(
            _child_argv(args, node), capture_output=True, text=True, timeout=args.timeout, check=False
        )
    except subprocess.TimeoutExpired:
        print(
            f"starpulse scan --{phase}: {node}: scan ran past {args.timeout:g}s: not draining (fail open)",
            file=sys.stderr,
        )
        return 0
    if proc.returncode != 1:
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"starpulse scan --{phase}: {node}: could not check ({last}): not draining", file=sys.stderr)
        return 0
    try:
        verdict = json.loads(proc.stdout)["verdict"]
    except (ValueError, KeyError):
        print(f"starpulse scan --{phase}: {node}: unreadable scan output: not draining", file=sys.stderr)
        return 0
    verdict["phase"] = phase
    reason = reason_for(verdict)
    share = args.max_fleet_share if args.max_fleet_share is not None else GuardConfig().max_fleet_share
    try:
        drained, detail = asyncio.run(_drain(node, reason, share))
    except Exception as exc:  # the scheduler could not be asked: fail open, say why
        print(f"starpulse scan --{phase}: {node}: unhealthy, but Slurm could not be asked: {exc}", file=sys.stderr)
        return 0
    print(
        f"starpulse scan --{phase}: {node}: unhealthy ({reason}); {'drained' if drained else 'not drained'}: {detail}",
        file=sys.stderr,
    )
    return 1 if phase == "prolog" and drained else 0


def add_flags(s: argparse.ArgumentParser) -> None:
    """The scheduler flags of `scan`."""
    g = s.add_mutually_exclusive_group()
    g.add_argument("--prolog", action="store_true", help="run as a Slurm prolog: refuse the job and drain if unhealthy")
    g.add_argument("--epilog", action="store_true", help="run as a Slurm epilog: drain if unhealthy")
    seconds_flag(s, "--timeout", 10.0, "with --prolog/--epilog: seconds before failing open")
    s.add_argument(
        "--max-fleet-share",
        type=float,
        default=None,
        help="with --prolog/--epilog: the fleet-share guard (default: the controller's heal.max_fleet_share default)",
    )
