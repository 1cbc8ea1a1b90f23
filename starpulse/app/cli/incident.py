"""``starpulse incident show|ack|resolve ID`` and ``starpulse approvals``: one incident as a
person follows it (evidence, timeline, actions taken), and the remediations waiting for one."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from starpulse.app.cli.admin import actor_of
from starpulse.app.cli.common import (
    JSON_HELP,
    add_client_flags,
    admin_call,
    age,
    message_dict,
    print_json,
    query_stub,
    rpc,
)
from starpulse.app.cli.tables import Col, print_table


def _clock(ms: int) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ms / 1000)) if ms else "--:--:--"


def stacks_lines(stacks: dict[str, Any]) -> str:
    """A hang's ranks grouped by stack, outliers first (controller.jobs.stacks), for a person."""
    lines = [f"    stacks: {stacks.get('reason', '')}"]
    for g in stacks.get("groups") or []:
        ranks = ", ".join(str(r) for r in (g.get("ranks") or [])[:16])
        where = " / ".join(g.get("nodes") or [])
        last = f", last collective {g['last_collective']}" if g.get("last_collective") else ""
        lines.append(f"    {g.get('role', '?'):8} ranks {ranks} on {where}{last}")
        for frame in (g.get("frames") or [])[:4]:
            lines.append(f"               {frame}")
    for h in stacks.get("hardware") or []:
        lines.append(f"    hardware {h.get('kind')} {h.get('root_cause')} ({h.get('id')}) on a named node")
    for u in stacks.get("unread") or []:
        lines.append(f"    unread   rank {u.get('rank')} on {u.get('node')}: {u.get('error') or 'no stack'}")
    return "\n".join(lines)


def _print_detail(resp: Any) -> None:
    inc = resp.incident
    state = f"resolved {age(inc.resolved_ms)}" if inc.resolved_ms else f"open since {age(inc.opened_ms)}"
    print(f"{inc.id}  {inc.kind} {inc.severity}  root cause {inc.root_cause}  ({state})")
    print(f"nodes: {', '.join(inc.affected_nodes) or '-'}   jobs: {', '.join(inc.affected_jobs) or '-'}")
    print(f"recommended: {inc.action or '-'}" + (f"   acknowledged by {resp.acked_by}" if resp.acked_by else ""))
    evidence = json.loads(inc.evidence_json or "[]")
    print(f"evidence ({len(evidence)}):")
    for e in evidence[:12]:
        print(f"  - {e.get('rule', '?')} on {e.get('component', '?')}: {e.get('message', '')}".rstrip(": "))
        stacks = (e.get("evidence") or {}).get("stacks")
        if isinstance(stacks, dict):
            print(stacks_lines(stacks))
    timeline = json.loads(resp.timeline_json or "[]")
    print(f"timeline ({len(timeline)}, UTC):")
    for t in timeline:
        who = f" [{t['by']}]" if t.get("by") else ""
        node = f" {t['node']}" if t.get("node") else ""
        print(f"  {_clock(int(t['at_ms']))}{node} {t['what']}{who}: {t.get('detail', '')}".rstrip(": "))


def cmd_incident_show(args: argparse.Namespace) -> int:
    from starpulse.v1 import service_pb2 as spb

    resp = rpc("incident show", args, query_stub(args), "GetIncident", spb.IncidentRequest(id=args.id), 10)
    if resp is None:
        return 2
    if args.json:
        out = message_dict(resp)
        out["timeline"] = json.loads(out.pop("timeline_json") or "[]")
        print_json("incident", out)
    else:
        _print_detail(resp)
    return 0


def cmd_incident_action(args: argparse.Namespace) -> int:
    """incident ack|resolve ID --reason TEXT (by a named person)."""
    from starpulse.v1 import service_pb2 as spb

    verb = args.incident_command
    actor = actor_of(args, f"incident {verb}")
    if actor is None:
        return 2
    request = spb.IncidentActionRequest(id=args.id, actor=actor, reason=args.reason)
    resp = admin_call(f"incident {verb}", args, "AckIncident" if verb == "ack" else "ResolveIncident", request)
    if resp is None:
        return 2
    if args.json:
        print_json("incident-action", message_dict(resp))
    else:
        print(resp.message)
    return 0


def cmd_approvals(args: argparse.Namespace) -> int:
    from starpulse.v1 import service_pb2 as spb

    resp = admin_call("approvals", args, "ListApprovals", spb.ApprovalsRequest())
    if resp is None:
        return 2
    if args.json:
        print_json("approvals", message_dict(resp))
        return 0
    if not resp.approvals:
        print("no remediation waits for approval")
        return 0
    print_table(
        [Col("INCIDENT"), Col("NODE"), Col("ACTION"), Col("ASKED"), Col("WHY")],
        [[a.incident_id, a.node, a.action, age(a.requested_ms), a.reason] for a in resp.approvals],
    )
    print("approve one with: starpulse approve INCIDENT [--node NODE]")
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    add_client_flags(p)
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def register(sub: Any) -> None:
    """Add ``incident`` and ``approvals`` to the top-level subparsers."""
    inc = sub.add_parser("incident", help="one incident: show (evidence, timeline, actions), ack, resolve")
    isub = inc.add_subparsers(dest="incident_command", required=True)
    show = isub.add_parser("show", help="evidence, timeline and the actions taken")
    show.add_argument("id")
    _common(show)
    show.set_defaults(func=cmd_incident_show)
    for verb, what in (("ack", "say you are on it"), ("resolve", "close it now (a person decides it is over)")):
        p = isub.add_parser(verb, help=what)
        p.add_argument("id")
        p.add_argument("--reason", required=True, help="why (recorded with your name)")
        p.add_argument("--actor", default=None, help="who is acting (default: $USER)")
        _common(p)
        p.set_defaults(func=cmd_incident_action)
    ap = sub.add_parser("approvals", help="remediations waiting for a person's approval (manual mode)")
    _common(ap)
    ap.set_defaults(func=cmd_approvals)
