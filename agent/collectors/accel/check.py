"""Never healthy for what was not read: whether this cycle's accelerator reads can be judged.

A backend that is unsupported here (its tool missing, failing, or printing what its parser
cannot read), that raised this cycle, or that answered for no accelerator at all leaves the
node *not judged*, unless the expected inventory says zero. A node that answers for fewer
accelerators than expected is not judged either: the tool still answers, but chips are gone.
The same rule for every backend, NVIDIA's included; ``starpulse scan`` (exit 2, "could not
check") and the agent (``Report.accelerator_check``, an ``accel_check`` event on each change)
both read it here.

The expected inventory comes from the agent's settings (``accelerators.expected_count``) or
is learned at first sight into a small JSON file beside the event buffer and confirmed by a
person (``starpulse accelerators confirm``), so a node that boots one chip short after its
first start is still caught.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

from starpulse.core.findings import Finding
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

SETTINGS, LEARNED, CONFIRMED = "settings", "learned", "learned, confirmed"
LEARNED_FILE = "accelerators.json"
_MAX_REASON = 300  # one line: the tool's words, cut where they stop helping


@dataclass(frozen=True)
class Expected:
    """How many accelerators of which vendor this node must show, and who said so."""

    count: int
    vendor: str = ""
    source: str = SETTINGS


class LearnedError(ValueError):
    """The learned-inventory file cannot be read or written (one line naming the file)."""


def one_line(text: str) -> str:
    """A tool's output as one line: whitespace folded, cut at a readable length."""
    flat = " ".join(text.split())
    return flat if len(flat) <= _MAX_REASON else flat[: _MAX_REASON - 1] + "…"


