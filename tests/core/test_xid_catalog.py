"""NVIDIA's Xid catalog as data, tested against a verbatim snapshot of NVIDIA's own table.

The snapshot (tests/fixtures/xid/) is NVIDIA's Table 1 as published; the catalog
(starpulse/core/data/xid_catalog.yaml) is what starpulse reads. Each row of one must be
the row of the other, so an edit to the data that drifts from NVIDIA fails here.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest
import yaml

from agent.collectors.kmsg import classify
from controller.detect.model import Incident
from controller.heal.policy import ALERT_ONLY, load_policy
from starpulse.core import vocab
from starpulse.core import xid as xidcat

SNAPSHOT = Path(__file__).resolve().parent.parent / "fixtures" / "xid" / "analyzing-xid-catalog.snapshot.md"
BUCKET_WORD = re.compile(r"[A-Z0-9_]+")


def snapshot_rows() -> list[list[str]]:
    rows = []
    for line in SNAPSHOT.read_text(encoding="utf-8").splitlines():
        if re.match(r"^\| \d", line):
            rows.append([c.strip() for c in line.strip()[1:-1].split("|")])
    return rows


ROWS = snapshot_rows()


def test_snapshot_is_the_whole_table():
    """NVIDIA's table lists codes 1-172, each once."""
    assert [int(r[0]) for r in ROWS] == list(range(1, 173))


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_catalog_row_matches_nvidia(row):
    """Mnemonic, bucket, use and meaning of every code are NVIDIA's; the action is the bucket's."""
    code, mnemonic, desc, *_applies, immediate, _investigatory = row
    info = xidcat.CATALOG[int(code)]
    assert info.mnemonic == mnemonic
    bucket = immediate if BUCKET_WORD.fullmatch(immediate or "-") else ""
    assert info.immediate == bucket
    assert info.in_use == (desc != "Unused")
    if desc != "Unused":
        assert info.description == desc
    if bucket:
        assert info.action == xidcat.bucket_action(bucket)
    else:
        assert info.action == vocab.ACTION_INVESTIGATE  # NVIDIA gives no bucket: a person decides
    assert info.action in vocab.ACTIONS


def test_every_bucket_nvidia_uses_has_an_action():
    """No bucket in NVIDIA's Immediate column falls through to a default."""
    raw = yaml.safe_load(resources.files("starpulse.core.data").joinpath("xid_catalog.yaml").read_text())
    used = {r[7] for r in ROWS if BUCKET_WORD.fullmatch(r[7] or "-")}
    assert used <= set(raw["buckets"])
    assert raw["source"].startswith("https://docs.nvidia.com/") and raw["date"]


def test_code_count():
    """About 110 codes in use, as the issue says NVIDIA lists; every listed code is known."""
    in_use = [c for c, i in xidcat.CATALOG.items() if i.in_use]
    assert len(xidcat.CATALOG) == 172
    assert len(in_use) == 109


def test_severity_follows_the_action():
    """Severity is the action's, except a DBE (48), which is always at least critical."""
    for code, info in xidcat.CATALOG.items():
        want = "critical" if code == 48 else vocab.severity_for_action(info.action)
        assert info.severity == want, code


def test_package_data_is_installed():
    """The data file ships in the package (setuptools includes starpulse.core.data and *.yaml)."""
    assert resources.files("starpulse.core.data").joinpath("xid_catalog.yaml").is_file()
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '"*.yaml"' in text and 'include = ["starpulse*"' in text


# -- Xids 144-150: decoded by sub-code and error status ---------------------------------------


def nvlink5(xid: int, sub: str, word: str, status: int) -> str:
    return f"NVRM: Xid (PCI:0018:01:00): {xid}, {sub} {word} XC0 i0 Link 13 (0x0409a0c2 0x{status:08x} 0x1 0x0)"


@pytest.mark.parametrize(
    ("xid", "sub", "word", "status", "action", "decode"),
    [
        (144, "SAW_MVB", "Nonfatal", 0x8, "none", "IGNORE"),
        (144, "SAW_MVB", "Fatal", 0x2, "reset_gpu", "RESET_GPU"),
        (145, "RLW_REMAP", "Nonfatal", 0x4, "restart_app", "XID_154_EVAL"),
        (145, "RLW_TAGSTATE", "Fatal", 0x20000, "reset_gpu", "RESET_GPU"),
        (146, "TLW_RX_PIPE1", "Fatal", 0x4, "reset_gpu", "RESET_GPU"),
        (149, "NETIR_LINK_EVT", "Fatal", 0x0, "reset_gpu", "RESET_GPU"),
        (149, "NETIR_BER_EVENT", "Nonfatal", 0x2, "none", "IGNORE"),
        (150, "MSE_WATCHDOG", "Fatal", 0x0, "reset_gpu", "RESET_GPU"),
    ],
)
def test_nvlink5_decode(xid, sub, word, status, action, decode):
    """The decode sheet's bucket, never the code's default."""
    f = classify(nvlink5(xid, sub, word, status))
    assert f is not None and (f.xid, f.action, f.attributes["decode"]) == (xid, action, decode)
    assert f.attributes["subcode"] == sub and f.attributes["error_status"] == f"0x{status:08x}"


