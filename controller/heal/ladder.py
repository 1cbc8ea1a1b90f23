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
      spare_share: 1.2%             # validated nodes refill the pool to this share of the fleet's nodes
                                    # (rounded up, at least 1): set by measurement, see below
      spare_target: null            # or an absolute count of spares, which then wins (files from
                                    # before spare_share set it: they keep their meaning)
      lemon: {window: 7d, retire_after_returns: 3}

A rung is ``none`` (validate only: the fault may have cleared by itself), ``reset_gpu``,
``reboot`` or ``retire`` (the ladder's end: out for hardware inspection, RMA). A failed
validation climbs one rung. A node that comes back within ``lemon.window`` of its last
return starts one rung higher per return in the window (its lemon score), and after
``retire_after_returns`` returns in the window it is retired outright.

The spare pool's size is a share of the fleet because what it absorbs grows with the fleet:
faults arrive at a rate per GPU and each node stays out for its repair time, so the nodes out
at once scale with the node count. An absolute 1 leaves a 2,048-node job waiting for capacity;
16 would idle a sixth of a 96-node cluster. The default share was set with the fleet simulator
on the Llama 3 mix (``python -m bench.fleetsim_defaults``; bench/README.md, issue 28, "Defaults
set by measurement"): the smallest share at which a job spanning the fleet never waits for
capacity, at 256 and at 2,048 nodes.
"""

from __future__ import annotations

import math
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
SPARE_SHARE_PCT = 1.2  # percent of the fleet's nodes; measured, see the module docstring


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
    spare_target: int | None = None  # an absolute count; None: spare_share_pct of the fleet
    spare_share_pct: float = SPARE_SHARE_PCT

    def spare_target_for(self, fleet_nodes: int) -> int:
        """Available spares to keep in a fleet of ``fleet_nodes`` compute nodes: the absolute
        ``spare_target`` when set, else ``spare_share_pct`` of the fleet rounded up, at least 1
        (0 only for a share of 0: no pool)."""
        if self.spare_target is not None:
            return self.spare_target
        if self.spare_share_pct <= 0:
            return 0
        return max(1, math.ceil(self.spare_share_pct / 100 * fleet_nodes - 1e-9))

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