class LearnedInventory:
    """The inventory the agent saw first, kept in ``path``; a person confirms it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def load(self) -> Expected | None:
        """The learned inventory, or None before the first sight; LearnedError when it is unreadable."""
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise LearnedError(f"{self.path}: cannot read the learned accelerator inventory: {exc}") from None
        count = raw.get("count") if isinstance(raw, dict) else None
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise LearnedError(f"{self.path}: 'count' must be a whole number, got {count!r}")
        source = CONFIRMED if raw.get("confirmed") is True else LEARNED
        return Expected(count, str(raw.get("vendor", "")), source)

    def learn(self, count: int, vendor: str) -> Expected:
        """Keep what was seen first (unconfirmed); a count of zero is never learned."""
        self._write({"count": count, "vendor": vendor, "confirmed": False, "learned_ms": int(time.time() * 1000)})
        log.info("accelerators_learned", count=count, vendor=vendor, path=str(self.path))
        return Expected(count, vendor, LEARNED)

    def confirm(self, count: int | None = None) -> Expected:
        """A person vouches for the learned count (or sets another); LearnedError when there is none to confirm."""
        known = self.load()
        if known is None and count is None:
            raise LearnedError(f"{self.path}: nothing learned yet: start the agent once, or give --count")
        vendor = known.vendor if known is not None else ""
        final = count if count is not None else (known.count if known is not None else 0)
        self._write({"count": final, "vendor": vendor, "confirmed": True, "confirmed_ms": int(time.time() * 1000)})
        return Expected(final, vendor, CONFIRMED)

    def _write(self, body: dict[str, object]) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(body, sort_keys=True) + "\n", encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            raise LearnedError(f"{self.path}: cannot write: {exc.strerror or exc}") from None


class AcceleratorChecker:
    """Judges each cycle's accelerator reads and says when the judgement changes.

    ``expected`` from the settings wins; else ``learned`` (when given) supplies it, and the
    first cycle that reads at least one accelerator is learned.
    """

    def __init__(
        self,
        backend: str,
        vendor: str,
        tool: str,
        expected: Expected | None = None,
        learned: LearnedInventory | None = None,
    ) -> None:
        self.backend, self.vendor, self.tool = backend, vendor, tool
        self._learned = learned
        self.expected = expected
        if expected is None and learned is not None:
            try:
                self.expected = learned.load()
            except LearnedError as exc:  # a broken file must not stop monitoring: judged as if unknown
                log.warning("accelerators_learned_unreadable", error=str(exc))
        # The judgement last said to the controller; a node never said otherwise is judged there.
        self._last: tuple[bool, str] = (True, "")

    def resume(self, judged: bool, reason: str) -> None:
        """Start from what the previous run said last (kept beside the event buffer), so a
        restart neither repeats an unchanged judgement nor misses clearing an old one."""
        self._last = (judged, reason)

    def judge(self, supported: bool, error: str, found: int) -> tpb.AcceleratorCheck:
        """The check of one cycle: ``supported``/``error`` are the backend collector's state."""
        check = tpb.AcceleratorCheck(backend=self.backend, vendor=self.vendor, tool=self.tool, found=found)
        exp = self.expected
        if exp is not None:
            check.expected = exp.count
            check.expected_source = exp.source
        if exp is not None and exp.count == 0 and found == 0:
            pass  # a node expected to have none: nothing unread
        elif not supported or error:
            said = one_line(error) or "not available"
            check.reason = said if said.startswith(self.tool) else f"{self.tool}: {said}"
        elif found == 0 and (exp is None or exp.count > 0):
            check.reason = f"{self.tool} answered but found no {self.vendor} accelerator"
        elif exp is not None and found < exp.count:
            check.reason = f"{self.tool} found {found} {self.vendor} accelerators, expected {exp.count} ({exp.source})"
        check.judged = not check.reason
        if check.judged and exp is None and found > 0 and self._learned is not None:
            try:
                self.expected = self._learned.learn(found, self.vendor)
                check.expected, check.expected_source = found, LEARNED
            except LearnedError as exc:
                log.warning("accelerators_learn_failed", error=str(exc))
        return check

    def change(self, check: tpb.AcceleratorCheck) -> Finding | None:
        """An ``accel_check`` finding when the judgement differs from the last one said."""
        key = (check.judged, check.reason)
        if key == self._last:
            return None
        self._last = key
        if check.judged:
            message = f"{self.tool}: {check.found} {self.vendor} accelerators read"
            return Finding(
                "accel_check", "node", "info", "none", message, "agent", attributes={"judged": "true", "reason": ""}
            )
        return Finding(
            "accel_check",
            "node",
            "warning",
            "investigate",
            f"not judged: {check.reason}",
            "agent",
            attributes={"judged": "false", "tool": self.tool, "reason": check.reason},
        )


class UnreadBackend:
    """Stands where a backend could not be built (its library or tool is missing): it reads
    nothing and says why, so the agent still watches the NICs and the kernel log and reports
    the node as not judged instead of exiting."""

    name = "gpu"
    interconnect = ""

    def __init__(self, vendor: str, tool: str, reason: str) -> None:
        self.vendor, self.tool = vendor, tool
        self.unavailable_reason = reason

    def supported(self) -> bool:
        return False

    def describe(self, inventory: object) -> None:
        """Nothing was read."""

    def collect(self, report: object) -> list[Finding]:
        return []

    def start_events(self) -> None:
        """No events from a backend that is not there."""

    def close(self) -> None:
        """Nothing held."""


def check_report(checker: AcceleratorChecker, report: tpb.Report, collector: str = "gpu") -> Finding | None:
    """Judge the accelerator collector's status in ``report``, set ``report.accelerator_check``;
    the ``accel_check`` finding when the judgement changed."""
    status = next((c for c in report.collectors if c.name == collector), None)
    supported = status is not None and status.supported
    error = "" if status is None else (status.error if (not status.supported or not status.ok) else "")
    if status is None:
        error = "no accelerator collector ran"
    check = checker.judge(supported, error, len(report.gpus))
    report.accelerator_check.CopyFrom(check)
    return checker.change(check)
