"""NVIDIA's SXid (NVSwitch) catalog as data, tested against a verbatim snapshot of the
Fabric Manager user guide's SXid tables.

The snapshot (tests/fixtures/xid/fabric-manager-sxid.snapshot.md) is the guide's tables
as printed, by heading; the catalog (starpulse/core/data/xid_catalog.yaml, ``sxids``) is
what the agent reads. Every code the guide lists must be in the catalog with its name and
the class of the table that lists it; a catalog entry the guide does not list must name
another source.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.collectors.kmsg import scan_text
from starpulse.core import xid as xidcat

SNAPSHOT = Path(__file__).resolve().parent.parent / "fixtures" / "xid" / "fabric-manager-sxid.snapshot.md"
HEADINGS = {
    "Non-Fatal NVSwitch SXid Errors": "non_fatal",
    "Fatal NVSwitch SXid Errors": "fatal",
    "Always Fatal NVSwitch SXid Errors": "always_fatal",
    "Other Notable NVSwitch SXid Errors": "notable",
}
# The one notable SXid the guide calls fatal: "This SXid error is never expected to occur.
# If it occurs, it is fatal to the fabric/system."
FATAL_NOTABLE = {10003}


def snapshot_rows() -> list[tuple[str, int, str]]:
    """(table class, code, name) for every row, in the guide's order."""
    rows: list[tuple[str, int, str]] = []
    table = ""
    for line in SNAPSHOT.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            table = HEADINGS[line[3:].strip()]
        m = re.match(r"^\| (\d+) \| (.+) \|$", line)
        if m:
            rows.append((table, int(m.group(1)), m.group(2).strip()))
    return rows


ROWS = snapshot_rows()
CLASSES: dict[int, set[str]] = {}
for _table, _code, _ in ROWS:
    CLASSES.setdefault(_code, set()).add(_table)


def test_snapshot_holds_the_four_tables() -> None:
    by_table = {t: sum(1 for r in ROWS if r[0] == t) for t in HEADINGS.values()}
    assert by_table == {"non_fatal": 26, "fatal": 42, "always_fatal": 20, "notable": 5}
    assert len(CLASSES) == 92  # 22012 is listed twice


@pytest.mark.parametrize("row", ROWS, ids=[f"{r[1]}-{r[0]}" for r in ROWS])
def test_catalog_entry_matches_the_guide(row: tuple[str, int, str]) -> None:
    table, code, name = row
    info = xidcat.sxid_info(code)
    assert info is not None, f"SXid {code} ({name}) is in the guide but not in the catalog"
    assert info.description == name
    tables = CLASSES[code]
    expected_class = "fatal" if "fatal" in tables else table  # listed as fatal anywhere: fatal
    assert info.klass == expected_class
    fatal = expected_class in ("fatal", "always_fatal") or code in FATAL_NOTABLE
    assert info.fatal is fatal
    assert "DU-09883-001" in info.source


def test_entries_outside_the_guide_name_their_source() -> None:
    catalog = xidcat._catalog().sxids
    extra = {code: info for code, info in catalog.items() if code not in CLASSES}
    assert set(extra) == {20009}
    assert all(info.source and "DU-09883-001" not in info.source for info in extra.values())
    assert len(catalog) == 93


@pytest.mark.parametrize(
    ("line", "fatal", "action", "klass"),
    [
        # a Data line carries no word of its own: the catalog decides
        ("nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 23005, Data {0x00000000}", "true", "reboot", "always_fatal"),
        ("nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 19047, Data {0x00000000}", "true", "reboot", "fatal"),
        ("nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 20001, Data {0x00000000}", "false", "investigate", "non_fatal"),
        ("nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 10004, Data {0x00000000}", "false", "investigate", "notable"),
        # the driver's own word wins over the table
        (
            "nvidia-nvswitch0: SXid (PCI:0000:07:00.0): 20001, Fatal, Link 3 TX Replay Error",
            "true",
            "reboot",
            "non_fatal",
        ),
    ],
)
def test_the_class_reaches_the_finding(line: str, fatal: str, action: str, klass: str) -> None:
    (finding,) = scan_text(line)
    assert (finding.kind, finding.attributes["fatal"], finding.action) == ("sxid", fatal, action)
    assert finding.attributes["sxid_class"] == klass


def test_an_sxid_no_source_names_is_unknown_not_guessed() -> None:
    (finding,) = scan_text("nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 29999, Data {0x00000000}")
    assert finding.attributes["fatal"] == "unknown" and "sxid_class" not in finding.attributes


# The guide's recovery for the non-fatal codes that stall traffic or need a fabric reset.
RESTART = {11004: "Restart the guest VM", 12028: "Restart Guest VM", 19084: "Reset all GPUs and all NVSwitches"}


def test_non_fatal_codes_whose_recovery_is_a_restart_ask_for_a_reboot() -> None:
    catalog = xidcat._catalog().sxids
    asking = {code for code, info in catalog.items() if info.action}
    assert asking == set(RESTART)
    assert all(catalog[c].action == "reboot" and not catalog[c].fatal for c in RESTART)
    for line in (
        "nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, Data {0x000001c0, 0x00bd5c8a}",
        "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)",
    ):
        (finding,) = scan_text(line)
        assert (finding.attributes["fatal"], finding.action, finding.severity) == ("false", "reboot", "warning")
