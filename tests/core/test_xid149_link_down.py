"""Xid 149 NETIR_LINK_EVT decoded by its link-down reason, as NVIDIA's decode sheet does.

The sheet tells the link-event rows apart by IntrInfo bits 25:20, not by the error status.
The rows are tested against a verbatim snapshot of the sheet
(tests/fixtures/xid/nvlink5-149-link-down.snapshot.md); real lines from public logs decode to
the row of their reason; a reason the sheet does not list is "decode unknown".
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.collectors.kmsg import classify
from starpulse.core import xid as xidcat

SNAPSHOT = Path(__file__).resolve().parent.parent / "fixtures" / "xid" / "nvlink5-149-link-down.snapshot.md"
PATTERN = re.compile(r"^-{6}([01]{6})-+[01]+$")


def snapshot_rows() -> list[list[str]]:
    rows = []
    for line in SNAPSHOT.read_text(encoding="utf-8").splitlines():
        if line.startswith("| -"):
            rows.append([c.strip() for c in line.strip()[1:-1].split("|")])
    return rows


ROWS = snapshot_rows()


def line(intr: int, word: str = "Fatal") -> str:
    return (
        f"NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  {word}   XC0 i0 Link 01 "
        f"(0x{intr:08x} 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
    )


def test_snapshot_has_the_sheets_21_link_down_rows() -> None:
    assert len(ROWS) == 21


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_catalog_row_matches_the_sheet(row: list[str]) -> None:
    v1, v2, resolution, investigatory, severity, _hwsw = row
    m1, m2 = PATTERN.match(v1), PATTERN.match(v2)
    assert m1 and m2 and m1.group(1) == m2.group(1)  # the reason sits at bits 25:20 in both revisions
    reason = int(m1.group(1), 2)
    decoded = xidcat.decode_link_down(reason)
    assert decoded is not None, f"reason {reason} is in the sheet but not in the catalog"
    assert (decoded.bucket, decoded.investigate, decoded.severity) == (resolution, investigatory, severity)


def test_catalog_lists_no_reason_the_sheet_does_not() -> None:
    reasons = {int(PATTERN.match(r[0]).group(1), 2) for r in ROWS}  # type: ignore[union-attr]
    assert set(xidcat._catalog().link_down) == reasons


@pytest.mark.parametrize(
    ("intr", "reason", "action", "investigate"),
    [
        # GB200 public logs (the shared corpus and gpud's tests): a peer device brought the link down
        (0x021425C6, 33, "reset_gpu", "INVESTIGATE_PEER_DEVICE"),
        (0x025525C6, 37, "reset_gpu", "INVESTIGATE_PEER_DEVICE"),
        (0x016415C6, 22, "reset_gpu", "INVESTIGATE_SW_USER"),
        (0x000625C6, 0, "reset_gpu", "SYMPATHETIC_REPORT_SOLO"),
        # the two reasons the sheet does not reset for
        (0x026001C6, 38, "none", "INVESTIGATE_SW/USER"),
        (0x028001C6, 40, "none", "INVESTIGATE_HOST"),
    ],
)
def test_a_link_event_decodes_by_its_reason(intr: int, reason: int, action: str, investigate: str) -> None:
    f = classify(line(intr))
    assert f is not None and f.xid == 149
    assert f.attributes["link_down_reason"] == str(reason)
    assert (f.action, f.attributes["investigate"]) == (action, investigate)
    assert f.attributes["decode"] == xidcat.decode_link_down(reason).bucket  # type: ignore[union-attr]


@pytest.mark.parametrize("word", ["Fatal", "Nonfatal"])
def test_a_reason_the_sheet_does_not_list_is_decode_unknown(word: str) -> None:
    """Reason 3 is in no row of the sheet: say so, and never ask for a reset on a guess."""
    f = classify(line(0x003001C6, word))
    assert f is not None and f.attributes["link_down_reason"] == "3"
    assert f.attributes["decode"] == "unknown" and f.action == "investigate"
    assert f.severity == ("critical" if word == "Fatal" else "warning")


def test_other_149_subcodes_keep_their_status_decode() -> None:
    """NETIR_BER_EVENT is decoded by its error status, not by a link-down reason."""
    f = classify("NVRM: Xid (PCI:0009:01:00): 149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 01 (0x021425c6 0x00000002)")
    assert f is not None and "link_down_reason" not in f.attributes
    assert (f.attributes["decode"], f.action) == ("IGNORE", "none")
