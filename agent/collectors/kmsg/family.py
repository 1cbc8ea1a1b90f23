"""What a kernel-log pattern family is: a list of matchers and the words that wake them.

One family per driver (NVIDIA's NVRM/NVSwitch lines, mlx5, and whatever a backend adds:
an ``amdgpu`` module is one more family). A matcher sees one message and the reader's
per-family state and returns a finding, None (not mine), or :data:`FOLDED` (mine, but part
of a record already reported: an SXid's Severity and Data lines). The reader asks the
families in order and stops at the first that answers, so a family never has to know
about the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from starpulse.core.findings import Finding

SOURCE: Final = "kmsg"


class _Folded:
    """The answer for a line that belongs to a record already reported."""

    def __repr__(self) -> str:
        return "FOLDED"


FOLDED: Final = _Folded()

MatchResult = Finding | _Folded | None


@dataclass
class State:
    """A family's memory between lines of one log (open records, ports seen up)."""

    data: dict[str, Any] = field(default_factory=dict)


Matcher = Callable[[str, State], MatchResult]


@dataclass(frozen=True)
class Family:
    """A driver's matchers; ``words`` are substrings one of which a message must hold."""

    name: str
    words: tuple[str, ...]
    matchers: tuple[Matcher, ...]

    def wakes(self, message: str) -> bool:
        """Whether any matcher could care (a cheap substring test before the regexes)."""
        return any(w in message for w in self.words)
