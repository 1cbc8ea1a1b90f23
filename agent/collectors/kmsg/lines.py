"""Kernel-log line shapes: every way an operator hands us a kernel message, reduced to a record.

A live ``/dev/kmsg``, ``dmesg`` (uptime, ``-T`` ctime, ``--time-format iso``, ``--decode``'s
``kern  :err   :`` facility/level), ``journalctl -k`` short forms in any locale's month names,
syslog files with or without the host name, a ``kernel:`` prefix, and a pdsh/clush
``host: `` prefix in front of any of them. The parser peels prefixes until the message is
left, so the classifiers see the same text whatever the shape; what a shape lacks
(sequence, timestamp, level) is left None. Multi-line messages (dmesg indents the lines of
one record; ``/dev/kmsg`` escapes the newline as ``\\x0a``) are joined into one record by
:func:`numbered_records`, which also says which line a record started on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass


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
# dmesg -T: "[Mon Nov 30 06:30:41 2026] msg" (any locale's day and month words).
_DMESG_T_RE = re.compile(r"^\[\S{2,9} \S{2,9} [ \d]\d \d\d:\d\d:\d\d \d{4}\]\s?(.*)$")
# dmesg --time-format iso: "2025-01-17T15:36:26,478631+00:00 msg" (a comma before the fraction).
_ISO_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:[+-]\d\d:?\d\d|Z)?\s(.*)$")
# journalctl -k short / syslog: "Nov 30 06:30:41 host kernel: msg"; month names in any language
# ("kwi", "Mär", "févr."), and without the host with --no-hostname.
_JOURNAL_RE = re.compile(r"^[^\W\d]{3,5}\.? {1,2}\d{1,2} \d\d:\d\d:\d\d(?:\.\d+)? (?:(?:\S+ )?kernel: )?(.*)$")
# dmesg --decode: "kern  :err   : msg" (facility, level).
_DECODE_RE = re.compile(r"^(kern|user|daemon|syslog)\s*:(emerg|alert|crit|err|warn|notice|info|debug)\s*: (.*)$")
_LEVELS = {"emerg": 0, "alert": 1, "crit": 2, "err": 3, "warn": 4, "notice": 5, "info": 6, "debug": 7}
# "host kernel: msg", "kernel: msg" and the journal's "kernel: [ 12.3] msg" inner stamps.
_KERNEL_TAG_RE = re.compile(r"^(?:\S+ )?kernel: (.*)$")
# pdsh / clush put "host: " in front of every line of every node's output.
_PDSH_RE = re.compile(r"^([A-Za-z0-9][\w.-]{0,62}): (.*)$")
# Message starts the classifiers look for: a pdsh prefix is only peeled when one follows.
_MESSAGE_START_RE = re.compile(
    r"^(?:<\d>)?\[|^\d+,\d+,\d+,|^\d{4}-\d\d-\d\dT|^[^\W\d]{3,5}\.? {1,2}\d{1,2} \d\d:\d\d:|^kern\s*:"
)
# /dev/kmsg dictionary continuation lines: " SUBSYSTEM=pci", " DEVICE=+pci:0000:3b:00.0".
_DICT_RE = re.compile(r"^ [A-Z_]+=")


def _usec(sec: str, frac: str) -> int:
    return int(sec) * 1_000_000 + int((frac + "000000")[:6])


def _peel(text: str) -> tuple[str, int | None, int | None]:
    """(message, usec, priority) of a message with its tags and inner stamps removed."""
    usec: int | None = None
    prio: int | None = None
    for _ in range(4):  # at most: decode tag, iso stamp, kernel tag, inner [uptime]
        m = _DECODE_RE.match(text)
        if m:
            prio, text = _LEVELS[m.group(2)], m.group(3)
            continue
        m = _ISO_RE.match(text)
        if m:
            text = m.group(1)
            continue
        m = _KERNEL_TAG_RE.match(text)
        if m and not text.startswith(("NVRM:", "mlx5")):
            text = m.group(1)
            continue
        m = _DMESG_RE.match(text)
        if m:
            if m.group(1) is not None:
                prio = int(m.group(1))
            usec, text = _usec(m.group(2), m.group(3)), m.group(4)
            continue
        break
    return text, usec, prio


def parse_line(line: str) -> KernelRecord | None:
    """Parse one line of any supported shape; None for blanks and continuation lines."""
    line = line.rstrip("\r\n")
    if not line.strip() or line.startswith((" ", "\t")):
        return None  # /dev/kmsg dictionary lines and dmesg's indented continuations
    m = _KMSG_RE.match(line)
    if m:
        msg = m.group(4).replace("\\x0a", " ")
        return KernelRecord(int(m.group(2)), int(m.group(3)), int(m.group(1)) & 7, msg)
    pd = _PDSH_RE.match(line)
    if pd and _MESSAGE_START_RE.match(pd.group(2)):
        line = pd.group(2)
        m = _KMSG_RE.match(line)
        if m:
            return KernelRecord(int(m.group(2)), int(m.group(3)), int(m.group(1)) & 7, m.group(4))
    m = _DMESG_T_RE.match(line) or _JOURNAL_RE.match(line)
    text = m.group(1) if m else line
    msg, usec, prio = _peel(text)
    return KernelRecord(None, usec, prio, msg)


def parse_lines(lines: Iterable[str]) -> Iterator[KernelRecord]:
    """Parse many lines, skipping blanks and continuation lines."""
    for _lineno, rec in numbered_records(lines):
        yield rec


def numbered_records(lines: Iterable[str]) -> Iterator[tuple[int, KernelRecord]]:
    """(1-based first line, record) for each record, indented continuation lines joined.

    dmesg prints the later lines of a multi-line message indented under the first; they
    belong to it (the fallen-off-the-bus notice is one such record of three lines).
    /dev/kmsg's own dictionary lines (`` KEY=value``) are dropped.
    """
    pending: tuple[int, KernelRecord] | None = None
    for lineno, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r\n")
        if line.startswith((" ", "\t")) and line.strip():
            if pending is not None and not _DICT_RE.match(line):
                n, first = pending
                joined = f"{first.message} {_peel(line.strip())[0]}"
                pending = (n, KernelRecord(first.seq, first.usec, first.priority, joined))
            continue
        rec = parse_line(line)
        if rec is None:
            continue
        if pending is not None:
            yield pending
        pending = (lineno, rec)
    if pending is not None:
        yield pending
