"""The `starpulse` command: services (controller, agent, relay), one-shot checks, queries, the demo.

One module per command group; each adds its commands with ``register(sub)``. This module only
builds the parser and runs the chosen command.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from typing import Any

from starpulse import __version__
from starpulse.app.cli import (
    accelerators,
    admin,
    files,
    fleetsim,
    incident,
    nodes,
    query,
    report,
    scan,
    services,
    simulate,
    topology,
)
from starpulse.app.cli.common import ADMIN_TOKEN_ENV, DEFAULT_CONTROLLER, OneLineParser, client_token, tls_settings
from starpulse.app.cli.services import cmd_agent, cmd_controller, cmd_relay, overrides

__all__ = [
    "ADMIN_TOKEN_ENV",
    "DEFAULT_CONTROLLER",
    "EXIT_BUG",
    "build_parser",
    "client_token",
    "cmd_agent",
    "cmd_controller",
    "cmd_relay",
    "entrypoint",
    "main",
    "overrides",
    "tls_settings",
]

# An unexpected error (a bug) exits with this, never with 2 (a user's bad input) nor 1 (unhealthy).
EXIT_BUG = 70  # EX_SOFTWARE in sysexits.h

_GROUPS = (scan, accelerators, nodes, query, report, incident, admin, topology, simulate, fleetsim, files)


def cmd_version(args: argparse.Namespace) -> int:
    print(f"starpulse {__version__}")
    return 0


def subparsers(parser: argparse.ArgumentParser) -> Any:
    """The parser's subcommand action (argparse keeps it among the actions)."""
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``only``, the service commands other than that one get no flags."""
    p = OneLineParser(prog="starpulse", description=__doc__.split("\n", 1)[0])
    p.add_argument("--version", action="version", version=f"starpulse {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    services.register(sub, only)
    for group in _GROUPS:
        group.register(sub)
    v = sub.add_parser("version", help="print the version")
    v.set_defaults(func=cmd_version)
    return p


def _command_of(argv: Sequence[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    given = list(argv if argv is not None else sys.argv[1:])
    args = build_parser(_command_of(given) or "").parse_args(given)
    args.argv = given  # which flags were given (they win over the file and the environment)
    from starpulse.core.logs import configure_logging

    # One-shot commands keep stdout for their output; services reconfigure for JSON on stdout.
    configure_logging("warning", fmt="console", stream=sys.stderr)
    from starpulse.core.schema import ConfigError

    if getattr(args, "client_file_error", None):  # a client command, and its settings file is unusable
        print(f"starpulse {args.command}: {args.client_file_error}", file=sys.stderr)
        return 2
    try:
        return int(args.func(args))
    except ConfigError as exc:  # a bad TLS, token, rules, policy or fabric file: one line each, not a traceback
        for line in exc.errors:
            print(f"starpulse {args.command}: {line}", file=sys.stderr)
        return 2
    except Exception:  # nothing a user can cause gets here: a bug keeps its traceback, in the log, and its own code
        import structlog

        structlog.get_logger("starpulse.cli").exception("unexpected_error", command=args.command)
        print(f"starpulse {args.command}: internal error (a bug: its traceback is in the log above)", file=sys.stderr)
        return EXIT_BUG


def entrypoint() -> int:
    """The console script: like main(), but a closed stdout (`starpulse … | head`) ends quietly.

    Kept out of main() because tests call main() in-process, where SIG_DFL for SIGPIPE
    would let any write to a closed pipe kill the test runner.
    """
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    return main()
