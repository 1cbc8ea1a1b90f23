"""What the client commands share: the controller address, TLS and the admin token, one RPC with one-line errors."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DEFAULT_CONTROLLER = "127.0.0.1:50051"


def install_stop(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(sig, stop.set)


ADMIN_TOKEN_ENV = "STARPULSE_ADMIN_TOKEN"


def add_tls_flags(parser: argparse.ArgumentParser) -> None:
    pem = {"default": None, "metavar": "PEM", "type": some_file}
    parser.add_argument("--tls-ca", **pem, help="CA certificate (mutual TLS; with the two below)")
    parser.add_argument("--tls-cert", **pem, help="this side's certificate")
    parser.add_argument("--tls-key", **pem, help="this side's private key")


CONTROLLER_ENV = "STARPULSE_CONTROLLER"
JSON_HELP = "print JSON instead of the table (versioned: docs/json.md)"
JSON_SCHEMA_PREFIX = "starpulse.v1/"


def print_json(kind: str, payload: Mapping[str, Any], *, sort_keys: bool = False) -> None:
    """A ``--json`` document: a top-level ``schema`` (``starpulse.v1/<kind>``, docs/json.md) beside the payload.

    Scripts check the schema before reading: a key that changes meaning gets a new version.
    """
    print(json.dumps({"schema": JSON_SCHEMA_PREFIX + kind, **payload}, indent=2, sort_keys=sort_keys))


def add_client_flags(parser: argparse.ArgumentParser) -> None:
    """--controller, TLS and the admin token: flag > environment > client file > default.

    The agent's and relay's .env files set STARPULSE_CONTROLLER to their controllers, comma-separated:
    a client command on that host asks the first (a standby answers reads too). The client file
    (starpulse.app.cli.clientfile) is an operator's own: ~/.config/starpulse/client.toml.
    """
    import os

    from starpulse.app.cli.clientfile import load

    client = load()
    from_file = client.values
    parser.add_argument(
        "--controller",
        default=os.environ.get(CONTROLLER_ENV, "").split(",")[0].strip()
        or from_file.get("controller")
        or DEFAULT_CONTROLLER,
        type=address,
        metavar="HOST:PORT",
        help=f"the controller's gRPC address (default: the first of ${CONTROLLER_ENV}, else controller in "
        f"{client.path}, else {DEFAULT_CONTROLLER})",
    )
    add_tls_flags(parser)
    parser.add_argument(
        "--admin-token-file",
        default=None,
        metavar="PATH",
        type=some_file,
        help=f"file whose first line is the admin token to send (default: ${ADMIN_TOKEN_ENV}, else "
        f"admin_token_file in {client.path})",
    )
    parser.set_defaults(
        tls_ca=from_file.get("tls_ca"),
        tls_cert=from_file.get("tls_cert"),
        tls_key=from_file.get("tls_key"),
        file_admin_token_file=from_file.get("admin_token_file"),
        client_file_error=client.error,  # said by main() as one line, for the client commands only
    )


def tls_settings(args: argparse.Namespace) -> Any:
    """TLSSettings from --tls-ca/--tls-cert/--tls-key (all three or none); ValueError otherwise."""
    given = [args.tls_ca, args.tls_cert, args.tls_key]
    if not any(given):
        return None
    if not all(given):
        raise ValueError("--tls-ca, --tls-cert and --tls-key go together")
    from starpulse.core.tls import TLSSettings

    return TLSSettings(ca_file=Path(args.tls_ca), cert_file=Path(args.tls_cert), key_file=Path(args.tls_key))


def client_token(args: argparse.Namespace) -> str | None:
    """The admin token to send: --admin-token-file (its first token), else $STARPULSE_ADMIN_TOKEN, else the
    client file's admin_token_file."""
    import os

    from starpulse.core.auth import load_tokens

    if getattr(args, "admin_token_file", None):
        return load_tokens(args.admin_token_file)[0]
    from_env = os.environ.get(ADMIN_TOKEN_ENV, "").strip()
    if from_env:
        return from_env
    if getattr(args, "file_admin_token_file", None):  # the client file's, below the flag and the environment
        return load_tokens(args.file_admin_token_file)[0]
    return None


def client_channel(args: argparse.Namespace) -> Any:
    """A channel to args.controller: mutual TLS when --tls-* are given, the admin token on every call."""
    import grpc

    from starpulse.core.schema import ConfigError

    try:
        tls = tls_settings(args)
    except ValueError as exc:  # the flags' combination: one line from main(), like a bad file
        raise ConfigError([str(exc)]) from None
    if tls is not None:
        from starpulse.core.tls import load_channel_credentials

        channel = grpc.secure_channel(args.controller, load_channel_credentials(tls))
    else:
        channel = grpc.insecure_channel(args.controller)
    token = client_token(args)
    if token is None:
        return channel
    from starpulse.core.auth import bearer_metadata

    extra = list(bearer_metadata(token))

    class CallDetails(grpc.ClientCallDetails):
        def __init__(self, details: Any, metadata: list[tuple[str, str]]) -> None:
            self.method = details.method
            self.timeout = details.timeout
            self.metadata = metadata
            self.credentials = details.credentials
            self.wait_for_ready = getattr(details, "wait_for_ready", None)
            self.compression = getattr(details, "compression", None)

    class TokenInterceptor(grpc.UnaryUnaryClientInterceptor):
        """Adds ``authorization: Bearer <token>`` to every unary call."""

        def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
            metadata = [*(client_call_details.metadata or ()), *extra]
            return continuation(CallDetails(client_call_details, metadata), request)

    return grpc.intercept_channel(channel, TokenInterceptor())


