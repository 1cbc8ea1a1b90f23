"""``starpulse accelerators show|confirm``: the accelerator inventory this node is held to.

Without ``accelerators.expected_count`` in its settings the agent learns the count it first
reads into ``STATE_DIR/accelerators.json`` (unconfirmed) and from then on reports the node
"not judged" when it reads fewer. A person confirms the learned count (or sets the right one)
here, on the node, after checking it against the machine's order sheet.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from starpulse.app.cli.common import JSON_HELP, print_json, readable_folder

DEFAULT_STATE_DIR = "/var/lib/starpulse"


def _inventory(args: argparse.Namespace) -> Any:
    from agent.collectors.accel.check import LEARNED_FILE, LearnedInventory

    folder = Path(args.state_dir)
    if not folder.is_dir():
        raise _Refused(f"--state-dir {folder}: no such directory")
    return LearnedInventory(folder / LEARNED_FILE)


class _Refused(ValueError):
    """Input the user must fix: one line."""


def cmd_show(args: argparse.Namespace) -> int:
    from agent.collectors.accel.check import LearnedError

    try:
        known = _inventory(args).load()
    except (_Refused, LearnedError) as exc:
        print(f"starpulse accelerators show: {exc}", file=sys.stderr)
        return 2
    if args.json:
        body = {"count": known.count, "vendor": known.vendor, "source": known.source} if known else None
        print_json("accelerators", {"expected": body})
    elif known is None:
        print("nothing learned yet: the agent learns the count it first reads")
    else:
        print(f"expected {known.count} {known.vendor or ''} accelerators ({known.source})".replace("  ", " "))
    return 0


def cmd_confirm(args: argparse.Namespace) -> int:
    from agent.collectors.accel.check import LearnedError

    try:
        known = _inventory(args).confirm(args.count)
    except (_Refused, LearnedError) as exc:
        print(f"starpulse accelerators confirm: {exc}", file=sys.stderr)
        return 2
    print(
        f"confirmed: {known.count} {known.vendor or ''} accelerators (the agent reads it when it starts)".replace(
            "  ", " "
        )
    )
    return 0


def register(sub: Any) -> None:
    """Add the ``accelerators`` group to the top-level subparsers."""
    group = sub.add_parser("accelerators", help="the accelerator inventory the agent holds this node to")
    cmds = group.add_subparsers(dest="accelerators_command", required=True)
    show = cmds.add_parser("show", help="the learned (or confirmed) expected inventory")
    show.add_argument(
        "--state-dir",
        default=DEFAULT_STATE_DIR,
        type=readable_folder,
        help=f"the agent's state folder (default {DEFAULT_STATE_DIR})",
    )
    show.add_argument("--json", action="store_true", help=JSON_HELP)
    show.set_defaults(func=cmd_show)
    confirm = cmds.add_parser(
        "confirm", help="vouch for the learned count (or set --count); the agent holds the node to it"
    )
    confirm.add_argument(
        "--state-dir",
        default=DEFAULT_STATE_DIR,
        type=readable_folder,
        help=f"the agent's state folder (default {DEFAULT_STATE_DIR})",
    )
    confirm.add_argument("--count", type=int, default=None, help="the right count when the learned one is wrong")
    confirm.set_defaults(func=cmd_confirm)
