"""The Huawei Ascend kernel-log corpus, record by record, in every line shape an operator has.

Expectations come from Huawei's words (tests/fixtures/kmsg/ascend/README.md names them), never
from the parser. Every record is also re-written under each prefix and timestamp form of the
NVIDIA corpus test and must read the same.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.kmsg_corpus import FORMS, record_params, wrong_in_form
from tools.kmsg_corpus import VENDOR_DIRS, corpus_files

FILES = corpus_files(VENDOR_DIRS["ascend"])


def test_the_ascend_corpus_covers_every_fault_family() -> None:
    """Heartbeat losses, device loss, TS exceptions, failed resets, fault events and black-box records, with sources."""
    faults = [f for _p, d in FILES for f in d["faults"]]
    assert len(faults) >= 20
    assert {f["category"] for f in faults} == {"heartbeat", "link", "firmware", "reset", "event", "bbox", "core"}
    codes = {c for f in faults for c in f["code"]}
    for code in ("heartbeat_lost", "device_abnormal", "ts_exception", "bbox_exception", "80E18005"):
        assert code in codes, code
    for path, doc in FILES:
        for f in doc["faults"]:
            assert f["source"] in doc["sources"], (path.name, f["lines"])


@pytest.mark.parametrize("verdict", record_params(FILES))
def test_ascend_corpus_record(verdict) -> None:
    """Each fault record gives Huawei's kind, code, device and action once; benign lines give nothing."""
    assert verdict.right, f"{verdict.why}: {verdict.text}"


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize(("path", "doc"), FILES, ids=[p.name for p, _ in FILES])
def test_ascend_corpus_in_every_form(path: Path, doc, form: str) -> None:
    """Prefixes, timestamps and month names change nothing an Ascend record means."""
    wrong = wrong_in_form(path, doc, form)
    assert not wrong, wrong[:5]
