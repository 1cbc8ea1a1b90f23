"""The agent's handler for controller commands (checkpoint request, diagnostic, GPU reset, reboot).

Disruptive commands run only where the operator configured them for this node: the
controller can ask, but the node decides. A configured command is an argv template
(``["nvidia-smi", "-r", "-i", "{gpu}"]``) run without a shell, its placeholders filled
from the command's args after validation, under a timeout. Every command is logged with
its outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import string
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

import structlog

from agent.jobs import JobGateway
from agent.stacks import StackCollector
from starpulse.v1 import service_pb2 as spb

log = structlog.get_logger(__name__)

# Kinds an operator may configure (CommandKind names without the prefix, lower case), and
# named validation diagnostics: ``diagnostic.NAME`` (the controller's policy asks for NAME).
CONFIGURABLE = ("gpu_reset", "reboot", "run_diagnostic", "diagnostic.NAME")
DIAGNOSTIC_PREFIX = "diagnostic."
DIAGNOSTIC_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
SAFE_VALUE = re.compile(r"^[A-Za-z0-9_.:@/][A-Za-z0-9_.:@/=-]{0,127}$")  # no leading '-': not an option
MAX_GPU_INDEX = 1023
OUTPUT_TAIL = 400
DIAGNOSTIC_OUTPUT_TAIL = 64 * 1024  # dcgmi diag -j of 8 GPUs is ~10 kB; the controller parses it
MAX_REQUESTED_TIMEOUT_S = 4 * 3600.0  # the longest time limit a controller may ask for (dcgmi -r 4 takes ~1.5 h)


def is_configurable(kind: str) -> bool:
    """A kind an operator may configure: a disruptive command, the default diagnostic, or a named one."""
    if kind.startswith(DIAGNOSTIC_PREFIX):
        return bool(DIAGNOSTIC_NAME.fullmatch(kind.removeprefix(DIAGNOSTIC_PREFIX)))
    return kind in CONFIGURABLE and kind != "diagnostic.NAME"


def requested_timeout(args: Mapping[str, str], default_s: float) -> float:
    """The controller's time limit for this command (``timeout_s``), within bounds; else the default."""
    try:
        t = float(args.get("timeout_s", ""))
    except ValueError:
        return default_s
    return t if 0 < t <= MAX_REQUESTED_TIMEOUT_S else default_s


class InvalidArgs(ValueError):
    """The command's args cannot fill the configured template safely."""


def kind_name(kind: int) -> str:
    """'gpu_reset' for COMMAND_KIND_GPU_RESET (the names used in --allow-command)."""
    try:
        return spb.CommandKind.Name(kind).removeprefix("COMMAND_KIND_").lower()
    except ValueError:
        return f"unknown_{kind}"


def _validate(name: str, value: str) -> str:
    if name == "gpu":
        if not value.isdigit() or int(value) > MAX_GPU_INDEX:
            raise InvalidArgs(f"gpu must be a GPU index (0..{MAX_GPU_INDEX}), got {value!r}")
        return str(int(value))
    if not SAFE_VALUE.fullmatch(value):
        raise InvalidArgs(f"{name}={value!r} is not a plain value")
    return value


def render_argv(template: Sequence[str], args: Mapping[str, str]) -> list[str]:
    """Fill ``{name}`` placeholders from args; every value validated ('gpu' must be an int)."""
    argv: list[str] = []
    formatter = string.Formatter()
    for token in template:
        values: dict[str, str] = {}
        for _literal, field_name, spec, conversion in formatter.parse(token):
            if field_name is None:
                continue
            if not field_name.isidentifier() or spec or conversion:
                raise InvalidArgs(f"bad placeholder in template token {token!r}")
            if field_name not in args:
                raise InvalidArgs(f"missing arg {field_name!r}")
            values[field_name] = _validate(field_name, args[field_name])
        argv.append(token.format(**values) if values else token)
    return argv