def query_stub(args: argparse.Namespace) -> Any:
    from starpulse.v1 import service_pb2_grpc as sgrpc

    return sgrpc.QueryStub(client_channel(args))


def admin_stub(args: argparse.Namespace) -> Any:
    from starpulse.v1 import service_pb2_grpc as sgrpc

    return sgrpc.AdminStub(client_channel(args))


def age(ms: int) -> str:
    if not ms:
        return "never"
    s = max(0.0, time.time() - ms / 1000)
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago"


def rpc(command: str, args: argparse.Namespace, stub: Any, method: str, request: Any, timeout_s: float) -> Any:
    """One RPC; None (after one line on stderr naming the controller and the status) when it fails."""
    import grpc

    try:
        return getattr(stub, method)(request, timeout=timeout_s)
    except grpc.RpcError as exc:
        print(f"starpulse {command}: controller {args.controller}: {exc.code().name} {exc.details()}", file=sys.stderr)
        return None


def admin_call(command: str, args: argparse.Namespace, method: str, request: Any) -> Any:
    """One Admin RPC; None (after one line on stderr) when it fails."""
    return rpc(command, args, admin_stub(args), method, request, 30)


def message_dict(message: Any) -> dict[str, Any]:
    """A reply as `--json` prints it: plain values a script can use without knowing protobuf's JSON mapping.

    Numbers stay numbers (protobuf's JSON writes 64-bit integers as strings), enums are their short
    lower-case names (``compute``, not ``NODE_ROLE_COMPUTE``), zero values are present (``index: 0``),
    and an optional field that is not set is null: absent means unsupported, never 0.
    """
    return {
        field.name: _plain_field(field, getattr(message, field.name), message) for field in message.DESCRIPTOR.fields
    }


def _plain_field(field: Any, value: Any, message: Any) -> Any:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        inner = field.message_type.fields_by_name["value"]
        return {str(k): _plain_value(inner, v) for k, v in value.items()}
    if field.is_repeated:
        return [_plain_value(field, v) for v in value]
    if field.has_presence and not message.HasField(field.name):
        return None
    return _plain_value(field, value)


def _plain_value(field: Any, value: Any) -> Any:
    if field.message_type is not None:
        return message_dict(value)
    if field.enum_type is not None:
        return enum_short_name(field.enum_type, value)
    return value


def enum_short_name(enum_type: Any, number: int) -> str | int:
    """``NODE_ROLE_COMPUTE`` of enum NodeRole as ``compute``; an unknown number stays a number."""
    import re

    known = enum_type.values_by_number.get(number)
    if known is None:
        return number
    prefix = re.sub(r"(?<!^)(?=[A-Z])", "_", enum_type.name).upper() + "_"
    return str(known.name).removeprefix(prefix).lower()


def whole(minimum: int = 0) -> Any:
    """An argparse type: a whole number >= minimum (``--limit -5`` is an error naming the flag, not a traceback)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {minimum}, got {value}")
        return value

    return parse


def seconds(minimum: float = 0.0, *, above: bool = False) -> Any:
    """An argparse type: seconds >= minimum (or > minimum with ``above``)."""
    sign = ">" if above else ">="

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number of seconds {sign} {minimum:g}, got {text!r}") from None
        if math.isnan(value) or value < minimum or (above and value == minimum):
            raise argparse.ArgumentTypeError(f"must be a number of seconds {sign} {minimum:g}, got {text}")
        return value

    return parse


def count_flag(parser: Any, name: str, default: int | None, help: str, minimum: int = 1, **kw: Any) -> None:
    """A whole-number flag >= minimum whose help ends with its default (written once, here)."""
    shown = "" if default is None else " (default: %(default)s)"
    parser.add_argument(name, type=whole(minimum), default=default, metavar="N", help=help + shown, **kw)


def seconds_flag(parser: Any, name: str, default: float, help: str, minimum: float = 0.0, above: bool = True) -> None:
    """A seconds flag (> minimum, or >= with above=False) whose help ends with its default and unit."""
    parser.add_argument(
        name, type=seconds(minimum, above=above), default=default, metavar="S", help=f"{help} (default: %(default)g s)"
    )


def _path_type(kind: Any) -> Any:
    def check(text: str) -> str:
        from starpulse.app.config.common import path_problem

        problem = path_problem(Path(text), kind)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return text

    check.__name__ = f"{kind} path"
    return check


# argparse types for path flags: a bad path is one line naming the flag, checked before anything runs.
readable_path = _path_type("input")  # a file to read (or a device such as /dev/kmsg)
readable_folder = _path_type("input-folder")
some_file = _path_type("file")  # a file whose absence is said later, in its own words (TLS, tokens)
creatable_folder = _path_type("folder")


def writable_file(text: str) -> Path:
    """An argparse type: a file path whose folder exists (the write itself may still fail, with one line)."""
    path = Path(text)
    folder = path.parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"folder {str(folder)!r} does not exist")
    return path


def address(text: str) -> str:
    """An argparse type: HOST:PORT with a port 0..65535 (0: any free port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"must be HOST:PORT, got {text!r}")
    return text


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line naming the command and the flag, like every other error; --help has the rest."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")
