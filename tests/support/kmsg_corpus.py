"""The kernel log corpus: the line forms a kmsg reader meets, and reshaping a line into each."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.collectors.kmsg import parse_line
from tools.kmsg_corpus import score_file

# Forms that print a multi-line record as indented continuation lines (the rest: one line each).
INDENTING = {"dmesg", "dmesg-raw", "dmesg-T", "dmesg-iso", "dmesg-decode-iso"}

FORMS: dict[str, Callable[[str, int], str]] = {
    "kmsg": lambda m, i: f"4,{1000 + i},{123456789 + i},-;{m}",
    "dmesg": lambda m, i: f"[{171167 + i:>6}.620236] {m}",
    "dmesg-raw": lambda m, i: f"<3>[ {1843 + i}.308145] {m}",
    "dmesg-T": lambda m, i: f"[Mon May  4 14:09:{i % 60:02d} 2026] {m}",
    "dmesg-iso": lambda m, i: f"2024-11-15T12:02:{i % 60:02d},470068+00:00 {m}",
    "dmesg-decode-iso": lambda m, i: f"kern  :err   : 2025-01-25T10:34:{i % 60:02d},859532+00:00 {m}",
    "journal": lambda m, i: f"Nov 29 11:28:{i % 60:02d} gpu-node-017 kernel: {m}",
    "journal-pl": lambda m, i: f"kwi 15 07:56:{i % 60:02d} testowy kernel: {m}",
    "journal-de": lambda m, i: f"Mär  3 07:56:{i % 60:02d} knoten kernel: {m}",
    "journal-no-hostname": lambda m, i: f"Feb 14 05:03:{i % 60:02d} kernel: {m}",
    "journal-iso": lambda m, i: f"2026-11-30T06:30:{i % 60:02d}+0000 gpu-node-017 kernel: {m}",
    "syslog-inner-stamp": lambda m, i: f"Nov 30 06:30:{i % 60:02d} gpu-node-017 kernel: [ {i}.123456] {m}",
    "kernel-tag": lambda m, i: f"kernel: {m}",
    "pdsh-dmesg": lambda m, i: f"gpu-node-017: [{1843 + i}.308145] {m}",
    "pdsh-journal": lambda m, i: f"gpu-node-017: Nov 29 11:28:{i % 60:02d} gpu-node-017 kernel: {m}",
}


def reshape(lines: list[str], form: str) -> list[str]:
    """The same log, line for line, written in ``form``."""
    out = []
    for i, line in enumerate(lines):
        if line.startswith((" ", "\t")) and line.strip():
            text = line.strip()
            out.append(line if form in INDENTING else FORMS[form](text, i))
            continue
        rec = parse_line(line)
        out.append("" if rec is None else FORMS[form](rec.message, i))
    return out


def record_params(files: list[tuple[Path, dict[str, Any]]]) -> list[Any]:
    """One pytest param per scored record of a vendor's corpus files, named by file, line and category."""
    verdicts = [(path, v) for path, doc in files for v in score_file(path, doc)]
    return [pytest.param(v, id=f"{path.name}:{v.lines[0]}:{v.category}") for path, v in verdicts]


def wrong_in_form(path: Path, doc: dict[str, Any], form: str) -> list[str]:
    """The records of a corpus file read wrong once the whole log is rewritten in ``form``."""
    lines = reshape(path.read_text(encoding="utf-8").splitlines(), form)
    return [f"{v.lines[0]} {v.why}: {v.text[:90]}" for v in score_file(path, doc, lines) if not v.right]
