"""What a person does to the fleet through the controller: cordon, drain, approve, the breaker."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

from starpulse.app.cli.common import JSON_HELP, add_client_flags, admin_call, age, message_dict, print_json


def default_actor() -> str | None:
    """The person running the command: $USER, else the OS login name; never the controller's own name."""
    import getpass
    import os

    name = os.environ.get("USER", "").strip()
    if not name:
        with contextlib.suppress(Exception):
            name = getpass.getuser().strip()
    return name if name and name not in ("starpulse", "external") else None


def actor_of(args: argparse.Namespace, command: str) -> str | None:
    actor = (args.actor or default_actor() or "").strip()
    if not actor:
        print(f"starpulse {command}: who is acting? pass --actor NAME (a person, not 'starpulse')", file=sys.stderr)
        return None
    return actor


def cmd_node_action(args: argparse.Namespace) -> int:
    """cordon | uncordon | drain NODE --reason TEXT."""
    from starpulse.v1 import service_pb2 as spb

    actor = actor_of(args, args.command)
    if actor is None:
        return 2
    request = spb.NodeActionRequest(
        node=args.node, reason=args.reason, actor=actor, force=bool(getattr(args, "force", False))
    )
    resp = admin_call(args.command, args, args.command.capitalize(), request)
    if resp is None:
        return 2
    if args.json:
        print_json("node-action", message_dict(resp))
    else:
        held = f" (held by {resp.drained_by})" if resp.drained_by else ""
        print(f"{resp.message}\n{resp.node}: {resp.state}{held}")
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    from starpulse.v1 import service_pb2 as spb

    actor = actor_of(args, "approve")
    if actor is None:
        return 2
    request = spb.ApproveRequest(incident_id=args.incident, actor=actor, node=args.node or "")
    resp = admin_call("approve", args, "Approve", request)
    if resp is None:
        return 2
    if args.json:
        print_json("approve", message_dict(resp))
    else:
        print(f"{resp.message}" + (f"\nnodes: {', '.join(resp.nodes)}" if resp.nodes else ""))
    return 0 if resp.ok else 1


def _print_breaker(resp: Any) -> None:
    if resp.open:
        print(f"breaker OPEN since {age(resp.opened_ms)}: {resp.reason}")
        print("automatic remediation is stopped until a person resets it: starpulse breaker reset --reason TEXT")
    else:
        closed = f" (closed by {resp.closed_by} {age(resp.closed_ms)})" if resp.closed_by else ""
        print(f"breaker closed{closed}")
    print(f"mode {resp.mode}; {resp.pending_approvals} approval(s) pending")


def cmd_breaker_status(args: argparse.Namespace) -> int:
    from starpulse.v1 import service_pb2 as spb

    resp = admin_call("breaker status", args, "GetBreaker", spb.BreakerRequest())
    if resp is None:
        return 2
    if args.json:
        print_json("breaker", message_dict(resp))
    else:
        _print_breaker(resp)
    return 0


def cmd_breaker_reset(args: argparse.Namespace) -> int:
    from starpulse.v1 import service_pb2 as spb

    actor = actor_of(args, "breaker reset")
    if actor is None:
        return 2
    request = spb.BreakerResetRequest(actor=actor, reason=args.reason or "")
    resp = admin_call("breaker reset", args, "ResetBreaker", request)
    if resp is None:
        return 2
    if args.json:
        print_json("breaker-reset", message_dict(resp))
    else:
        print(f"breaker closed by {actor}" if resp.changed else "breaker was not open: nothing to reset")
        _print_breaker(resp)
    return 0


def register(sub: Any) -> None:
    """Add this group's commands to the top-level subparsers."""
    for verb, what in (
        ("cordon", "stop new work landing on a node"),
        ("uncordon", "return a node to service (not one someone else drained, unless --force)"),
        ("drain", "cordon a node and move its work off"),
    ):
        na = sub.add_parser(verb, help=what)
        na.add_argument("node")
        na.add_argument("--reason", required=True, help="why (recorded with your name)")
        na.add_argument("--actor", default=None, help="who is acting (default: $USER)")
        if verb == "uncordon":
            na.add_argument("--force", action="store_true", help="return a node someone else drained")
        add_client_flags(na)
        na.add_argument("--json", action="store_true", help=JSON_HELP)
        na.set_defaults(func=cmd_node_action)

    ap = sub.add_parser("approve", help="approve a remediation waiting for a person (manual mode), and run it")
    ap.add_argument("incident")
    ap.add_argument("--node", default=None, help="approve only this node's request (default: all of the incident)")
    ap.add_argument("--actor", default=None, help="who approves (default: $USER)")
    add_client_flags(ap)
    ap.add_argument("--json", action="store_true", help=JSON_HELP)
    ap.set_defaults(func=cmd_approve)

    br = sub.add_parser("breaker", help="the self-healing circuit breaker: status, or reset by a person")
    brsub = br.add_subparsers(dest="breaker_command", required=True)
    brs = brsub.add_parser("status", help="is automatic remediation stopped, and why")
    add_client_flags(brs)
    brs.add_argument("--json", action="store_true", help=JSON_HELP)
    brs.set_defaults(func=cmd_breaker_status)
    brr = brsub.add_parser("reset", help="close the breaker (only a named person may)")
    brr.add_argument("--actor", default=None, help="who closes it (default: $USER)")
    brr.add_argument("--reason", default="", help="why it is safe to act again")
    add_client_flags(brr)
    brr.add_argument("--json", action="store_true", help=JSON_HELP)
    brr.set_defaults(func=cmd_breaker_reset)
