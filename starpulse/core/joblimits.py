"""What a job's progress may carry: one definition for the agent's job socket and the controller.

A local process reports its job's progress to the agent over the job socket (JSON lines,
``starpulse.job``); the agent copies it into every report, and the controller refuses a
report whose job samples break these limits. So the agent applies the very same limits at
the socket: a field that breaks one is dropped there (with a log line naming the job and the
field) and everything else keeps flowing, instead of one rank's NaN costing the node every
report. Integer bounds are those of the wire types (``JobStepSample`` in telemetry.proto).
"""

from __future__ import annotations

import math
from typing import Final

MAX_JOB_NAME: Final = 256  # characters
MAX_CHECKPOINT_PATH: Final = 4096  # characters
MAX_RANKS_PER_NODE: Final = 1024  # (job, rank) registrations one node's agent keeps
UINT32_MAX: Final = 2**32 - 1  # rank, pid, world_size
UINT64_MAX: Final = 2**64 - 1  # step, last_checkpoint_step, resumed_from_step
INT64_MAX: Final = 2**63 - 1  # last_checkpoint_ms

# field -> (lowest, highest) for the integer fields of JobStepSample
INT_BOUNDS: Final[dict[str, tuple[int, int]]] = {
    "rank": (0, UINT32_MAX),
    "pid": (0, UINT32_MAX),
    "world_size": (0, UINT32_MAX),
    "step": (0, UINT64_MAX),
    "last_checkpoint_step": (0, UINT64_MAX),
    "resumed_from_step": (0, UINT64_MAX),
    "last_checkpoint_ms": (0, INT64_MAX),
}


def job_name_problem(job: object) -> str | None:
    """Why ``job`` is no job name (None: it is one): a non-empty string of printable characters."""
    if not isinstance(job, str) or not job:
        return "must be a non-empty string"
    if len(job) > MAX_JOB_NAME:
        return f"is {len(job)} characters long (max {MAX_JOB_NAME})"
    if not job.isprintable():
        return "carries control characters"
    return None


def int_problem(field: str, value: object) -> str | None:
    """Why ``value`` cannot be the integer field ``field`` (None: it can)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"is not an integer ({value!r})"
    low, high = INT_BOUNDS[field]
    if not low <= value <= high:
        return f"is out of range {low}..{high} ({value})"
    return None


def step_time_problem(value: object) -> str | None:
    """Why ``value`` is no step time (None: it is one): a finite number of seconds, not negative."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"is not a number ({value!r})"
    if not math.isfinite(value) or value < 0:
        return f"is not a finite, non-negative number ({value})"
    return None


def text_problem(value: object, limit: int) -> str | None:
    """Why ``value`` cannot be a text field of at most ``limit`` characters."""
    if not isinstance(value, str):
        return f"is not a string ({type(value).__name__})"
    if len(value) > limit:
        return f"is {len(value)} characters long (max {limit})"
    return None
