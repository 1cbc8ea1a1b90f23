"""The kernel-log collector: follows /dev/kmsg (or a file another process appends to).

Kernel messages are events, not samples, so the tail runs on its own thread and pushes
findings to the sink as they happen; one LogReader per tail keeps the state multi-line
records need.
"""

from __future__ import annotations

import errno
import os
import stat
import threading

import structlog

from agent.collectors.base import FindingSink
from agent.collectors.filewatch import Waiter
from agent.collectors.kmsg.lines import KernelRecord, numbered_records
from agent.collectors.kmsg.reader import LogReader
from starpulse.core.findings import Finding
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)


class KmsgCollector:
    """Tails the kernel log in a daemon thread and pushes findings to the sink as they happen.

    Kernel messages are events, not samples: waiting for the next report cycle would add
    latency and lose lines when the ring buffer wraps, so the tail runs on its own.
    ``path`` is ``/dev/kmsg`` (character device: one record per read) or a regular file
    that another process appends to (the simulator, tests). Without a sink, findings are
    queued and returned by collect() instead.
    """

    name = "kmsg"

    def __init__(
        self,
        path: str = "/dev/kmsg",
        sink: FindingSink | None = None,
        from_start: bool = False,
        poll_interval_s: float = 0.2,
    ) -> None:
        self.path = path
        self._sink = sink
        self._from_start = from_start
        self._poll = poll_interval_s
        # Idle, the tail sleeps until the log has news (poll(2) on /dev/kmsg, inotify on a
        # file) and wakes on its own only this often, as a safety net; see filewatch.
        self._idle_s = max(poll_interval_s, min(2.0, poll_interval_s * 10))
        self._waiter: Waiter | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pending: list[Finding] = []
        self.records_read = 0
        self.overruns = 0
        self._resume_after: int | None = None
        self._reader = LogReader()

    # -- Collector protocol ---------------------------------------------------------
    def supported(self) -> bool:
        """True when the log exists and we may read it."""
        return os.path.exists(self.path) and os.access(self.path, os.R_OK)

    def describe(self, inventory: ipb.Inventory) -> None:
        """Nothing to inventory; starts the tail so no line is missed before the first report."""
        self.start()

    def collect(self, report: tpb.Report) -> list[Finding]:
        """Adds nothing to the report: findings go to the sink as they are read."""
        self.start()
        if self._sink is not None:
            return []
        with self._lock:
            out, self._pending = self._pending, []
        return out

    def close(self) -> None:
        """Stop the tail thread. Idempotent."""
        self._stop.set()
        waiter = self._waiter
        if waiter is not None:
            waiter.wake()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=max(2.0, self._poll * 5))
            if not t.is_alive() and waiter is not None:
                waiter.close()

    # -- tail -----------------------------------------------------------------------
    def resume_after(self, seq: int) -> None:
        """Read the log from its start but skip records up to seq (call before start()).

        The agent persists the seq of the last record that became an event together with
        that event; resuming after it means a restarted agent neither misses the lines
        logged while it was down nor repeats one it already turned into an event.
        """
        self._resume_after = seq
        self._from_start = True

    def start(self) -> None:
        """Start the tail thread once (idempotent; no-op after close)."""
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._waiter = Waiter()
            self._thread = threading.Thread(target=self._run, name=f"kmsg-tail:{self.path}", daemon=True)
            self._thread.start()

    def wait_ready(self, timeout_s: float = 5.0) -> bool:
        """Block until the tail has opened the source (and skipped old lines unless from_start)."""
        return self._ready.wait(timeout_s)

    @property
    def running(self) -> bool:
        """True while the tail thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def _emit(self, rec: KernelRecord) -> None:
        self.records_read += 1
        if self._resume_after is not None and rec.seq is not None and rec.seq <= self._resume_after:
            return
        try:
            finding = self._reader.record(rec)
        except Exception:
            log.exception("kmsg_classify_failed", message=rec.message[:200])
            return
        if finding is None:
            return
        if self._sink is None:
            with self._lock:
                self._pending.append(finding)
            return
        try:
            self._sink(finding)
        except Exception:
            log.exception("kmsg_sink_failed", kind=finding.kind, component=finding.component)

    def _emit_text(self, text: str) -> None:
        for _lineno, rec in numbered_records(text.split("\n")):
            self._emit(rec)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                st = os.stat(self.path)
            except OSError as e:
                log.debug("kmsg_source_missing", path=self.path, error=str(e))
                self._stop.wait(self._poll)
                continue
            try:
                if stat.S_ISCHR(st.st_mode):
                    self._tail_chardev()
                else:
                    self._tail_file()
            except Exception:
                log.exception("kmsg_tail_failed", path=self.path)
                self._stop.wait(max(self._poll, 1.0))

    def _tail_chardev(self) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            if not self._from_start:
                os.lseek(fd, 0, os.SEEK_END)
            log.info("kmsg_tail_started", path=self.path, device=True, from_start=self._from_start)
            self._ready.set()
            while not self._stop.is_set():
                try:
                    data = os.read(fd, 16384)
                except BlockingIOError:
                    self._idle(fd)
                    continue
                except OSError as e:
                    if e.errno == errno.EPIPE:
                        self.overruns += 1
                        log.warning("kmsg_ring_buffer_overrun", path=self.path, overruns=self.overruns)
                        continue
                    if e.errno == errno.EINTR:
                        continue
                    raise
                if not data:
                    self._idle(fd)
                    continue
                self._emit_text(data.decode("utf-8", errors="replace"))
        finally:
            os.close(fd)

    def _idle(self, fd: int | None) -> None:
        """Nothing to read: sleep until ``fd`` has news or stop (plain polling without a waiter)."""
        waiter = self._waiter
        if waiter is None or fd is None:
            self._stop.wait(self._poll)
        elif not self._stop.is_set():
            waiter.wait(fd, self._idle_s)

    def _tail_file(self) -> None:
        watch = self._waiter.watch_file(self.path) if self._waiter is not None else None
        try:
            self._tail_file_watched(watch)
        finally:
            if watch is not None:
                os.close(watch)

    def _tail_file_watched(self, watch: int | None) -> None:
        with open(self.path, "rb") as fh:
            ino = os.fstat(fh.fileno()).st_ino
            if not self._from_start:
                fh.seek(0, os.SEEK_END)
            log.info("kmsg_tail_started", path=self.path, device=False, from_start=self._from_start)
            self._ready.set()
            partial = b""
            while not self._stop.is_set():
                chunk = fh.read(65536)
                if chunk:
                    data = partial + chunk
                    cut = data.rfind(b"\n")
                    if cut < 0:
                        partial = data
                    else:
                        partial = data[cut + 1 :]
                        self._emit_text(data[: cut + 1].decode("utf-8", errors="replace"))
                    continue
                try:
                    st = os.stat(self.path)
                except FileNotFoundError:
                    st = None
                if st is None or st.st_ino != ino:
                    # Rotated: the old file is drained; read the new one from its start.
                    log.info("kmsg_file_rotated", path=self.path)
                    self._from_start = True
                    if st is None:
                        self._stop.wait(self._poll)
                    return
                if st.st_size < fh.tell():
                    log.info("kmsg_file_truncated", path=self.path, size=st.st_size, offset=fh.tell())
                    fh.seek(0)
                    partial = b""
                    continue
                self._idle(watch)
                if watch is not None:
                    Waiter.consume(watch)  # the next pass reads whatever the events were about
