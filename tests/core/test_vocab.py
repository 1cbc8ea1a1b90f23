"""The shared vocabulary: one PCI form, one action -> severity map, clock-event bits as NVML has them."""

from __future__ import annotations

import pynvml
import pytest

from controller.detect.correlate import KIND_ACTIONS
from starpulse.core import vocab, xid


@pytest.mark.parametrize(
    ("written", "canonical", "key"),
    [
        ("00000000:9B:00.0", "0000:9b:00.0", "0000:9b:00"),  # NVML
        ("0000:9b:00.0", "0000:9b:00.0", "0000:9b:00"),  # sysfs
        ("PCI:0000:9b:00", "0000:9b:00.0", "0000:9b:00"),  # NVRM in the kernel log: no function
        ("9b:00.0", "0000:9b:00.0", "0000:9b:00"),  # no domain
        ("0008:01:00.0", "0008:01:00.0", "0008:01:00"),  # GB200: a non-zero domain is kept
        ("00000019:01:00.1", "0019:01:00.1", "0019:01:00"),
        (" 0000:17:00.0\n", "0000:17:00.0", "0000:17:00"),
    ],
)
def test_every_written_form_of_a_pci_address_meets_the_same_one(written: str, canonical: str, key: str) -> None:
    assert vocab.canonical_pci(written) == canonical
    assert vocab.pci_key(written) == key


def test_unparsable_pci_text_is_kept_lower_case_not_invented() -> None:
    assert vocab.canonical_pci("Not-A-Bus-Id") == "not-a-bus-id"
    assert vocab.pci_key("") == ""


def test_every_action_has_a_severity_and_the_xid_catalog_agrees() -> None:
    assert set(vocab.ACTION_SEVERITY) == set(vocab.ACTIONS)
    for info in xid.CATALOG.values():
        if info.xid != 48:  # DBE is raised to critical on purpose (xid.CATALOG[48])
            assert info.severity == vocab.severity_for_action(info.action), info
    assert vocab.severity_for_action("no_such_verb") == "warning"
    assert vocab.severity_for_action("no_such_verb", "critical") == "critical"


def test_incident_kinds_cover_what_the_correlator_names_and_only_node_faults_evict() -> None:
    assert set(KIND_ACTIONS) <= set(vocab.INCIDENT_KINDS)
    assert set(vocab.INCIDENT_KINDS) >= vocab.EVICTABLE_KINDS
    for kind in ("switch_fault", "link_fault", "partition", "node_down"):
        assert not vocab.may_evict(kind)
    assert vocab.may_evict("gpu_fault")


def test_nvidia_clock_event_reasons_are_nvmls_own_bits() -> None:
    reasons = vocab.CLOCK_EVENT_REASONS["nvidia"]
    for r in reasons:
        assert getattr(pynvml, f"nvmlClocksEventReason{r.name}") == r.bit, r.name
    assert len({r.bit for r in reasons}) == len({r.label for r in reasons}) == len(reasons)
    hw = (
        pynvml.nvmlClocksEventReasonHwSlowdown
        | pynvml.nvmlClocksEventReasonHwThermalSlowdown
        | pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    )
    assert vocab.slowdown_bits("nvidia") == hw


def test_nvlink_counters_are_in_nvmls_counter_order() -> None:
    order = ("REPLAY", "RECOVERY", "CRC_FLIT", "CRC_DATA", "ECC_DATA")
    for index, name in enumerate(order):
        assert getattr(pynvml, f"NVML_NVLINK_ERROR_DL_{name}") == index
        assert vocab.NVLINK_ERROR_COUNTERS[index].startswith(name.lower().split("_")[0])


def test_every_vendor_is_a_key_space_of_its_own() -> None:
    assert set(vocab.CLOCK_EVENT_REASONS) <= set(vocab.VENDORS)
    assert vocab.slowdown_bits("amd") == 0  # no table yet: nothing is judged a slowdown