class CommandHandler:
    """``ControllerLink(on_command=...)``: turns a Command into a CommandResult, never raising."""

    def __init__(
        self,
        gateway: JobGateway | None,
        allowed: Mapping[str, Sequence[str]] | None = None,
        timeout_s: float = 120.0,
        job_pids: Callable[[str], list[tuple[int, int]]] | None = None,
    ) -> None:
        self.gateway = gateway
        self.allowed = {k: list(v) for k, v in (allowed or {}).items()}
        unknown = {k for k in self.allowed if not is_configurable(k)}
        if unknown:
            raise ValueError(f"unknown command kinds {sorted(unknown)}; configurable: {', '.join(CONFIGURABLE)}")
        for kind, argv in self.allowed.items():
            if not argv or not argv[0]:
                raise ValueError(f"empty argv for {kind}")
            render_argv(argv, _PROBE_ARGS)  # catches a malformed template at startup
        self.timeout_s = timeout_s
        # In-process actions for simulated hardware only (agent.sim.repairs): a simulated GPU
        # cannot be reset by a subprocess. Empty on a real node.
        self.local: dict[str, Callable[[dict[str, str]], Awaitable[tuple[bool, str]]]] = {}
        # Never disruptive: needs no operator configuration.
        self.stacks = StackCollector(gateway, job_pids=job_pids)

    async def __call__(self, command: spb.Command) -> spb.CommandResult:
        kind = kind_name(command.kind)
        args = dict(command.args)
        started = time.monotonic()
        payload = ""
        try:
            if kind == "collect_stacks":
                ok, message, data = await self.stacks.collect(args.get("job", ""))
                payload = json.dumps(data, separators=(",", ":")) if data else ""
            else:
                ok, message = await self._dispatch(kind, args)
        except Exception as exc:  # a handler bug must still answer the controller
            log.exception("command_error", id=command.id, kind=kind)
            ok, message = False, f"{type(exc).__name__}: {exc}"
        log.info(
            "command",
            id=command.id,
            kind=kind,
            args=args,
            ok=ok,
            message=message,
            duration_s=round(time.monotonic() - started, 3),
        )
        return spb.CommandResult(id=command.id, ok=ok, message=message, payload_json=payload)

    async def _dispatch(self, kind: str, args: dict[str, str]) -> tuple[bool, str]:
        if kind == "checkpoint_request":
            if self.gateway is None:
                return False, "no job gateway on this agent"
            job = args.get("job") or None
            asked = self.gateway.request_checkpoint(job)
            if asked == 0:
                return False, f"no registered ranks for job {job!r}" if job else "no registered jobs"
            return True, f"checkpoint requested from {asked} rank(s)"
        if kind in ("gpu_reset", "reboot"):
            if kind in self.local:
                return await self.local[kind](args)
            if kind not in self.allowed:
                return False, f"{kind} not allowed on this node"
            return await self._run(kind, args)
        if kind == "run_diagnostic":
            name = args.get("diagnostic", "")
            if name:  # a named validation diagnostic: only what this node configured under that name
                key = DIAGNOSTIC_PREFIX + name
                if key not in self.allowed:
                    return False, f"diagnostic {name!r} is not configured on this node"
                return await self._run(key, args, DIAGNOSTIC_OUTPUT_TAIL)
            if "run_diagnostic" in self.allowed:
                return await self._run(kind, args)
            return True, self._builtin_diagnostic()
        return False, f"unsupported command kind {kind}"

    async def _run(self, kind: str, args: dict[str, str], tail_chars: int = OUTPUT_TAIL) -> tuple[bool, str]:
        try:
            argv = render_argv(self.allowed[kind], args)
        except InvalidArgs as exc:
            return False, f"refused: {exc}"
        log.info("command_exec", kind=kind, argv=argv)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
        except OSError as exc:
            return False, f"cannot run {argv[0]}: {exc}"
        limit_s = requested_timeout(args, self.timeout_s)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout=limit_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return False, f"{argv[0]} timed out after {limit_s:g}s"
        tail = out.decode(errors="replace").strip()[-tail_chars:]
        if proc.returncode != 0:
            return False, f"{argv[0]} exited {proc.returncode}: {tail}".rstrip(": ")
        return True, f"{argv[0]} ok: {tail}".rstrip(": ")

    def _builtin_diagnostic(self) -> str:
        """A cheap self-check: host, load, uptime and the job ranks this agent knows."""
        parts = [f"host={socket.gethostname()}"]
        with contextlib.suppress(OSError):
            parts.append("load={:.2f},{:.2f},{:.2f}".format(*os.getloadavg()))
        with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/uptime") as fh:
            parts.append(f"uptime_s={float(fh.read().split()[0]):.0f}")
        if self.gateway is not None:
            ranks = self.gateway.ranks()
            jobs = sorted({r.job for r in ranks})
            parts.append(f"job_ranks={len(ranks)} jobs={','.join(jobs) or '-'}")
        return "built-in diagnostic: " + " ".join(parts)


class _ProbeArgs(dict[str, str]):
    """Any placeholder name is present with a harmless value (template check at startup)."""

    def __contains__(self, key: object) -> bool:
        return True

    def __missing__(self, key: str) -> str:
        return "0"


_PROBE_ARGS = _ProbeArgs()
