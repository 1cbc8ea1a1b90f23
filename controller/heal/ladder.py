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

NONE = "none"
RESET_GPU = "reset_gpu"
REBOOT = "reboot"
RETIRE = "retire"
RUNGS: tuple[str, ...] = (NONE, RESET_GPU, REBOOT, RETIRE)
PASS_KINDS = ("exit_ok", "dcgmi", "regex:<pattern>")
RETURN_TO = ("spare", "service")
DIAG_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


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
