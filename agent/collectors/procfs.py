"""CPU busy % and memory total/available from /proc, as psutil computes them, for less CPU per cycle.

The host collector asks for these every cycle. ``psutil.cpu_percent()`` and
``psutil.virtual_memory()`` open and parse their /proc files in Python and build named
tuples of every field; this keeps both files open, re-reads them with one ``pread`` at
offset 0 (procfs regenerates the text, as sysfs does) and parses only what the report
carries. The arithmetic is psutil's own, in the same order, so
the values are the same (tests/agent/collectors/test_procfs.py checks that against psutil on the same
files). Linux only; ``ProcStats.open`` returns None elsewhere and the caller keeps psutil.
"""

from __future__ import annotations

import contextlib
import os

import structlog

log = structlog.get_logger(__name__)

# /proc/stat's "cpu" line, in psutil's scputimes order; psutil takes at most these ten.
_CPU_FIELDS = 10
_IDLE, _IOWAIT, _GUEST, _GUEST_NICE = 3, 4, 8, 9


class ProcStats:
    """Kept-open /proc/stat and /proc/meminfo; not thread-safe (the collection worker's own)."""

    def __init__(self, stat_fd: int, meminfo_fd: int, procfs: str) -> None:
        self._stat_fd = stat_fd
        self._meminfo_fd = meminfo_fd
        self._procfs = procfs
        self._clock_ticks = float(os.sysconf("SC_CLK_TCK"))
        self._last: list[float] | None = None

    @classmethod
    def open(cls, procfs: str = "/proc") -> ProcStats | None:
        """Both files opened, or None (not Linux, or unreadable: the caller uses psutil)."""
        try:
            stat_fd = os.open(f"{procfs}/stat", os.O_RDONLY)
        except OSError:
            return None
        try:
            meminfo_fd = os.open(f"{procfs}/meminfo", os.O_RDONLY)
        except OSError:
            os.close(stat_fd)
            return None
        stats = cls(stat_fd, meminfo_fd, procfs)
        try:
            stats._cpu_times()
            stats.memory()
        except (OSError, ValueError, IndexError, KeyError) as err:
            log.info("procfs_unusable", procfs=procfs, error=str(err))
            stats.close()
            return None
        return stats

    def _read(self, fd: int) -> bytes:
        data = os.pread(fd, 16384, 0)
        if len(data) == 16384:  # longer than expected: read it whole
            chunks = [data]
            while chunk := os.pread(fd, 16384, sum(map(len, chunks))):
                chunks.append(chunk)
            data = b"".join(chunks)
        return data

    def _cpu_times(self) -> list[float]:
        """psutil.cpu_times(): the first line's fields / SC_CLK_TCK."""
        data = self._read(self._stat_fd)
        values = data[: data.index(b"\n")].split()
        if values[0] != b"cpu":
            raise ValueError(f"{self._procfs}/stat does not start with the cpu line")
        return [float(x) / self._clock_ticks for x in values[1 : _CPU_FIELDS + 1]]

    def cpu_percent(self) -> float:
        """psutil.cpu_percent(interval=None): busy % since the previous call (the first primes, 0.0)."""
        t2 = self._cpu_times()
        t1 = self._last if self._last is not None else t2
        self._last = t2
        deltas = [max(0, b - a) for a, b in zip(t1, t2, strict=True)]
        tot = sum(deltas)
        if len(deltas) > _GUEST:  # guest time is already in user / nice
            tot -= deltas[_GUEST]
        if len(deltas) > _GUEST_NICE:
            tot -= deltas[_GUEST_NICE]
        busy = tot - deltas[_IDLE]
        if len(deltas) > _IOWAIT:
            busy -= deltas[_IOWAIT]
        try:
            return round((busy / tot) * 100, 1)
        except ZeroDivisionError:
            return 0.0

    def memory(self) -> tuple[int, int] | None:
        """(MemTotal, MemAvailable) in bytes; None without a usable MemAvailable (psutil estimates it)."""
        total = avail = -1
        for line in self._read(self._meminfo_fd).split(b"\n"):
            if line.startswith(b"MemTotal:"):
                total = int(line.split()[1]) * 1024
            elif line.startswith(b"MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
        if total < 0:
            raise KeyError("MemTotal")
        return (total, avail) if avail > 0 else None

    def close(self) -> None:
        for fd in (self._stat_fd, self._meminfo_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._stat_fd = self._meminfo_fd = -1
