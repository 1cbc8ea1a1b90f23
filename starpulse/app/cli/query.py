"""Read-only views of the fleet from the controller: events, incidents, spares, jobs (nodes: ``nodes.py``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Literal

from starpulse.app.cli.common import (
    JSON_HELP,
    add_client_flags,
    admin_call,
    age,
    count_flag,
    print_json,
    query_stub,
    rpc,
)
from starpulse.app.cli.tables import Col, print_table


def cmd_events(args: argparse.Namespace) -> int:

    from starpulse.core.findings import event_kind_name, severity_name
    from starpulse.v1 import service_pb2 as spb

    request = spb.ListEventsRequest(node_id=args.node or "", limit=args.limit)
    stub = query_stub(args)
    resp = rpc("events", args, stub, "ListEvents", request, 10)
    if resp is None:
        return 2
    if args.node and not resp.events and not _known_node(args, stub, args.node):
        return 2
    rows = [
        {
            "node": e.node_id,
            "seq": e.event.seq,
            "timestamp_ms": e.event.timestamp_ms,
            "kind": event_kind_name(e.event.kind),
            "severity": severity_name(e.event.severity),
            "component": e.event.component,
            "action": e.event.action,
            "xid": e.event.xid or None,
            "message": e.event.message,
        }
        for e in resp.events
    ]
    if args.json:
        print_json("events", {"events": rows})
        return 0
    if not rows:
        if args.node:
            print(f"no events for {args.node}")
        return 0
    print_table(
        [Col("TIME"), Col("NODE"), Col("SEVERITY", "right", styled=True), Col("KIND"), Col("COMPONENT"),
         Col("ACTION"), Col("MESSAGE")],
        [[time.strftime("%H:%M:%S", time.localtime(r["timestamp_ms"] / 1000)), r["node"], r["severity"], r["kind"],
          r["component"], r["action"], r["message"]] for r in rows],
    )  # fmt: skip
    return 0


def _known_node(args: argparse.Namespace, stub: Any, node: str) -> bool:
    """Whether the controller knows ``node``; False after one line (a typo must not look like a quiet node)."""
    from starpulse.v1 import service_pb2 as spb

    resp = rpc("events", args, stub, "ListNodes", spb.ListNodesRequest(), 10)
    if resp is None:
        return False
    if any(n.node_id == node for n in resp.nodes):
        return True
    print(
        f"starpulse events: --node {node}: no such node at the controller {args.controller} "
        f"({len(resp.nodes)} known; see starpulse nodes)",
        file=sys.stderr,
    )
    return False


def cmd_incidents(args: argparse.Namespace) -> int:

    from starpulse.v1 import service_pb2 as spb

    request = spb.ListIncidentsRequest(include_resolved=args.all, limit=args.limit)
    resp = rpc("incidents", args, query_stub(args), "ListIncidents", request, 10)
    if resp is None:
        return 2
    rows = [
        {
            "id": i.id,
            "kind": i.kind,
            "root_cause": i.root_cause,
            "component_type": i.component_type,
            "affected_nodes": list(i.affected_nodes),
            "affected_jobs": list(i.affected_jobs),
            "severity": i.severity,
            "action": i.action,
            "evidence": json.loads(i.evidence_json or "[]"),
            "opened_ms": i.opened_ms,
            "resolved_ms": i.resolved_ms or None,
        }
        for i in resp.incidents
    ]
    if args.json:
        print_json("incidents", {"incidents": rows})
        return 0
    if not rows:
        print("no open incidents" if not args.all else "no incidents")
        return 0
    table = []
    for r in rows:
        state = "open" if r["resolved_ms"] is None else "resolved"
        nodes = r["affected_nodes"]
        shown = ", ".join(nodes[:4]) + (f" (+{len(nodes) - 4})" if len(nodes) > 4 else "")
        table.append(
            [r["id"], state, r["severity"], r["kind"], r["root_cause"] or "(network)", r["action"],
             age(r["opened_ms"]), shown]
        )  # fmt: skip
    print_table(
        [Col("INCIDENT"), Col("STATE", styled=True), Col("SEVERITY", "right", styled=True), Col("KIND"),
         Col("ROOT CAUSE"), Col("ACTION"), Col("OPENED"), Col("NODES")],
        table,
    )  # fmt: skip
    return 0


def cmd_spares(args: argparse.Namespace) -> int:
    from starpulse.v1 import service_pb2 as spb

    resp = admin_call("spares", args, "ListSpares", spb.SparesRequest())
    if resp is None:
        return 2
    rows = [
        {
            "spare": s.spare,
            "healthy": s.healthy,
            "allocated_to": s.allocated_to or None,
            "job": s.job or None,
            "block": s.block if s.HasField("block") else None,
            "source": s.source,
        }
        for s in resp.spares
    ]
    if args.json:
        print_json("spares", {"spares": rows})
        return 0
    if not rows:
        print("no spares")
        return 0
    print_table(
        [Col("SPARE"), Col("HEALTHY", styled=True), Col("BLOCK", "right"), Col("ALLOCATED TO"), Col("JOB"),
         Col("SOURCE")],
        [[r["spare"], "yes" if r["healthy"] else "no", "-" if r["block"] is None else r["block"],
          r["allocated_to"] or "-", r["job"] or "-", r["source"]] for r in rows],
    )  # fmt: skip
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    from starpulse.v1 import service_pb2 as spb

    resp = admin_call("jobs", args, "ListJobs", spb.JobsRequest())
    if resp is None:
        return 2
    rows = [
        {
            "job": j.job,
            "state": j.state,
            "nodes": list(j.nodes),
            "world_size": j.world_size,
            "step": j.step,
            "checkpoint_dir": j.checkpoint_dir,
            "last_complete_step": j.last_complete_step,
            "last_complete_path": j.last_complete_path,
            "last_complete_ms": j.last_complete_ms or None,
            "restarts": j.restarts,
            "steps_lost": j.steps_lost,
            "downtime_s": j.downtime_s,
            "resumed_from_step": j.resumed_from_step if j.HasField("resumed_from_step") else None,
            "resumed_from_checkpoint": (j.resumed_from_checkpoint if j.HasField("resumed_from_checkpoint") else None),
            "phase": j.phase or None,
            "last_step_ms": j.last_step_ms if j.HasField("last_step_ms") else None,
            "since_step_s": round(j.since_step_s, 1) if j.HasField("since_step_s") else None,
        }
        for j in resp.jobs
    ]
    if args.json:
        print_json("jobs", {"jobs": rows})
        return 0
    if not rows:
        print("no jobs")
        return 0
    table = []
    for r in rows:
        nodes = r["nodes"]
        shown = ", ".join(nodes[:4]) + (f" (+{len(nodes) - 4})" if len(nodes) > 4 else "")
        resumed = "-" if r["resumed_from_step"] is None else str(r["resumed_from_step"])
        since = "-" if r["since_step_s"] is None else f"{r['since_step_s']:.1f}"
        table.append(
            [r["job"], r["state"], r["phase"] or "-", r["step"], since, r["last_complete_step"], r["restarts"],
             r["steps_lost"], f"{r['downtime_s']:.1f}", resumed, shown]
        )  # fmt: skip
    right: Literal["right"] = "right"
    print_table(
        [Col("JOB"), Col("STATE", styled=True), Col("PHASE"), Col("STEP", right), Col("SINCE STEP S", right),
         Col("CHECKPOINT", right), Col("RESTARTS", right), Col("LOST", right), Col("DOWN S", right),
         Col("RESUMED", right), Col("NODES")],
        table,
    )  # fmt: skip
    return 0


def register(sub: Any) -> None:
    """Add this group's commands to the top-level subparsers."""
    e = sub.add_parser("events", help="list recent events")
    add_client_flags(e)
    e.add_argument("--node", default=None, help="only this node's events (default: every node)")
    count_flag(e, "--limit", 50, "newest events to show")
    e.add_argument("--json", action="store_true", help=JSON_HELP)
    e.set_defaults(func=cmd_events)

    i = sub.add_parser("incidents", help="list incidents (root causes on the fabric)")
    add_client_flags(i)
    i.add_argument("--all", action="store_true", help="include resolved incidents")
    count_flag(i, "--limit", 100, "newest incidents to show")
    i.add_argument("--json", action="store_true", help=JSON_HELP)
    i.set_defaults(func=cmd_incidents)

    sp = sub.add_parser("spares", help="hot spares: health, block, allocation")
    add_client_flags(sp)
    sp.add_argument("--json", action="store_true", help=JSON_HELP)
    sp.set_defaults(func=cmd_spares)

    jb = sub.add_parser("jobs", help="training jobs: phase, time since the last step, restarts, steps lost, checkpoint")
    add_client_flags(jb)
    jb.add_argument("--json", action="store_true", help=JSON_HELP)
    jb.set_defaults(func=cmd_jobs)