@pytest.mark.parametrize("word", ["Nonfatal", "Fatal"])
def test_nvlink5_unknown_subcode_says_so(word):
    """A sub-code in no public decode is "decode unknown"; a non-fatal one never asks for a reset."""
    f = classify(nvlink5(145, "RLW_NEWTHING", word, 0x40))
    assert f is not None and f.attributes["decode"] == "unknown"
    assert f.action == "investigate" and f.action != "reset_gpu"
    assert f.severity == ("critical" if word == "Fatal" else "warning")


def test_nvlink5_unknown_status_of_a_known_subcode():
    """A status the sheet does not list for that sub-code is not guessed either."""
    f = classify(nvlink5(144, "SAW_MVB", "Nonfatal", 0x400))
    assert f is not None and (f.attributes["decode"], f.action) == ("unknown", "investigate")


def test_nonfatal_rows_never_reset():
    """No decode row the sheet calls non-fatal maps to a reset."""
    for row in xidcat._catalog().nvlink5:
        if not row.fatal:
            assert xidcat.bucket_action(row.bucket) != vocab.ACTION_RESET_GPU, row


# -- Xid 154: the recovery action it names --------------------------------------------------


@pytest.mark.parametrize(
    ("words", "action"),
    [
        ("0x1 (GPU Reset Required)", "reset_gpu"),
        ("0x4 (Drain and Reset)", "reset_gpu"),
        ("0x2 (Node Reboot Required)", "reboot"),
        ("0x3 (Drain P2P)", "reset_gpu"),
        ("0x0 (None)", "none"),
        ("0x9 (Something New)", "investigate"),
    ],
)
def test_xid154_action_is_the_named_one(words, action):
    f = classify(f"NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to {words}")
    assert f is not None and f.action == action
    assert f.attributes["recovery_action"] == words.split("(")[1].rstrip(")")


# -- unknown codes ------------------------------------------------------------------------------


def test_unknown_xid_is_reported_with_its_number():
    f = classify("NVRM: Xid (PCI:0000:9b:00): 4242, pid=1, name=x, something new")
    assert f is not None and (f.xid, f.action, f.attributes["bucket"]) == (4242, "investigate", "UNKNOWN")


@pytest.mark.parametrize("severity", ["warning", "critical", "fatal"])
@pytest.mark.parametrize("kind", ["gpu_fault", "node_fault"])
def test_default_policy_never_evicts_for_an_unknown_xid(kind, severity):
    """Whatever the incident's grade, an uncatalogued Xid alone is an alert."""
    inc = Incident(
        id="inc-1",
        kind=kind,
        root_cause="node-003/gpu-5" if kind == "gpu_fault" else "node-003",
        component_type="gpu" if kind == "gpu_fault" else "node",
        affected_nodes=["node-003"],
        affected_jobs=[],
        severity=severity,
        action="investigate",
        evidence=[{"rule": "gpu.xid.investigate", "evidence": {"xid": 4242}}],
        opened_ms=0,
    )
    assert load_policy().decide(inc).action == ALERT_ONLY
    known = Incident(**{**inc.__dict__, "evidence": [{"rule": "gpu.xid.reboot", "evidence": {"xid": 79}}]})
    assert load_policy().decide(known).action != ALERT_ONLY  # the rule only spares unknown codes


# -- the controller files a decoded Xid under the decoded bucket ----------------------------------


def test_controller_rules_follow_the_decoded_action():
    """A non-fatal 144/145 opens no reset rule; an Xid 154 naming a reboot opens the reboot rule."""
    from controller.detect.rules import load_rules
    from starpulse.v1 import telemetry_pb2 as tpb

    rules = load_rules()

    def ids(xid: int, action: str = "") -> list[str]:
        return [r.id for r in rules.event_rules(tpb.EVENT_KIND_XID, xid, action)]

    assert ids(144, "none") == ["gpu.xid.ignore"]
    assert ids(145, "investigate") == ["gpu.xid.investigate"]
    assert ids(149, "reset_gpu") == ["gpu.xid.reset_gpu"]
    assert ids(154, "reboot") == ["gpu.xid.reboot"]
    assert ids(154) == ["gpu.xid.investigate"]  # an event without an action: the number's bucket
    assert ids(144) == ["gpu.xid.reset_gpu"]
    assert ids(79, "none") == ["gpu.xid.reboot"]  # a number-decided Xid ignores what the event says


def test_scan_verdict_of_a_nonfatal_nvlink5_xid_keeps_the_node(tmp_path):
    """End to end through the controller's engine: a non-fatal 145 is no reason to take the node out."""
    from agent.collectors.kmsg import scan_text
    from starpulse.app.nodecheck import judge
    from starpulse.v1 import inventory_pb2 as ipb
    from starpulse.v1 import telemetry_pb2 as tpb

    line = "NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x1 0x0)"
    report = tpb.Report(seq=1, timestamp_ms=1_700_000_000_000)
    v = judge("n1", ipb.Inventory(), [report], scan_text(line))
    assert v.status == "healthy", v.to_dict()
    fatal = "NVRM: Xid (PCI:0018:01:00): 145, RLW_REMAP Fatal XC0 i0 Link 13 (0x0409a0c2 0x00000040 0x1 0x0)"
    assert judge("n1", ipb.Inventory(), [report], scan_text(fatal)).status == "unhealthy"
