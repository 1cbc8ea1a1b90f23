"""Score the kernel-log parser against the public corpus: lines right / total, by category.

The corpus is real kernel-log lines quoted in public issues, forums and vendors' documents
(``tests/fixtures/kmsg/real/``) plus the recorded logs in ``../shared/fixtures/kmsg-public/``,
each ``NAME.log`` with a ``NAME.expect.json`` that says, per fault record, the kind, the code,
the device and the actions NVIDIA's catalogs allow, and which lines must give no finding. The
expectations come from the vendors, never from the parser, so this is the honest figure of how
many real fault lines the scanner reads right.

    python -m tools.kmsg_corpus            # the table
    python -m tools.kmsg_corpus --wrong    # and every line it gets wrong, with what it said
    python -m tools.kmsg_corpus --vendor amd   # the AMD corpus (tests/fixtures/kmsg/amd/)
    python -m tools.kmsg_corpus --vendor ascend   # the Ascend corpus (tests/fixtures/kmsg/ascend/)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.collectors import kmsg
from starpulse.core.findings import Finding
from starpulse.core.vocab import canonical_pci, pci_key

ROOT = Path(__file__).resolve().parent.parent
CORPUS_DIRS = (ROOT / "tests" / "fixtures" / "kmsg" / "real", ROOT.parent / "shared" / "fixtures" / "kmsg-public")
CATEGORIES = ("xid", "sxid", "nic", "benign")
# Each vendor's corpus; a fault record may name its own "category" (AMD: ras, vmfault, hang, fw).
# A record's "device" is the device number the driver printed (Ascend's dev_id), as a string.
VENDOR_DIRS = {
    "nvidia": CORPUS_DIRS,
    "amd": (ROOT / "tests" / "fixtures" / "kmsg" / "amd",),
    "ascend": (ROOT / "tests" / "fixtures" / "kmsg" / "ascend",),
}


@dataclass
class Verdict:
    """One scored record: a fault (one or more lines) or one benign line."""

    file: str
    lines: list[int]
    category: str
    right: bool
    why: str = ""
    text: str = ""


@dataclass
class Score:
    """Right and total per category, and the verdicts behind them."""

    verdicts: list[Verdict] = field(default_factory=list)

    def add(self, v: Verdict) -> None:
        self.verdicts.append(v)

    def table(self) -> dict[str, tuple[int, int]]:
        """category -> (right, total), plus "all" and "faults" rows."""
        out: dict[str, tuple[int, int]] = {}
        seen = [v.category for v in self.verdicts]
        cats = [c for c in dict.fromkeys(seen) if c not in CATEGORIES and c != "benign"]
        for cat in (*cats, "benign") if cats else CATEGORIES:
            vs = [v for v in self.verdicts if v.category == cat]
            out[cat] = (sum(v.right for v in vs), len(vs))
        faults = [v for v in self.verdicts if v.category != "benign"]
        out["faults"] = (sum(v.right for v in faults), len(faults))
        out["all"] = (sum(v.right for v in self.verdicts), len(self.verdicts))
        return out


def corpus_files(dirs: Iterable[Path] = CORPUS_DIRS) -> list[tuple[Path, dict[str, Any]]]:
    """Every (log path, expectation) pair found; a missing directory is skipped."""
    out = []
    for d in dirs:
        if not d.is_dir():
            continue
        for exp in sorted(d.glob("*.expect.json")):
            doc = json.loads(exp.read_text(encoding="utf-8"))
            out.append((d / doc["file"], doc))
    return out


def findings_by_line(lines: list[str]) -> dict[int, list[Finding]]:
    """The parser's findings keyed by the 1-based line that produced them.

    Uses the parser's own line-numbered scan where it has one (records that span lines
    are attributed to their first line), else classifies line by line.
    """
    out: dict[int, list[Finding]] = {}
    numbered = getattr(kmsg, "scan_numbered", None)
    if numbered is not None:
        for lineno, finding in numbered(lines):
            out.setdefault(lineno, []).append(finding)
        return out
    for i, line in enumerate(lines, start=1):
        rec = kmsg.parse_line(line)
        if rec is None:
            continue
        f = kmsg.classify_record(rec)
        if f is not None:
            out.setdefault(i, []).append(f)
    return out


def _category(fault: dict[str, Any]) -> str:
    if "category" in fault:
        return str(fault["category"])
    kinds = set(fault.get("kind", []))
    if "sxid" in kinds:
        return "sxid"
    if kinds & {"xid", "gpu_lost"}:
        return "xid"
    return "nic"


def _same_pci(expected: str, got: str | None) -> bool:
    if got is None:
        return False
    if expected.count(":") == 2 and "." in expected:
        return canonical_pci(expected) == canonical_pci(got)
    return pci_key(expected) == pci_key(got)


def judge_finding(fault: dict[str, Any], f: Finding) -> str:
    """Why this finding does not match the fault ('' when it does)."""
    if f.kind not in fault.get("kind", [f.kind]):
        return f"kind {f.kind}"
    code = fault.get("xid", fault.get("sxid"))
    if code is not None and f.xid != code:
        return f"code {f.xid}"
    if "code" in fault and f.vendor_code not in fault["code"]:
        return f"code {f.vendor_code}"
    if "pci" in fault and not _same_pci(fault["pci"], f.pci):
        return f"pci {f.pci}"
    if "device" in fault and f.attributes.get("device") != fault["device"]:
        return f"device {f.attributes.get('device')}"
    if "netdev" in fault and f.attributes.get("netdev") != fault["netdev"]:
        return f"netdev {f.attributes.get('netdev')}"
    if f.action not in fault.get("action", [f.action]):
        return f"action {f.action}"
    if "gpu_instance" in fault and f.attributes.get("gpu_instance") != fault["gpu_instance"]:
        return f"gpu_instance {f.attributes.get('gpu_instance')}"
    if "process" in fault and f.attributes.get("process") != fault["process"]:
        return f"process {f.attributes.get('process')}"
    if "fatal" in fault and f.attributes.get("fatal") != str(fault["fatal"]).lower():
        return f"fatal {f.attributes.get('fatal')}"
    return ""


def score_file(path: Path, doc: dict[str, Any], lines: list[str] | None = None) -> list[Verdict]:
    """Verdicts for one log (``lines`` overrides the file's text, e.g. with a prefix added)."""
    if lines is None:
        lines = path.read_text(encoding="utf-8").splitlines()
    found = findings_by_line(lines)
    verdicts: list[Verdict] = []
    claimed: set[int] = set()
    for fault in doc.get("faults", []):
        nums = list(fault["lines"])
        claimed.update(nums)
        got = [f for n in nums for f in found.get(n, [])]
        why = ""
        if not got:
            why = "no finding"
        elif fault.get("fold") and len(got) != 1:
            why = f"{len(got)} findings for one record"
        else:
            for f in got:
                why = judge_finding(fault, f)
                if why:
                    break
        text = lines[nums[0] - 1] if nums[0] - 1 < len(lines) else ""
        verdicts.append(Verdict(path.name, nums, _category(fault), not why, why, text))
    optional = {int(o["line"]) for o in doc.get("optional", [])}
    for n in range(1, len(lines) + 1):
        if n in claimed or n in optional or not lines[n - 1].strip():
            continue
        extra = found.get(n, [])
        why = "" if not extra else f"false positive: {extra[0].kind} {extra[0].action}"
        verdicts.append(Verdict(path.name, [n], "benign", not extra, why, lines[n - 1]))
    return verdicts


def score(dirs: Iterable[Path] = CORPUS_DIRS) -> Score:
    """Score every corpus file found."""
    s = Score()
    for path, doc in corpus_files(dirs):
        for v in score_file(path, doc):
            s.add(v)
    return s


def main(argv: list[str] | None = None) -> int:
    """Print the table (and with --wrong every wrong record)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wrong", action="store_true", help="list every record the parser gets wrong")
    ap.add_argument("--vendor", choices=sorted(VENDOR_DIRS), default="nvidia", help="which vendor's corpus")
    args = ap.parse_args(argv)
    dirs = VENDOR_DIRS[args.vendor]
    s = score(dirs)
    if not s.verdicts:
        print("no corpus found under " + ", ".join(str(d) for d in dirs), file=sys.stderr)
        return 2
    print(f"{'category':<8} {'right':>5} / {'total':<5}")
    for cat, (right, total) in s.table().items():
        print(f"{cat:<8} {right:>5} / {total:<5} {100.0 * right / max(total, 1):5.1f} %")
    if args.wrong:
        for v in s.verdicts:
            if not v.right:
                print(f"{v.file}:{v.lines[0]} [{v.category}] {v.why}: {v.text[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
