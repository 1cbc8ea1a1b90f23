"""``starpulse nodes``: every node with its presence, where it is in the repair lifecycle, its accelerators."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Literal

from controller.heal.states import NodeHealState
from starpulse.app.cli.common import JSON_HELP, add_client_flags, age, message_dict, print_json, query_stub, rpc
from starpulse.app.cli.tables import Col, print_table

LIFECYCLE_STATES = tuple(str(s) for s in NodeHealState)
"""Checked before calling (one clear line for a typo); the controller checks again."""


def _states(raw: list[str]) -> list[str] | None:
    """``--state repairing,validating --state spare`` as a list; None (after one line) on a bad name."""
    names = [s.strip().lower().replace("-", "_") for part in raw for s in part.split(",") if s.strip()]
    bad = [n for n in names if n not in LIFECYCLE_STATES]
    if bad:
        print(
            f"starpulse nodes: --state {bad[0]!r} is not a lifecycle state (one of {', '.join(LIFECYCLE_STATES)})",
            file=sys.stderr,
        )
        return None
    return names


def cmd_nodes(args: argparse.Namespace) -> int:
    from starpulse.v1 import service_pb2 as spb

    states = _states(args.state)
    if states is None:
        return 2
    request = spb.ListNodesRequest(lifecycle_states=states)
    resp = rpc("nodes", args, query_stub(args), "ListNodes", request, 10)
    if resp is None:
        return 2
    if args.json:
        print_json("nodes", {"nodes": [message_dict(n) for n in resp.nodes]})
        return 0
    rows = []
    for n in resp.nodes:
        since = age(n.lifecycle_since_ms) if n.lifecycle_since_ms else "-"
        why = n.lifecycle_reason + (f" [by {n.drained_by}]" if n.drained_by else "")
        chips = f"{n.accelerator_vendor} {n.accelerator_model}".strip()
        if not n.judged and n.not_judged_why:  # never healthy for what was not read (issue 30)
            chips = f"NOT JUDGED {chips}".strip()
            why = "; ".join(p for p in (f"not judged: {n.not_judged_why}", why) if p)
        rows.append(
            [n.node_id, n.state, n.lifecycle_state or "in_service", since, age(n.last_seen_ms), n.gpu_count,
             n.nic_count, n.open_events, chips, why]
        )  # fmt: skip
    right: Literal["right"] = "right"
    print_table(
        [Col("NODE"), Col("STATE", styled=True), Col("LIFECYCLE", styled=True), Col("SINCE"), Col("LAST SEEN"),
         Col("GPUS", right), Col("NICS", right), Col("EVENTS", right), Col("ACCELERATORS"), Col("WHY")],
        rows,
    )  # fmt: skip
    return 0


def register(sub: Any) -> None:
    """Add ``nodes`` to the top-level subparsers."""
    n = sub.add_parser("nodes", help="list nodes: presence, lifecycle state (since when, why), GPUs, events")
    add_client_flags(n)
    n.add_argument("--json", action="store_true", help=JSON_HELP)
    n.add_argument(
        "--state",
        action="append",
        default=[],
        metavar="STATE[,STATE]",
        help=f"only nodes in these lifecycle states ({', '.join(LIFECYCLE_STATES)}); repeatable",
    )
    n.set_defaults(func=cmd_nodes)
