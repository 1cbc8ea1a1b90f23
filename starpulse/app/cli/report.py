"""`starpulse report`: the fleet's reliability in numbers, for the monthly fleet review.

Fault rates per 1,000 GPU-days and node-days by cause, MTBF, MTTR, ETTR per job and for the
fleet, steps and GPU-hours lost, wrongful evictions and lemon nodes, from the controller's
GetFleetReport (definitions: docs/reliability.md). Text, ``--json`` or ``--csv``.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from typing import Any

from starpulse.app.cli.common import JSON_HELP, add_client_flags, print_json, query_stub, rpc
from starpulse.core.units import BadValue, parse_quantity


def duration(text: str) -> float:
    """An argparse type: a positive duration as written in settings ('30d', '12h', '90m')."""
    try:
        q = parse_quantity(text, ("time",))
    except BadValue as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if q.value <= 0:
        raise argparse.ArgumentTypeError(f"must be longer than 0, got {text!r}")
    return q.value


def cmd_report(args: argparse.Namespace) -> int:
    from starpulse.v1 import service_pb2 as spb

    request = spb.FleetReportRequest(
        since_s=int(args.since), clean_s=args.clean, lemon_faults=args.lemon_faults, lemon_window_s=args.lemon_window
    )
    resp = rpc("report", args, query_stub(args), "GetFleetReport", request, 30)
    if resp is None:
        return 2
    report = json.loads(resp.report_json)
    if args.json:
        print_json("fleet-report", report)
    elif args.csv:
        write_csv(report, sys.stdout)
    else:
        print_text(report)
    return 0


def _f(value: float | None, digits: int = 2, unit: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def _h(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:.2f} h"


def report_lines(r: dict[str, Any]) -> list[str]:
    """The text report, one line each (`starpulse report`, and the end of `starpulse demo`)."""
    out: list[str] = []
    w, fleet, faults = r["window"], r["fleet"], r["faults"]
    out.append(f"fleet report: {w['days']:.1f} days, {fleet['node_days']:.1f} node-days, "
               f"{fleet['gpu_days']:.1f} GPU-days "
               f"({fleet['nodes_in_service']} nodes, {fleet['gpus_in_service']} GPUs in service now)")  # fmt: skip
    out.append(f"faults: {faults['total']}  per 1,000 GPU-days {_f(faults['per_1000_gpu_days'], 3)}  "
               f"per 1,000 node-days {_f(faults['per_1000_node_days'], 3)}")  # fmt: skip
    for cause, c in faults["by_cause"].items():
        if c["count"]:
            out.append(f"  {cause:<13} {c['count']:>6}  {_f(c['per_1000_gpu_days'], 3):>8} /1k GPU-days  "
                       f"{_f(c['per_1000_node_days'], 3):>8} /1k node-days")  # fmt: skip
    out.append(f"MTBF: fleet {_f(r['mtbf_h']['fleet'])} h, per node {_f(r['mtbf_h']['node'], 1)} h")
    pool, job = r["mttr"]["fault_to_node_back_in_pool"], r["mttr"]["fault_to_job_resumed"]
    out.append(f"MTTR fault -> node back in pool: mean {_h(pool['mean_s'])}, median {_h(pool['median_s'])} "
               f"({pool['count']} returned, {pool['still_out']} still out)")  # fmt: skip
    out.append(f"MTTR fault -> job resumed: mean {_h(job['mean_s'])}, median {_h(job['median_s'])} ({job['count']})")
    out.append(f"ETTR fleet: {_f(r['ettr']['fleet'], 4)}; lost {r['lost']['steps']} steps, "
               f"{r['lost']['gpu_hours']:.1f} GPU-hours")  # fmt: skip
    for j in r["ettr"]["jobs"]:
        bound = " (upper bound)" if j["ettr_is_upper_bound"] else ""
        out.append(f"  {j['job']:<20} {j['gpus']:>6} GPUs  ETTR {_f(j['ettr'], 4)}{bound}  "
                       f"{j['interruptions']} interruption(s)  down {_h(j['downtime_s'])}  "
                       f"lost {j['steps_lost']} steps {j['gpu_hours_lost']:.1f} GPU-h  [{j['basis']}]")  # fmt: skip
    ev = r["evictions"]
    out.append(f"evictions: {ev['total']}, wrongful {ev['wrongful']} (clean {ev['clean_s'] / 86400:g} d after return; "
               f"{ev['pending']} pending, {ev['unknown']} unknown)")  # fmt: skip
    val = r.get("validation")
    if val is not None:  # a controller from before issue 28's leftovers has no such section
        out.append(f"validation: {val['returns']} validated return(s), {val['false_successes']} false success(es) "
                   f"(failed again, same cause, within {val['window_s'] / 3600:g} h: share {_f(val['share'], 3)}; "
                   f"{val['pending']} pending)")  # fmt: skip
    lem = r["lemons"]
    names = ", ".join(_lemon(n) for n in lem["nodes"]) or "none"
    out.append(f"lemons (>= {lem['threshold_faults']} faults in {lem['window_s'] / 86400:g} d): {names}")
    return out


def _lemon(n: dict[str, Any]) -> str:
    false = n.get("false_validations", 0)
    return f"{n['node']} ({n['faults']}, {false} false validation(s))" if false else f"{n['node']} ({n['faults']})"


def print_text(r: dict[str, Any]) -> None:
    for line in report_lines(r):
        print(line)


def write_csv(r: dict[str, Any], out: Any) -> None:
    """One row per figure: section, name, value (a spreadsheet's pivot makes the review's tables)."""
    w = csv.writer(out)
    w.writerow(["section", "name", "value"])
    for key in ("days",):
        w.writerow(["window", key, r["window"][key]])
    for key, value in r["fleet"].items():
        w.writerow(["fleet", key, value])
    w.writerow(["faults", "total", r["faults"]["total"]])
    w.writerow(["faults", "per_1000_gpu_days", r["faults"]["per_1000_gpu_days"]])
    w.writerow(["faults", "per_1000_node_days", r["faults"]["per_1000_node_days"]])
    for cause, c in r["faults"]["by_cause"].items():
        w.writerow(["faults_by_cause", cause, c["count"]])
    for key, value in r["mtbf_h"].items():
        w.writerow(["mtbf_h", key, value])
    for which, m in r["mttr"].items():
        for key, value in m.items():
            w.writerow([f"mttr_{which}", key, value])
    w.writerow(["ettr", "fleet", r["ettr"]["fleet"]])
    for j in r["ettr"]["jobs"]:
        w.writerow(["ettr_job", j["job"], j["ettr"]])
    for key, value in r["lost"].items():
        w.writerow(["lost", key, value])
    for key in ("total", "wrongful", "pending", "unknown"):
        w.writerow(["evictions", key, r["evictions"][key]])
    for n in r["lemons"]["nodes"]:
        w.writerow(["lemon", n["node"], n["faults"]])
    val = r.get("validation")
    if val is not None:
        for key in ("returns", "false_successes", "share", "pending"):
            w.writerow(["validation", key, val[key]])


def register(sub: Any) -> None:
    """Add `starpulse report` to the top-level subparsers."""
    p = sub.add_parser("report", help="fleet reliability: faults per 1,000 GPU-days, MTBF, MTTR, ETTR, lemons")
    add_client_flags(p)
    p.add_argument("--since", type=duration, default=30 * 86400.0, metavar="DURATION",
                   help="the window, ending now: '30d', '12h' (default: 30d)")  # fmt: skip
    p.add_argument("--clean", type=duration, default=7 * 86400.0, metavar="DURATION",
                   help="how long a returned node must run without an incident for its eviction to count as "
                        "wrongful (default: 7d)")  # fmt: skip
    p.add_argument("--lemon-faults", type=int, default=3, metavar="N",
                   help="faults within --lemon-window that make a node a lemon (default: 3)")  # fmt: skip
    p.add_argument("--lemon-window", type=duration, default=28 * 86400.0, metavar="DURATION",
                   help="the lemon window (default: 28d, as Kokolis et al.)")  # fmt: skip
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help=JSON_HELP)
    fmt.add_argument("--csv", action="store_true", help="one row per figure: section,name,value")
    p.set_defaults(func=cmd_report)
