"""The AMD (amdgpu) kernel-log corpus, record by record, in every line shape an operator has.

Expectations come from AMD's words (tests/fixtures/kmsg/amd/README.md names them), never from
the parser. Every record is also re-written under each prefix and timestamp form of the NVIDIA
corpus test and must read the same.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.kmsg_corpus import FORMS, record_params, wrong_in_form
from tools.kmsg_corpus import VENDOR_DIRS, corpus_files

FILES = corpus_files(VENDOR_DIRS["amd"])


def test_the_amd_corpus_covers_every_fault_family() -> None:
    """40+ fault records with their sources, across RAS, VM faults, hangs and firmware, plus benign lines."""
    faults = [f for _p, d in FILES for f in d["faults"]]
    assert len(faults) >= 40
    assert {f["category"] for f in faults} == {"ras", "vmfault", "hang", "fw"}
    codes = {c for f in faults for c in f["code"]}
    for code in ("UMC", "poison_consumed", "aca_uncorrectable", "vm_fault", "ring_timeout", "mes_failed"):
        assert code in codes, code
    for path, doc in FILES:
        for f in doc["faults"]:
            assert f["source"] in doc["sources"], (path.name, f["lines"])


@pytest.mark.parametrize("verdict", record_params(FILES))
def test_amd_corpus_record(verdict) -> None:
    """Each fault record gives AMD's kind, code, device, process and action once; benign lines give nothing."""
    assert verdict.right, f"{verdict.why}: {verdict.text}"


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize(("path", "doc"), FILES, ids=[p.name for p, _ in FILES])
def test_amd_corpus_in_every_form(path: Path, doc, form: str) -> None:
    """Prefixes, timestamps and month names change nothing an amdgpu record means."""
    wrong = wrong_in_form(path, doc, form)
    assert not wrong, wrong[:5]
