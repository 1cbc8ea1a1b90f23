"""`starpulse scan`: this node's verdict by the controller's own rules, for people and schedulers.

It reads the NIC tree at ``--sysfs-root`` and the log at ``--kmsg`` whatever the accelerator
backend (``--backend none`` scans a machine without the driver), samples twice over
``--window`` and judges the samples with the controller's default rules (starpulse.app.
nodecheck). Exit codes: 0 healthy, 1 unhealthy, 2 could not check.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starpulse.app.cli.common import (
    JSON_HELP,
    count_flag,
    message_dict,
    print_json,
    seconds_flag,
)
from starpulse.app.cli.tables import Col, print_table

NONE_BACKEND = "none"
LEARNED_DEFAULT = "/var/lib/starpulse/accelerators.json"  # the agent's (state_dir/accelerators.json)


@dataclass
class _Plan:
    collectors: list[Any]
    inventory_hooks: list[Any]
    before_collect: Any
    sim: Any
    checker: Any = None  # the accelerator check (None with --backend none: no accelerator asked for)
    scratch: Any = None  # the simulated node's folder (a TemporaryDirectory), removed after the scan


def _backends() -> tuple[str, ...]:
    from agent.factory import BACKENDS

    return (*BACKENDS, NONE_BACKEND)


def _build(args: argparse.Namespace, findings: list[Any], expected: Any = None) -> _Plan:
    """The collectors for the chosen backend; the NIC tree and kernel log are always the user's."""
    from agent.collectors.ethtool import EthtoolCollector
    from agent.collectors.host import HostCollector
    from agent.collectors.rdma import RdmaSysfsCollector
    from agent.factory import build_collectors, nic_gpu_pairing

    if args.backend == NONE_BACKEND:
        root = args.sysfs_root or "/sys"
        collectors = [RdmaSysfsCollector(root), EthtoolCollector(), HostCollector(mounts=("/",))]
        return _Plan(collectors, [nic_gpu_pairing(root)], None, None)
    sim = None
    scratch: Any = None
    if args.backend == "sim":
        from agent.sim.node import SimNode

        scratch = tempfile.TemporaryDirectory(prefix="starpulse-scan-")
        try:
            sim = SimNode("scan", Path(scratch.name), seed=args.seed, vendor=_sim_vendor(args.sim_fault or ()))
            for spec in args.sim_fault or ():
                _inject(sim, spec)
        except BaseException:
            scratch.cleanup()
            raise
    plan = build_collectors(
        args.backend,
        findings.append,
        sysfs_root=args.sysfs_root or "/sys",
        kmsg_path=None,
        sim=sim,
        lldp=True,
        expected=expected,
    )
    collectors, hooks = list(plan.collectors), list(plan.inventory_hooks)
    if sim is not None and args.sysfs_root:
        # The simulated GPUs, but the NIC tree the user named (a recorded or derived one).
        collectors = [
            RdmaSysfsCollector(args.sysfs_root) if isinstance(c, RdmaSysfsCollector) else c for c in collectors
        ]
        hooks = [nic_gpu_pairing(args.sysfs_root)]
    return _Plan(collectors, hooks, plan.before_collect, sim, plan.checker, scratch if sim is not None else None)


def _sim_vendor(specs: Any) -> str:
    """Whose chips the simulated node has: the vendor the faults asked for (AMD's, Ascend's), else NVIDIA."""
    from agent.sim.faults import FAULTS
    from starpulse.app.nodecheck import ExpectError

    vendors = {v for spec in specs if (k := FAULTS.get(spec.partition(":")[0])) is not None and (v := k.needs_vendor)}
    if len(vendors) > 1:
        raise ExpectError(
            f"--sim-fault: one node has one vendor's chips, these faults need {', '.join(sorted(vendors))}"
        )
    return vendors.pop() if vendors else "nvidia"


