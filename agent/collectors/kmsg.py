"""Kernel log: parse /dev/kmsg, dmesg and journalctl text, and turn error lines into findings.

NVML reports an Xid number; the kernel log has the text around it (PCI address, process,
sub-codes), plus things NVML never sees: NVSwitch SXids, mlx5 NIC driver errors and
nvidia-peermem failures. One parser reads every format an operator might hand us
(a live ``/dev/kmsg``, a saved ``dmesg``/``dmesg -T``, ``journalctl -k``), so the agent's
live tail and ``starpulse scan --kmsg FILE`` agree on what a line means.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import structlog

from agent.collectors.base import FindingSink
from agent.collectors.filewatch import Waiter
from starpulse.core import vocab
from starpulse.core import xid as xidcat
from starpulse.core.findings import Finding
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

SOURCE = "kmsg"


@dataclass(frozen=True)
class KernelRecord:
    """One kernel log record, whatever format it came in.

    ``priority`` is the syslog level (0 emerg … 7 debug); ``usec`` is the kernel's
    monotonic timestamp in microseconds. Formats that lack a field leave it None.
    """

    seq: int | None
    usec: int | None
    priority: int | None
    message: str


# /dev/kmsg: "prio,seq,usec,flags[,more];message" (newer kernels append ",caller=T1").
_KMSG_RE = re.compile(r"^(\d+),(\d+),(\d+),[^;]*;(.*)$")
# dmesg: "[  123.456789] msg", optionally "<6>" (dmesg -r) in front.
_DMESG_RE = re.compile(r"^(?:<(\d)>)?\[\s*(\d+)\.(\d+)\]\s?(.*)$")
# dmesg -T: "[Mon Nov 30 06:30:41 2026] msg"
_DMESG_T_RE = re.compile(r"^\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\]\s?(.*)$")
# journalctl -k (short) and syslog files: "Nov 30 06:30:41 host kernel: msg";
# short-iso: "2026-11-30T06:30:41+0000 host kernel: msg".
_JOURNAL_RE = re.compile(
    r"^(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?|\d{4}-\d\d-\d\dT[\d:.]+(?:[+-]\d{2}:?\d{2}|Z)?)"
    r" \S+ kernel: (.*)$"
)
# journalctl -o short-monotonic puts "host kernel: " after the dmesg-style stamp.
_HOST_KERNEL_RE = re.compile(r"^\S+ kernel: (.*)$")
# Old syslog daemons keep the kernel's own stamp inside the message.
_INNER_STAMP_RE = re.compile(r"^\[\s*(\d+)\.(\d+)\]\s?(.*)$")


def _usec(sec: str, frac: str) -> int:
    return int(sec) * 1_000_000 + int((frac + "000000")[:6])


def parse_line(line: str) -> KernelRecord | None:
    """Parse one line of any supported format; None for blanks and /dev/kmsg continuation lines."""
    line = line.rstrip("\r\n")
    if not line.strip() or line.startswith((" ", "\t")):
        return None  # /dev/kmsg dictionary "KEY=value" continuation lines start with a space
    m = _KMSG_RE.match(line)
    if m:
        return KernelRecord(int(m.group(2)), int(m.group(3)), int(m.group(1)) & 7, m.group(4))
    m = _DMESG_RE.match(line)
    if m:
        msg = m.group(4)
        hk = _HOST_KERNEL_RE.match(msg)
        if hk:
            msg = hk.group(1)
        prio = int(m.group(1)) if m.group(1) is not None else None
        return KernelRecord(None, _usec(m.group(2), m.group(3)), prio, msg)
    m = _DMESG_T_RE.match(line)
    if m:
        return KernelRecord(None, None, None, m.group(1))
    m = _JOURNAL_RE.match(line)
    if m:
        msg = m.group(1)
        inner = _INNER_STAMP_RE.match(msg)
        if inner:
            return KernelRecord(None, _usec(inner.group(1), inner.group(2)), None, inner.group(3))
        return KernelRecord(None, None, None, msg)
    # Unknown shape (e.g. `journalctl -k -o cat`): the whole line is the message.
    return KernelRecord(None, None, None, line)


def parse_lines(lines: Iterable[str]) -> Iterator[KernelRecord]:
    """Parse many lines, skipping blanks and continuation lines."""
    for line in lines:
        rec = parse_line(line)
        if rec is not None:
            yield rec


# gpud's Xid regex (components/accelerator/nvidia/xid/kmsg.go).
_XID_RE = re.compile(r"NVRM: Xid \(((?:PCI:)?[0-9a-fA-F:]+)\).*?: (\d+),")
_FALLEN_RE = re.compile(r"NVRM: GPU (?:at )?(?:PCI:)?([0-9a-fA-F:.]+): GPU has fallen off the bus")
_SXID_RE = re.compile(r"SXid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+),")
_NVSWITCH_RE = re.compile(r"(nvidia-nvswitch\d+)")
_FATAL_RE = re.compile(r"(?<![-\w])fatal\b", re.IGNORECASE)
_LINK_RE = re.compile(r"\bLink (\d+)\b")
_PID_RE = re.compile(r"\bpid=([^,]*)")
_NAME_RE = re.compile(r"\bname=([^,]*)")
_MLX5_RE = re.compile(
    r"mlx5_core (?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])"
    r"(?: (?P<netdev>[^:\s]+))?: (?P<text>.*)"
)
# (pattern, action, reason) for the mlx5 lines worth a finding; anything else from mlx5 is noise.
_MLX5_ERRORS: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(r"Port module event\[error\]"), vocab.ACTION_CHECK_LINK, "transceiver module error"),
    (
        re.compile(r"Port module event.*(?:unplugged|Cable error)", re.IGNORECASE),
        vocab.ACTION_CHECK_LINK,
        "transceiver module event",
    ),
    (re.compile(r"\blink down\b", re.IGNORECASE), vocab.ACTION_CHECK_LINK, "link down"),
    (re.compile(r"health compromised"), vocab.ACTION_INVESTIGATE, "device health compromised"),
    (re.compile(r"\b(?:fatal|internal) error\b", re.IGNORECASE), vocab.ACTION_INVESTIGATE, "device error"),
    (
        re.compile(r"mlx5_cmd_out_err|mlx5_cmd_check|cmd_work_handler.*timeout|command timeout"),
        vocab.ACTION_INVESTIGATE,
        "firmware command failed",
    ),
)
_PEERMEM_RE = re.compile(r"nvidia-peermem\b.*\bERROR\b")


def classify(message: str) -> Finding | None:
    """The finding a kernel message stands for, or None for an ordinary line."""
    m = _XID_RE.search(message)
    if m:
        pci = m.group(1).removeprefix("PCI:")
        num = int(m.group(2))
        info = xidcat.lookup(num)
        attrs = {"pci": pci, "mnemonic": info.mnemonic}
        for key, rx in (("pid", _PID_RE), ("process", _NAME_RE)):
            pm = rx.search(message, m.end())
            if pm:
                attrs[key] = pm.group(1).strip().strip("'")
        return Finding(
            kind="xid",
            component=f"gpu@{pci}",
            severity=info.severity,
            action=info.action,
            message=message,
            source=SOURCE,
            xid=num,
            pci=pci,
            attributes=attrs,
        )
    m = _FALLEN_RE.search(message)
    if m:
        pci = m.group(1)
        return Finding(
            kind="gpu_lost",
            component=f"gpu@{pci}",
            severity="fatal",
            action=vocab.ACTION_REBOOT,
            message=message,
            source=SOURCE,
            xid=79,
            pci=pci,
            attributes={"pci": pci},
        )
    m = _SXID_RE.search(message)
    if m:
        pci = m.group(1)
        fatal = _FATAL_RE.search(message[m.end() :]) is not None
        attrs = {"pci": pci, "fatal": str(fatal).lower()}
        sw = _NVSWITCH_RE.search(message)
        if sw:
            attrs["nvswitch"] = sw.group(1)
        lm = _LINK_RE.search(message, m.end())
        if lm:
            attrs["link"] = lm.group(1)
        return Finding(
            kind="sxid",
            component=f"nvswitch@{pci}",
            severity="fatal" if fatal else "warning",
            action=vocab.ACTION_REBOOT if fatal else vocab.ACTION_INVESTIGATE,
            message=message,
            source=SOURCE,
            xid=int(m.group(2)),
            pci=pci,
            attributes=attrs,
        )
    m = _MLX5_RE.search(message)
    if m:
        text = m.group("text")
        for rx, action, reason in _MLX5_ERRORS:
            if rx.search(text):
                pci = m.group("pci")
                netdev = m.group("netdev") or ""
                attrs = {"pci": pci, "reason": reason}
                if netdev:
                    attrs["netdev"] = netdev
                return Finding(
                    kind="nic_driver_error",
                    component=netdev or f"mlx5@{pci}",
                    severity="warning",
                    action=action,
                    message=message,
                    source=SOURCE,
                    pci=pci,
                    attributes=attrs,
                )
        return None
    if _PEERMEM_RE.search(message):
        return Finding(
            kind="kernel",
            component="nvidia-peermem",
            severity="warning",
            action=vocab.ACTION_INVESTIGATE,
            message=message,
            source=SOURCE,
            attributes={"module": "nvidia-peermem"},
        )
    return None


def classify_record(rec: KernelRecord) -> Finding | None:
    """classify() plus the record's position in the log as attributes."""
    finding = classify(rec.message)
    if finding is not None:
        if rec.seq is not None:
            finding.attributes["kmsg_seq"] = str(rec.seq)
        if rec.usec is not None:
            finding.attributes["kernel_usec"] = str(rec.usec)
    return finding


def scan_text(text: str) -> list[Finding]:
    """Findings of every line of a kernel log text."""
    out: list[Finding] = []
    for rec in parse_lines(text.splitlines()):
        f = classify_record(rec)
        if f is not None:
            out.append(f)
    return out


def scan_file(path: str) -> list[Finding]:
    """Read a saved kernel log once (any supported format) and return its findings."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        return scan_text(fh.read())


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
            finding = classify_record(rec)
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
        for line in text.split("\n"):
            rec = parse_line(line)
            if rec is not None:
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


__all__ = [
    "KernelRecord",
    "KmsgCollector",
    "classify",
    "classify_record",
    "parse_line",
    "parse_lines",
    "scan_file",
    "scan_text",
]
