"""The repair ladder and the validation before return, as data (the policy file's ``repair:``).

Why data: which repair a fleet tries first, how long a reboot may take and which
diagnostics prove a node healthy differ per site and per incident kind (a GPU reset is
enough for an Xid 43 on one fleet, another always reboots; one has DCGM, another runs a
burn-in). Schema, with the defaults this module uses when the section or a key is absent::

    repair:
      ladders:                      # rungs a node climbs, per incident kind (default: any other)
        gpu_fault: [reset_gpu, reboot, retire]
        default: [reboot, retire]
      timeouts: {reset_gpu: 10m, reboot: 20m}
      validation:
        default:
          scan_clean: true          # its incident's conditions resolved, no other incident open on it
          clear_within: 5m          # how long the repaired node gets for that (reports lag a repair)
          evidence_quiet: 2m        # then nothing new (the Xid not repeating) for this long
          diagnostics:              # run by the node's agent (run_diagnostic), in order
            - {name: dcgm_r2, timeout: 15m, pass: dcgmi}     # dcgmi diag -r 2 -j, parsed
            - {name: burn_in, timeout: 10m, pass: exit_ok}
            - {name: nccl_loopback, timeout: 5m, pass: "regex:Avg bus bandwidth"}
      return_to: spare              # spare: refill the pool up to its target first; service: back to work
      spare_target: 1               # validated nodes refill the pool to this many available spares
      lemon: {window: 7d, retire_after_returns: 3}

A rung is ``none`` (validate only: the fault may have cleared by itself), ``reset_gpu``,
``reboot`` or ``retire`` (the ladder's end: out for hardware inspection, RMA). A failed
validation climbs one rung. A node that comes back within ``lemon.window`` of its last
return starts one rung higher per return in the window (its lemon score), and after
``retire_after_returns`` returns in the window it is retired outright.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from starpulse.core.units import BadValue, parse_quantity

NONE = "none"
RESET_GPU = "reset_gpu"
REBOOT = "reboot"
RETIRE = "retire"
RUNGS: tuple[str, ...] = (NONE, RESET_GPU, REBOOT, RETIRE)
PASS_KINDS = ("exit_ok", "dcgmi", "regex:<pattern>")
RETURN_TO = ("spare", "service")
DIAG_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
_KEYS = ("ladders", "timeouts", "validation", "return_to", "spare_target", "lemon")
_VALIDATION_KEYS = ("scan_clean", "clear_within", "evidence_quiet", "diagnostics")
_DIAG_KEYS = ("name", "timeout", "pass", "args")


@dataclass(frozen=True)
class Diagnostic:
    """One check the agent runs: its configured name there, a time limit, how to read the output."""

    name: str
    timeout_s: float
    passes: str = "exit_ok"  # exit_ok | dcgmi | regex:<pattern>
    args: str = ""  # passed to the agent's template as {args}


@dataclass(frozen=True)
class Validation:
    """What must hold before a repaired node goes back: scan verdict, evidence gone, diagnostics."""

    scan_clean: bool = True
    evidence_quiet_s: float = 120.0
    diagnostics: tuple[Diagnostic, ...] = ()
    clear_within_s: float = 300.0


@dataclass(frozen=True)
class Lemon:
    window_s: float = 7 * 86400.0
    retire_after_returns: int = 3


@dataclass(frozen=True)
class RepairPolicy:
    """The ``repair:`` section, checked; ``ladder``/``validation`` answer per incident kind."""

    ladders: dict[str, tuple[str, ...]] = field(
        default_factory=lambda: {"gpu_fault": (RESET_GPU, REBOOT, RETIRE), "default": (REBOOT, RETIRE)}
    )
    timeouts_s: dict[str, float] = field(default_factory=lambda: {RESET_GPU: 600.0, REBOOT: 1200.0})
    validations: dict[str, Validation] = field(default_factory=lambda: {"default": Validation()})
    return_to: str = "spare"
    lemon: Lemon = field(default_factory=Lemon)
    spare_target: int = 1

    def ladder(self, kind: str) -> tuple[str, ...]:
        return self.ladders.get(kind) or self.ladders.get("default") or (REBOOT, RETIRE)

    def validation(self, kind: str) -> Validation:
        return self.validations.get(kind) or self.validations.get("default") or Validation()

    def timeout_s(self, rung: str) -> float:
        return self.timeouts_s.get(rung, 600.0)

    def first_rung(self, kind: str, requested: str | None, lemon_score: int) -> int:
        """Where a node starts: the policy's requested repair (when on the ladder), else the
        bottom, plus one rung per recent return (the lemon score), never past the top."""
        ladder = self.ladder(kind)
        start = ladder.index(requested) if requested in ladder else 0
        return min(start + lemon_score, len(ladder) - 1)


def _duration(raw: Any, where: str, errors: list[str]) -> float | None:
    try:
        return parse_quantity(raw, ("time",)).value
    except BadValue as err:
        errors.append(f"{where}: {err}")
        return None


def _whole(raw: Any, least: int, default: int, where: str, errors: list[str]) -> int:
    """A whole number ≥ ``least`` (absent: ``default``); a bad one is reported and the default used."""
    if raw is None:
        return default
    if not isinstance(raw, int) or isinstance(raw, bool) or raw < least:
        errors.append(f"{where}: expected a whole number ≥ {least}, got {raw!r}")
        return default
    return raw


def _diagnostic(raw: Any, where: str, errors: list[str]) -> Diagnostic | None:
    if not isinstance(raw, dict):
        errors.append(f"{where}: expected a mapping with name, timeout, pass")
        return None
    for key in raw:
        if key not in _DIAG_KEYS:
            errors.append(f"{where}: unknown key {key!r} (expected one of {', '.join(_DIAG_KEYS)})")
    name = str(raw.get("name", ""))
    if not DIAG_NAME.fullmatch(name):
        errors.append(f"{where}.name: {name!r} is not a diagnostic name (lower case, digits, _)")
    timeout = _duration(raw.get("timeout", "10m"), f"{where}.timeout", errors)
    passes = str(raw.get("pass", "exit_ok"))
    if passes.startswith("regex:"):
        try:
            re.compile(passes[6:])
        except re.error as err:
            errors.append(f"{where}.pass: bad regex: {err}")
    elif passes not in ("exit_ok", "dcgmi"):
        errors.append(f"{where}.pass: {passes!r} (expected one of {', '.join(PASS_KINDS)})")
    if timeout is None:
        return None
    return Diagnostic(name, timeout, passes, str(raw.get("args", "")))


def _validation(raw: Any, where: str, errors: list[str]) -> Validation:
    if not isinstance(raw, dict):
        errors.append(f"{where}: expected a mapping with {', '.join(_VALIDATION_KEYS)}")
        return Validation()
    for key in raw:
        if key not in _VALIDATION_KEYS:
            errors.append(f"{where}: unknown key {key!r} (expected one of {', '.join(_VALIDATION_KEYS)})")
    quiet = _duration(raw.get("evidence_quiet", "2m"), f"{where}.evidence_quiet", errors)
    clear_within = _duration(raw.get("clear_within", "5m"), f"{where}.clear_within", errors)
    diags_raw = raw.get("diagnostics", [])
    if not isinstance(diags_raw, list):
        errors.append(f"{where}.diagnostics: expected a list")
        diags_raw = []
    diags = [_diagnostic(d, f"{where}.diagnostics[{i}]", errors) for i, d in enumerate(diags_raw)]
    return Validation(
        bool(raw.get("scan_clean", True)),
        quiet or 0.0,
        tuple(d for d in diags if d is not None),
        clear_within if clear_within is not None else 300.0,
    )


# One flat pass over five small sub-sections, each line a check with its own message;
# splitting it would only scatter the schema across helpers.
def parse_repair(raw: Any, where: str, errors: list[str]) -> RepairPolicy:  # noqa: C901
    """Check the ``repair:`` section; problems go to ``errors`` (one line each, naming the key)."""
    default = RepairPolicy()
    if raw is None:
        return default
    if not isinstance(raw, dict):
        errors.append(f"{where}: expected a mapping with {', '.join(_KEYS)}")
        return default
    for key in raw:
        if key not in _KEYS:
            errors.append(f"{where}: unknown key {key!r} (expected one of {', '.join(_KEYS)})")
    ladders = dict(default.ladders)
    for kind, rungs in (raw.get("ladders") or {}).items():
        w = f"{where}.ladders.{kind}"
        if not isinstance(rungs, list) or not rungs:
            errors.append(f"{w}: expected a list of rungs ({', '.join(RUNGS)})")
            continue
        bad = [r for r in rungs if r not in RUNGS]
        if bad:
            errors.append(f"{w}: unknown rung(s) {bad} (expected any of {', '.join(RUNGS)})")
            continue
        if rungs[-1] != RETIRE:
            errors.append(f"{w}: the last rung must be {RETIRE!r}, so a node that never passes is taken out")
            continue
        ladders[str(kind)] = tuple(rungs)
    timeouts = dict(default.timeouts_s)
    for rung, value in (raw.get("timeouts") or {}).items():
        if rung not in (RESET_GPU, REBOOT):
            errors.append(f"{where}.timeouts: unknown rung {rung!r} (expected {RESET_GPU}, {REBOOT})")
            continue
        t = _duration(value, f"{where}.timeouts.{rung}", errors)
        if t is not None:
            timeouts[str(rung)] = t
    validations = dict(default.validations)
    for kind, v in (raw.get("validation") or {}).items():
        validations[str(kind)] = _validation(v, f"{where}.validation.{kind}", errors)
    return_to = str(raw.get("return_to", default.return_to))
    if return_to not in RETURN_TO:
        errors.append(f"{where}.return_to: {return_to!r} (expected one of {', '.join(RETURN_TO)})")
        return_to = default.return_to
    target = _whole(raw.get("spare_target"), 0, default.spare_target, f"{where}.spare_target", errors)
    lemon = default.lemon
    lemon_raw = raw.get("lemon")
    if isinstance(lemon_raw, dict):
        window = _duration(lemon_raw.get("window", "7d"), f"{where}.lemon.window", errors)
        n = _whole(lemon_raw.get("retire_after_returns"), 1, lemon.retire_after_returns,
                   f"{where}.lemon.retire_after_returns", errors)  # fmt: skip
        lemon = Lemon(window if window is not None else lemon.window_s, n)
    elif lemon_raw is not None:
        errors.append(f"{where}.lemon: expected a mapping with window, retire_after_returns")
    return RepairPolicy(ladders, timeouts, validations, return_to, lemon, target)