def _inject(sim: Any, spec: str) -> None:
    """Apply ``KIND[:INDEX]`` from the fault table to the simulated node (demos and tests)."""
    from agent.sim.faults import FAULTS
    from starpulse.app.nodecheck import ExpectError

    name, _, index = spec.partition(":")
    kind = FAULTS.get(name)
    if kind is not None and kind.node is None:  # a known kind, but of the fabric or the cluster
        where = "the probes' data plane" if kind.probed else "a cluster"
        raise ExpectError(
            f"--sim-fault {spec}: {name} acts on {where}, not on one node:"
            " put it in a scenario (starpulse scenario run)"
        )
    if kind is None or kind.node is None:
        known = ", ".join(k.name for k in FAULTS if k.node is not None)
        raise ExpectError(f"--sim-fault {spec}: unknown node fault {name!r} (known: {known})")
    if not index.isdigit() and index:
        raise ExpectError(f"--sim-fault {spec}: the index after ':' must be a number")
    try:  # through the node, so the kind's parameters get their defaults (gpu_xid's xid)
        sim.inject(name, f"{kind.node.part}-{index or 0}")
    except ValueError as err:
        raise ExpectError(f"--sim-fault {spec}: {err}") from None


def _scan(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    """(exit code, output) of one scan; raises _Refused for input the user must fix."""
    from agent.collectors.accel.check import check_report
    from agent.collectors.kmsg import scan_file
    from agent.factory import BackendUnavailable
    from agent.runtime import CollectorSet
    from starpulse.app import nodecheck

    expected = nodecheck.load_expected(args.expect) if args.expect else None
    if args.sim_fault and args.backend != "sim":
        raise nodecheck.ExpectError("--sim-fault needs --backend sim")
    if args.kmsg and not Path(args.kmsg).exists():
        raise nodecheck.ExpectError(f"--kmsg {args.kmsg}: no such file")
    if args.sysfs_root and not Path(args.sysfs_root).is_dir():
        raise nodecheck.ExpectError(f"--sysfs-root {args.sysfs_root}: no such directory")
    findings: list[Any] = []
    accel = _accelerators_expected(args, expected)
    try:
        plan = _build(args, findings, accel)
    except BackendUnavailable as exc:
        raise _Unavailable(f"could not check: backend {args.backend} unavailable: {exc}") from None
    collectors = CollectorSet(plan.collectors)
    try:
        collectors.probe()
        inventory = collectors.describe()
        for hook in plan.inventory_hooks:
            hook(inventory)
        reports = []
        for seq in (1, 2):
            if plan.before_collect is not None:
                plan.before_collect(1.0)
            result = collectors.collect(seq=seq)
            if plan.checker is not None:
                check_report(plan.checker, result.report)  # "could not check" unless the chips were read
            if not result.report.timestamp_ms:
                result.report.timestamp_ms = int(time.time() * 1000)
            reports.append(result.report)
            findings.extend(result.findings)
            if seq == 1:
                time.sleep(args.window)
        kmsg = args.kmsg or (None if plan.sim is None else plan.sim.kmsg_path)
        if kmsg:
            findings.extend(collectors.localise(f) for f in scan_file(kmsg))
    finally:
        collectors.close()
        if plan.scratch is not None:
            plan.scratch.cleanup()  # nothing left behind in the temp folder
    verdict = nodecheck.judge(args.node or inventory.host.hostname or "node", inventory, reports, findings, expected)
    out = {
        # docs/json.md: 64-bit counters and times as numbers, zero values kept, unset optionals null.
        "inventory": message_dict(inventory),
        "sample": message_dict(reports[-1]),
        "findings": [f.to_dict() for f in findings],
        "verdict": verdict.to_dict(),
    }
    return verdict.exit_code, out


def _accelerators_expected(args: argparse.Namespace, expected: Any) -> Any:
    """How many accelerators the node must show: --expect's gpus, else the agent's learned (or
    confirmed) inventory when the file is there, so a prolog holds the node to it too."""
    from agent.collectors.accel.check import Expected, LearnedError, LearnedInventory
    from starpulse.app.nodecheck import ExpectError

    if expected is not None and expected.gpus is not None:
        return Expected(expected.gpus, source="--expect")
    path = Path(args.learned)
    if not path.exists():
        return None
    try:
        return LearnedInventory(path).load()
    except LearnedError as exc:
        raise ExpectError(f"--learned {exc}") from None


class _Unavailable(RuntimeError):
    """The backend cannot run here: exit 2, one line."""


def cmd_scan(args: argparse.Namespace) -> int:
    from starpulse.app.nodecheck import ExpectError
    from starpulse.core.logs import configure_logging

    configure_logging("warning", fmt="console", stream=sys.stderr)
    if args.prolog or args.epilog:
        from starpulse.app.cli import preflight

        return preflight.run(args)
    try:
        code, out = _scan(args)
    except (ExpectError, _Unavailable) as exc:
        print(f"starpulse scan: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print_json("scan", out, sort_keys=True)
    else:
        _print_scan(out)
    return code


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
    for f in out["findings"]:
        xid = f" xid={f['xid']}" if "xid" in f else ""
        print(f"  [{f['severity']:>8}] {f['component']:<14} {f['kind']}{xid} -> {f['action']}: {f['message']}")
    verdict = out["verdict"]
    if verdict["conditions"]:
        print_table(
            [Col("SEVERITY", styled=True), Col("RULE"), Col("COMPONENT"), Col("ACTION"), Col("MESSAGE")],
            [[c["severity"], c["rule"], c["component"], c["action"], c["message"]] for c in verdict["conditions"]],
        )
    for p in verdict["problems"]:
        print(f"could not check: {p}")
    status = verdict["status"]
    print(f"verdict: {'could not check' if status == nodecheck_unknown() else status}")


def nodecheck_unknown() -> str:
    from starpulse.app.nodecheck import UNKNOWN

    return UNKNOWN


def register(sub: Any) -> None:
    """Add this group's commands to the top-level subparsers."""
    s = sub.add_parser("scan", help="this node's health verdict by the controller's rules (exit 0/1/2)")
    s.add_argument(
        "--backend",
        choices=_backends(),
        default="nvml",
        help="accelerator backend; 'none' scans without a driver (default: nvml)",
    )
    # Paths are checked by the scan itself, not by argparse: --prolog parses the same flags and
    # must fail open (exit 0) on bad input, never refuse the job by an argparse exit 2.
    s.add_argument(
        "--sysfs-root",
        default=None,
        help="root of the sysfs tree to read NICs from (default /sys)",
    )
    s.add_argument(
        "--kmsg",
        default=None,
        help="kernel log file to scan (dmesg, journalctl -k or /dev/kmsg text)",
    )
    s.add_argument(
        "--expect",
        default=None,
        metavar="FILE",
        help="expected inventory (YAML: gpus: 8, nics: [...])",
    )
    s.add_argument(
        "--learned",
        default=LEARNED_DEFAULT,
        metavar="FILE",
        help="the agent's learned accelerator inventory, used when there and --expect gives no gpus "
        f"(default: {LEARNED_DEFAULT})",
    )
    seconds_flag(s, "--window", 2.0, "seconds between the two samples, for counter rates")
    s.add_argument("--node", default=None, help="node name in the verdict (default: the host name)")
    count_flag(s, "--seed", 0, "with --backend sim: the node's seed", minimum=0)
    s.add_argument(
        "--sim-fault", action="append", metavar="KIND[:INDEX]", help="with --backend sim: inject a node fault first"
    )
    s.add_argument("--json", action="store_true", help=JSON_HELP)
    from starpulse.app.cli.preflight import add_flags

    add_flags(s)
    s.set_defaults(func=cmd_scan)
