"""Files an operator makes or checks: settings files and a throwaway test CA."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from starpulse.app.cli.common import creatable_folder, readable_path


def cmd_tls_make_test_ca(args: argparse.Namespace) -> int:
    from starpulse.core.names import InvalidName
    from starpulse.core.tls import make_test_ca

    nodes = [n.strip() for part in args.nodes for n in part.split(",") if n.strip()]
    hosts = [
        h.strip() for part in (args.controller_host or ["localhost,127.0.0.1"]) for h in part.split(",") if h.strip()
    ]
    try:
        ca = make_test_ca(Path(args.out), nodes, controller_hosts=hosts)
    except (InvalidName, ValueError, OSError) as exc:
        print(f"starpulse tls make-test-ca: {exc}", file=sys.stderr)
        return 2
    print(
        f"wrote a test CA to {args.out}: ca.pem, controller.pem (hosts {', '.join(hosts)}), "
        f"admin.pem and {len(ca.nodes)} node certificates (keys are mode 0600)"
    )
    print("not for production: the CA key (ca.key) sits next to the certificates")
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    """Print 'ok: <summary>' (exit 0), or every error one a line (exit 2)."""
    from starpulse.app.config import ConfigError, check_file

    try:
        summary = check_file(args.file, args.kind, reach=args.reach)
    except ConfigError as exc:
        for line in exc.errors:
            print(line)
        return 2
    print(f"ok: {summary}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """Every file's problems, one a line (exit 2 when any file has one); 'ok: FILE (kind): summary' otherwise."""
    from starpulse.app.check import check_all

    lines, ok = check_all(args.files, args.kind)
    for line in lines:
        print(line)
    return 0 if ok else 2


def cmd_config_example(args: argparse.Namespace) -> int:
    """Print a service's reference settings file (deploy/KIND.yaml): every setting at its default, documented."""
    from starpulse.app.config import example

    print(example(args.kind), end="")
    return 0


def register(sub: Any) -> None:
    """Add this group's commands to the top-level subparsers."""
    tl = sub.add_parser("tls", help="TLS helpers")
    tlsub = tl.add_subparsers(dest="tls_command", required=True)
    mk = tlsub.add_parser("make-test-ca", help="a throwaway CA with controller, admin and node certificates")
    mk.add_argument("--out", required=True, metavar="DIR", type=creatable_folder, help="folder for the PEM files")
    mk.add_argument("--nodes", action="append", required=True, metavar="ID,ID,...", help="node ids (comma-separated)")
    mk.add_argument(
        "--controller-host",
        action="append",
        metavar="HOST",
        help="host name or IP in the controller certificate (repeatable; default localhost,127.0.0.1)",
    )
    mk.set_defaults(func=cmd_tls_make_test_ca)

    from starpulse.app.check import KINDS

    ck = sub.add_parser(
        "check",
        help="check data files (settings, notify receivers, rules, policy, fabric, scenario): "
        "exit 0 and 'ok: ...' each, or exit 2 and every error, one a line naming the file and the key",
    )
    ck.add_argument("files", nargs="+", metavar="FILE")
    ck.add_argument("--kind", choices=KINDS, default=None, help="default: by the file's top-level keys")
    ck.set_defaults(func=cmd_check)

    cf = sub.add_parser("config", help="service configuration files")
    cfsub = cf.add_subparsers(dest="config_command", required=True)
    cfc = cfsub.add_parser(
        "check",
        help="check a controller, agent or relay file (and STARPULSE_* overrides): "
        "exit 0 and 'ok: <summary>', or exit 2 and every error, one a line",
    )
    cfc.add_argument("file", type=readable_path)
    cfc.add_argument(
        "--kind",
        choices=("controller", "agent", "relay"),
        default=None,
        help="default: by the sections in the file (agent/hardware: agent, relay: relay)",
    )
    cfc.add_argument(
        "--reach",
        action="store_true",
        help="also connect to the services the file names (etcd endpoints of ha.etcd), 2 s each",
    )
    cfc.set_defaults(func=cmd_config_check)
    cfe = cfsub.add_parser(
        "example", help="print a service's reference settings file: every setting at its default, documented"
    )
    cfe.add_argument("kind", choices=("controller", "agent", "relay"))
    cfe.set_defaults(func=cmd_config_example)
