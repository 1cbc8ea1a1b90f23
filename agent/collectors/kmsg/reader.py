"""Turn kernel records into findings: the families in order, with their memory of the log.

A :class:`LogReader` reads one log (a file being scanned, or the live tail): it remembers
what multi-line records need (an SXid's Severity and Data lines, the journal's three-line
fallen-off-the-bus notice, mlx5 ports seen coming up). ``classify`` is the same for one
message on its own.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Iterator

from agent.collectors.kmsg import amdgpu, ascend, mlx5, nvidia
from agent.collectors.kmsg.family import Family, State, _Folded
from agent.collectors.kmsg.lines import KernelRecord, numbered_records
from starpulse.core.findings import Finding

# Every pattern family, asked in this order. A backend's family (e.g. amdgpu) is one more entry.
FAMILIES: tuple[Family, ...] = (nvidia.FAMILY, mlx5.FAMILY, amdgpu.FAMILY, ascend.FAMILY)


class LogReader:
    """Classifies the records of one log in order, keeping each family's state."""

    def __init__(self, families: Iterable[Family] = FAMILIES) -> None:
        self.families = tuple(families)
        self._states = {f.name: State() for f in self.families}

    def classify(self, message: str) -> Finding | None:
        """The finding this message stands for; None for ordinary and folded lines."""
        for fam in self.families:
            if not fam.wakes(message):
                continue
            state = self._states[fam.name]
            for matcher in fam.matchers:
                got = matcher(message, state)
                if isinstance(got, _Folded):
                    return None
                if got is not None:
                    return got
        return None

    def record(self, rec: KernelRecord) -> Finding | None:
        """classify() plus the record's position in the log as attributes."""
        finding = self.classify(rec.message)
        if finding is not None:
            if rec.seq is not None:
                finding.attributes["kmsg_seq"] = str(rec.seq)
            if rec.usec is not None:
                finding.attributes["kernel_usec"] = str(rec.usec)
        return finding


def classify(message: str) -> Finding | None:
    """The finding one kernel message stands for, or None for an ordinary line."""
    return LogReader().classify(message)


def classify_record(rec: KernelRecord) -> Finding | None:
    """classify() of one record, with its position in the log as attributes."""
    return LogReader().record(rec)


def scan_numbered(lines: Iterable[str]) -> Iterator[tuple[int, Finding]]:
    """(first line of the record, finding) for each finding of a log's lines."""
    reader = LogReader()
    for lineno, rec in numbered_records(lines):
        f = reader.record(rec)
        if f is not None:
            yield lineno, f


def scan_text(text: str) -> list[Finding]:
    """Findings of every record of a kernel log text."""
    return [f for _n, f in scan_numbered(text.splitlines())]


def _read_kmsg_device(path: str) -> str:
    """Everything /dev/kmsg holds now: one record per read, until it has no more (never waits)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    chunks: list[str] = []
    try:
        while True:
            try:
                data = os.read(fd, 16384)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # the ring buffer overwrote records: skip on
                    continue
                raise
            if not data:
                break
            chunks.append(data.decode("utf-8", errors="replace"))
    finally:
        os.close(fd)
    return "".join(chunks)


def scan_file(path: str) -> list[Finding]:
    """Read a kernel log once (a saved file in any supported shape, or /dev/kmsg) and return its findings."""
    if stat.S_ISCHR(os.stat(path).st_mode):
        return scan_text(_read_kmsg_device(path))
    with open(path, encoding="utf-8", errors="replace") as fh:
        return scan_text(fh.read())
