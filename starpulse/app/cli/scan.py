"""`starpulse scan`: a one-shot health check of this node."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def cmd_scan(args: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict

    from agent.collectors.kmsg import scan_file
    from agent.factory import BackendUnavailable, build_collectors
    from agent.runtime import CollectorSet
    from agent.sim.node import SimNode
    from starpulse.core.logs import configure_logging

    configure_logging("warning", fmt="console", stream=sys.stderr)
    findings: list[Any] = []
    sim = None
    if args.backend == "sim":
        import tempfile

        sim = SimNode("scan", Path(tempfile.mkdtemp(prefix="starpulse-scan-")), seed=args.seed)
    try:
        plan = build_collectors(
            args.backend, findings.append, sysfs_root=args.sysfs_root, kmsg_path=None, sim=sim, lldp=True
        )
    except BackendUnavailable as exc:
        print(f"starpulse scan: backend nvml unavailable: {exc}", file=sys.stderr)
        return 2
    collectors = CollectorSet(plan.collectors)
    collectors.probe()
    inventory = collectors.describe()
    for hook in plan.inventory_hooks:
        hook(inventory)
    if plan.before_collect is not None:
        plan.before_collect(1.0)
    result = collectors.collect(seq=1)
    findings.extend(result.findings)
    kmsg = args.kmsg or (None if sim is None else sim.kmsg_path)
    if kmsg:
        findings.extend(collectors.localise(f) for f in scan_file(kmsg))
    collectors.close()
    out = {
        "inventory": MessageToDict(inventory, preserving_proto_field_name=True),
        "sample": MessageToDict(result.report, preserving_proto_field_name=True),
        "findings": [f.to_dict() for f in findings],
    }
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        _print_scan(out)
    return 1 if any(f.severity in ("critical", "fatal") for f in findings) else 0


def _print_scan(out: dict[str, Any]) -> None:
    inv = out["inventory"]
    host = inv.get("host", {})
    print(
        f"host {host.get('hostname', '?')}  kernel {host.get('kernel', '?')}  driver {host.get('driver_version', '-')}"
    )
    print(f"GPUs: {len(inv.get('gpus', []))}   NIC ports: {len(inv.get('nics', []))}")
    for c in out["sample"].get("collectors", []):
        state = "ok" if c.get("ok") else ("unsupported" if not c.get("supported") else "FAILED")
        print(f"  collector {c['name']:<8} {state}  {c.get('error', '')}")
    if not out["findings"]:
        print("no findings: healthy")
    for f in out["findings"]:
        xid = f" xid={f['xid']}" if "xid" in f else ""
        print(f"  [{f['severity']:>8}] {f['component']:<14} {f['kind']}{xid} -> {f['action']}: {f['message']}")


def register(sub: Any) -> None:
    """Add this group's commands to the top-level subparsers."""
    s = sub.add_parser("scan", help="one-shot health check of this node")
    s.add_argument("--backend", choices=("nvml", "sim"), default="nvml")
    s.add_argument("--sysfs-root", default="/sys")
    s.add_argument("--kmsg", default=None, help="kernel log file to scan (dmesg, journalctl -k or /dev/kmsg text)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_scan)
