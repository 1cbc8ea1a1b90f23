"""Simulated clusters: `starpulse scenario run` and `starpulse demo`."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from starpulse.app.cli.common import JSON_HELP, address, count_flag, print_json, readable_path, seconds_flag
from starpulse.app.cli.progress import timed


def cmd_scenario_run(args: argparse.Namespace) -> int:
    from starpulse.app.scenario.runner import run_scenario
    from starpulse.app.scenario.spec import ScenarioError, load_scenario

    try:
        scenario = load_scenario(args.file)
    except (ScenarioError, OSError) as exc:
        print(f"starpulse scenario run: {exc}", file=sys.stderr)
        return 2
    label = f"scenario {scenario.name}: {len(scenario.faults)} fault(s)"
    verdict = asyncio.run(timed(run_scenario(scenario), label, scenario.duration_s))
    if args.json:
        print_json("scenario-verdict", verdict)
    else:
        _print_verdict(verdict)
    return 0 if verdict["expectations"]["passed"] else 1


def _print_verdict(verdict: dict[str, Any]) -> None:
    print(f"scenario {verdict['scenario']} ({verdict['duration_s']:g} s)")
    for f in verdict["faults"]:
        found = f"-> {f['incident']} after {f['detection_latency_s']:.1f} s" if f["incident"] else "-> NOT DETECTED"
        print(f"  fault {f['kind']:<22} {f['target']:<28} at {f['at_s']:>5.1f} s {found}")
    for i in verdict["incidents"]:
        resolved = "open" if i["resolved_at_s"] is None else f"resolved {i['resolved_at_s']:.1f} s"
        print(
            f"  {i['id']} {i['kind']:<13} {i['root_cause'] or '(network)':<30} {i['severity']:>8} "
            f"{len(i['affected_nodes']):>3} nodes  opened {i['opened_at_s']:.1f} s, {resolved}"
        )
    for e in verdict.get("evictions", []):
        instead = f", {e['replacement']} stands in" if e["replacement"] else ", no spare stood in"
        dry = " (dry run: nothing moved)" if e["dry_run"] else ""
        print(f"  evicted {e['node']} at {e['at_s']:.1f} s for {e['incident']}{instead}{dry}")
    for j in verdict.get("jobs", []):
        resumed = f"resumed from step {j['resumed_from_step']}" if j["resumed_from_step"] else "not resumed"
        print(
            f"  job {j['name']}: {j['restarts']} restart{'' if j['restarts'] == 1 else 's'}, "
            f"{j['steps_lost']} steps lost, {j['downtime_s']:.1f} s down, {resumed}"
        )
    if verdict.get("breaker_open"):
        print("  circuit breaker OPEN: automatic remediation stopped (starpulse breaker status)")
    exp = verdict["expectations"]
    if exp["checked"]:
        print("expectations: " + ("passed" if exp["passed"] else "FAILED: " + "; ".join(exp["failures"])))


def cmd_demo(args: argparse.Namespace) -> int:
    from starpulse.app.demo import run_demo
    from starpulse.core.listen import ListenError

    try:
        return run_demo(nodes=args.nodes, duration_s=args.duration, http=args.http, listen=args.listen)
    except ListenError as exc:  # the dashboard's port taken (8080 often is): say which flag moves it
        flag = {"server.http": "--http", "server.listen": "--listen"}.get(exc.what, exc.what)
        print(f"starpulse demo: {flag} {exc.address}: {exc.reason}", file=sys.stderr)
        return 2


def register(sub: Any) -> None:
    """Add this group's commands to the top-level subparsers."""
    sc = sub.add_parser("scenario", help="run fault scenarios on a simulated cluster")
    scsub = sc.add_subparsers(dest="scenario_command", required=True)
    scr = scsub.add_parser("run", help="run one scenario file and print its verdict")
    scr.add_argument("file", type=readable_path)
    scr.add_argument("--json", action="store_true", help=JSON_HELP)
    scr.set_defaults(func=cmd_scenario_run)

    d = sub.add_parser("demo", help="a controller and simulated agents on loopback, with faults")
    count_flag(d, "--nodes", 16, "simulated nodes")
    seconds_flag(d, "--duration", 0.0, "seconds to run, 0: until Ctrl-C", above=False)
    d.add_argument(
        "--listen",
        type=address,
        default="127.0.0.1:0",
        metavar="HOST:PORT",
        help="controller gRPC address (default: a free port)",
    )
    d.add_argument(
        "--http",
        type=address,
        default="127.0.0.1:8080",
        metavar="HOST:PORT",
        help="dashboard address (default: 127.0.0.1:8080)",
    )
    d.set_defaults(func=cmd_demo)
