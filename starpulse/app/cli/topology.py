"""`starpulse topology`: generate a fabric file, show the live graph."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from starpulse.app.cli.common import JSON_HELP, add_client_flags, count_flag, print_json, query_stub, rpc, writable_file
from starpulse.app.cli.progress import status


def cmd_topology_generate(args: argparse.Namespace) -> int:
    from controller.fabric import generate_fabric, save_fabric

    try:
        with status(f"generating a fabric of {args.nodes} nodes"):
            fabric = generate_fabric(
                args.nodes, args.gpus_per_node, args.rails, args.nodes_per_block, args.spines, spares=args.spares
            )
    except ValueError as exc:
        print(f"starpulse topology generate: {exc}", file=sys.stderr)
        return 2
    if args.out:
        try:
            with status(f"writing {args.out}"):
                save_fabric(fabric, args.out)
        except OSError as exc:
            print(f"starpulse topology generate: --out {args.out}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        print(f"wrote {args.out}: {json.dumps(fabric.summary(), sort_keys=True)}")
    else:
        from controller.fabric import fabric_to_dict

        print(json.dumps(fabric_to_dict(fabric), indent=1))
    return 0


def cmd_topology_show(args: argparse.Namespace) -> int:
    if args.file:
        from controller.fabric import FabricFileError, load_fabric

        try:
            summary = load_fabric(args.file).summary()
        except (FabricFileError, OSError) as exc:
            print(f"starpulse topology show: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(summary, indent=2, sort_keys=True))
        return 0

    from starpulse.v1 import service_pb2 as spb

    resp = rpc("topology show", args, query_stub(args), "GetTopology", spb.TopologyRequest(), 10)
    if resp is None:
        return 2
    if not json.loads(resp.summary_json or "{}"):  # no declared fabric: nothing to compare the wiring with
        print(
            f"starpulse topology show: the controller at {args.controller} has no declared fabric "
            "(start it with --fabric FILE; see starpulse topology generate)",
            file=sys.stderr,
        )
        return 2
    out = {
        "summary": json.loads(resp.summary_json or "{}"),
        "nodes_reporting_lldp": resp.nodes_reporting_lldp,
        "miswired": list(resp.miswired),
        "unknown_devices": list(resp.unknown_devices),
        "missing_links": list(resp.missing_links),
    }
    if args.json:
        print_json("topology", out)
        return 0
    worst = out["summary"].pop("probe_worst", [])
    print(json.dumps(out["summary"], sort_keys=True))
    print(f"LLDP reported by {resp.nodes_reporting_lldp} nodes/switches")
    if worst:
        print("worst probed links and switches (last window):")
        for w in worst:
            print(
                f"  {w['component']:<32} {w['kind']:<5} loss {100 * w['loss']:6.2f}% "
                f"({w['lost']}/{w['sent']})  p99 {w['p99_us']:.0f} us"
            )
    for line in out["miswired"] + out["unknown_devices"] + out["missing_links"]:
        print(f"  {line}")
    if not (out["miswired"] or out["unknown_devices"] or out["missing_links"]):
        print("  wiring matches the declared fabric")
    return 0


def register(sub: Any) -> None:
    """Add this group's commands to the top-level subparsers."""
    t = sub.add_parser("topology", help="fabric topology: generate a fabric file, show the live graph")
    tsub = t.add_subparsers(dest="topology_command", required=True)
    tg = tsub.add_parser("generate", help="a Xingmai-style multi-rail Clos")
    count_flag(tg, "--nodes", None, "compute nodes in the fabric", required=True)
    count_flag(tg, "--gpus-per-node", 8, "GPUs per node")
    count_flag(tg, "--rails", 8, "rails, a leaf each per block")
    count_flag(tg, "--nodes-per-block", 16, "nodes under one block's leaves")
    count_flag(tg, "--spines", 8, "spine switches")
    count_flag(tg, "--spares", 0, "of the nodes, spares held idle", minimum=0)
    tg.add_argument(
        "--out",
        type=writable_file,
        default=None,
        metavar="FILE",
        help="file to write (JSON, or YAML for .yaml; its folder must exist); default: stdout",
    )
    tg.set_defaults(func=cmd_topology_generate)
    ts = tsub.add_parser("show", help="summarise the live graph (or a fabric file)")
    add_client_flags(ts)
    ts.add_argument(
        "--file", default=None, metavar="FILE", help="summarise this fabric file instead of asking the controller"
    )
    ts.add_argument("--json", action="store_true", help=JSON_HELP)
    ts.set_defaults(func=cmd_topology_show)
