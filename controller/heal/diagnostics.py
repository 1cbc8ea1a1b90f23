"""Reading a validation diagnostic's outcome: exit status, ``dcgmi diag`` output, or a pattern.

Why parse dcgmi at all: ``dcgmi diag`` can exit 0 with a failed test in its table, and
exit non-zero for a warning only (persistence mode off); the verdict is in the per-test
statuses. Both of its outputs are read:

- JSON (``dcgmi diag -r 2 -j``): DCGM 3.x wraps it in ``"DCGM GPU Diagnostic"``, 4.x in
  ``"DCGM Diagnostic"``; ``test_categories`` → ``tests`` → ``results`` with a ``status``
  each (PASS/Pass, FAIL/Fail, WARN/Warn, SKIP/Skip, "Not Run"); ``tests`` may hold ``null``
  entries, and text may precede the JSON (a warning line).
- the table (``dcgmi diag -r 2``): ``| <test> | <Pass|Fail|Warn|Skip> ...|`` rows, per-GPU
  continuation rows ``|  | GPU0: Pass |`` on 4.x.

A run with no test result at all proves nothing and does not pass; a warning passes (and
is kept in the evidence); any failure fails, naming the tests.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_TABLE_ROW = re.compile(r"^\|\s*(?P<name>[^|]*?)\s*\|\s*(?P<result>[^|]*?)\s*\|\s*$")
_GPU_RESULT = re.compile(r"^GPU\s*(?P<gpu>\d+)\s*:\s*(?P<status>\w[\w ]*)$")


@dataclass(frozen=True)
class Verdict:
    """One diagnostic's outcome, as stored in the evidence."""

    passed: bool
    detail: str


def _status(raw: str) -> str:
    s = raw.strip().lower()
    if s.startswith("pass"):
        return "pass"
    if s.startswith("fail"):
        return "fail"
    if s.startswith("warn"):
        return "warn"
    return "skip"  # skip, skipped, not run


def _json_document(text: str) -> Any | None:
    start = text.find("{")
    if start < 0:
        return None
    try:
        return json.loads(text[start:])
    except ValueError:
        return None


def _json_results(doc: Any) -> list[tuple[str, str]] | None:
    """(test, status) pairs from dcgmi's JSON, or None when it is not dcgmi's JSON."""
    if not isinstance(doc, dict):
        return None
    root = doc.get("DCGM GPU Diagnostic") or doc.get("DCGM Diagnostic")
    if not isinstance(root, dict):
        return None
    out: list[tuple[str, str]] = []
    for category in root.get("test_categories") or []:
        for test in (category or {}).get("tests") or []:
            if not isinstance(test, dict):
                continue  # real outputs carry null entries between tests
            name = str(test.get("name", "?"))
            summary = test.get("test_summary")
            if isinstance(summary, dict) and "status" in summary:  # DCGM 4.x: one status per test
                out.append((name, _status(str(summary["status"]))))
                continue
            for result in test.get("results") or []:
                if isinstance(result, dict) and "status" in result:
                    gpu = result.get("gpu_id", result.get("gpu_ids", ""))
                    out.append((f"{name} (GPU {gpu})" if str(gpu).isdigit() else name, _status(str(result["status"]))))
    return out


def _table_results(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    in_metadata = False
    last = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith(("|-----", "+-----")):
            in_metadata = "Metadata" in line
            continue
        m = _TABLE_ROW.match(line)
        if m is None or in_metadata:
            continue
        name, result = m.group("name"), m.group("result")
        if name in ("Diagnostic",) and result == "Result":
            continue
        if name:
            last = name
            out.append((name, _status(result)))
        elif (g := _GPU_RESULT.match(result)) is not None and last:
            out.append((f"{last} (GPU {g.group('gpu')})", _status(g.group("status"))))
    return out


def dcgmi_verdict(output: str) -> Verdict:
    """Pass when dcgmi ran tests and none failed (warnings pass, and are named)."""
    doc = _json_document(output)
    results = _json_results(doc) if doc is not None else None
    if results is None:
        results = _table_results(output)
    counted = [(n, s) for n, s in results if s != "skip"]
    if not counted:
        return Verdict(False, "dcgmi: no test result in the output (nothing proven)")
    failed = [n for n, s in counted if s == "fail"]
    warned = [n for n, s in counted if s == "warn"]
    if failed:
        return Verdict(False, f"dcgmi: {len(failed)} failed: {', '.join(failed[:6])}")
    note = f"; {len(warned)} warned: {', '.join(warned[:6])}" if warned else ""
    return Verdict(True, f"dcgmi: {len(counted)} passed{note}")


def judge(passes: str, ok: bool, output: str) -> Verdict:
    """The verdict of one diagnostic run: ``ok`` is the agent's answer (exit 0, no timeout)."""
    tail = output.strip()[-200:]
    if passes == "dcgmi":
        if not output.strip():
            return Verdict(False, "dcgmi: no output" + ("" if ok else " (the command failed)"))
        verdict = dcgmi_verdict(output)
        if not ok and not verdict.passed and "no test result" in verdict.detail:
            return Verdict(False, tail)  # it did not run (not configured, not found): say what the agent said
        return verdict
    if not ok:
        return Verdict(False, tail or "the command failed")
    if passes.startswith("regex:"):
        if re.search(passes[6:], output):
            return Verdict(True, f"matched {passes[6:]!r}")
        return Verdict(False, f"no match for {passes[6:]!r} in: {tail}")
    return Verdict(True, tail or "exit 0")
