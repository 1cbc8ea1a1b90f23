"""Sysfs counter files kept open between reads, owned by the collector that reads them.

Counter directories never gain or lose files while the driver is loaded: each is listed
once and kept open, so a counter is an openat() of a bare name. Each counter file also
stays open once read: a sysfs attribute read at offset 0 (pread) is generated afresh by
the kernel (seq_file restarts at position 0), so one syscall replaces open + read + close
for each of the ~700 files of a full read on an 8-rail node.

A removed device's open attributes fail with ENODEV, which drops its directory; every
re-list (``revalidate``) also drops directories whose path now names another inode.
Everything a ``CounterFiles`` holds is closed by its ``close()``: a collector that ends
gives its files back, so the next one in the same process (a simulated cluster, the
tests) starts with the whole budget.
"""

from __future__ import annotations

import errno
import os
import weakref
from collections.abc import Iterable
from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)

_U64_MAX = (1 << 64) - 1


def _kept_files_max() -> int:
    """Files kept open in all: a quarter of the soft fd limit, the rest is the agent's."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, ValueError, OSError):
        return 256
    return 4096 if soft == resource.RLIM_INFINITY else max(0, min(4096, soft // 4))


@dataclass
class FileBudget:
    """How many files the process keeps open for re-reading: one budget, however many collectors."""

    kept: int
    max: int

    def take(self) -> bool:
        if self.kept >= self.max:
            return False
        self.kept += 1
        return True

    def give_back(self, count: int = 1) -> None:
        self.kept -= count


PROCESS_BUDGET = FileBudget(0, _kept_files_max())


@dataclass
class _CounterDir:
    fd: int
    names: list[str]
    files: dict[str, int]  # name -> open fd


def _close_dir(cached: _CounterDir, budget: FileBudget) -> None:
    for fd in cached.files.values():
        os.close(fd)
    budget.give_back(len(cached.files))
    os.close(cached.fd)


def _release(dirs: dict[str, _CounterDir], budget: FileBudget) -> None:
    while dirs:
        _close_dir(dirs.popitem()[1], budget)


def parse_counter(data: bytes) -> int | None:
    """A counter file's text as an unsigned 64-bit integer; None when it is not one."""
    try:
        value = int(data)
    except ValueError:
        return None
    return value if 0 <= value <= _U64_MAX else None


class CounterFiles:
    """One collector's open counter directories and files."""

    def __init__(self, budget: FileBudget = PROCESS_BUDGET) -> None:
        self.budget = budget
        self._dirs: dict[str, _CounterDir] = {}
        # A collector dropped without close() still gives its files back (to the budget too).
        weakref.finalize(self, _release, self._dirs, budget)

    def read_dir(self, path: str) -> dict[str, int]:
        """Every integer file of a counters directory; unreadable or non-integer files are skipped."""
        out: dict[str, int] = {}
        cached = self._dir(path)
        if cached is None:
            return out
        stale = False
        for name in cached.names:
            try:
                value = self._read(cached, name)
            except FileNotFoundError:
                stale = True
                continue
            except OSError:
                value = None
            if value is None:
                log.debug("rdma_counter_unreadable", path=f"{path}/{name}")
                continue
            out[name] = value
        if stale:
            self.forget(path)
        return out

    def read_names(self, path: str, names: tuple[str, ...]) -> dict[str, int]:
        """The named integer files of a counters directory (those that exist and parse)."""
        out: dict[str, int] = {}
        cached = self._dir(path)
        if cached is None:
            return out
        stale = False
        for name in names:
            try:
                value = self._read(cached, name)
            except FileNotFoundError:
                stale = name in cached.names or stale
                continue
            except OSError:
                continue
            if value is not None:
                out[name] = value
        if stale:
            self.forget(path)
        return out

    def revalidate(self, paths: Iterable[str]) -> None:
        """Drop those kept directories that are gone or were re-created (another inode)."""
        for path in paths:
            cached = self._dirs.get(path)
            if cached is None:
                continue
            try:
                same = os.stat(path).st_ino == os.fstat(cached.fd).st_ino
            except OSError:
                same = False
            if not same:
                self.forget(path)

    def forget(self, path: str) -> None:
        cached = self._dirs.pop(path, None)
        if cached is not None:
            _close_dir(cached, self.budget)

    def close(self) -> None:
        _release(self._dirs, self.budget)

    @property
    def open_files(self) -> int:
        return sum(len(d.files) for d in self._dirs.values())

    def _dir(self, path: str) -> _CounterDir | None:
        cached = self._dirs.get(path)
        if cached is None:
            try:
                names = sorted(e.name for e in os.scandir(path) if e.is_file())
                dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            except OSError:
                return None
            cached = self._dirs[path] = _CounterDir(dir_fd, names, {})
        return cached

    def _read(self, d: _CounterDir, name: str) -> int | None:
        """One counter; None when unreadable. Raises FileNotFoundError when the file is gone."""
        fd = d.files.get(name)
        if fd is None:
            fd = os.open(name, os.O_RDONLY, dir_fd=d.fd)  # FileNotFoundError: gone
            if self.budget.take():
                d.files[name] = fd
            else:
                try:
                    return parse_counter(os.read(fd, 64))
                except OSError:
                    return None
                finally:
                    os.close(fd)
        try:
            data = os.pread(fd, 64, 0)
        except OSError as e:
            if e.errno == errno.ENODEV:  # the device went away under the open attribute
                raise FileNotFoundError(e.errno, e.strerror) from e
            return None
        return parse_counter(data)
