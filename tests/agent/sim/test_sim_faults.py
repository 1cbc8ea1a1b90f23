"""The simulator's fault table: one registry, typed parameters, and every node fault injected and cleared.

The table-driven tests run over FAULTS itself, so a kind added to the table is covered
here without anyone adding a case.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from agent.sim.fault_kinds import (
    FaultError,
    FaultKind,
    FaultTable,
    OnCluster,
    OnNode,
    Param,
    UnknownFault,
    part_index,
)
from agent.sim.faults import FAULTS
from agent.sim.node import SimNode
from starpulse.core import vocab
from tests.fault_watch import Watch, examples, node_view

NODE_KINDS = [k for k in FAULTS if k.node is not None]


def _nothing(*_: Any) -> None:
    return None


def a_kind(name: str = "x_fault", **changes: Any) -> FaultKind:
    """A well-formed kind acting on a GPU, with ``changes`` applied."""
    base = FaultKind(name, "a test fault", frozenset({"gpu"}), ("gpu_fault",), node=OnNode("gpu", _nothing, _nothing))
    return dataclasses.replace(base, **changes)


class TestRegistry:
    def test_a_kind_registered_twice_is_an_error(self) -> None:
        """The same name twice is refused, whatever the second entry says."""
        table = FaultTable([a_kind("dup")])
        with pytest.raises(ValueError, match="fault kind 'dup' is registered twice"):
            table.register(a_kind("dup", doc="another"))
        with pytest.raises(ValueError, match="registered twice"):
            FaultTable([a_kind("dup"), a_kind("dup")])
        assert table.names() == ("dup",)

    @pytest.mark.parametrize(
        ("changes", "message"),
        [
            ({"targets": frozenset({"gpu", "rack"})}, "targets"),
            ({"incidents": ("meltdown",)}, "incidents"),
            ({"incidents": ()}, "incidents"),
            ({"node": None}, "neither a node action nor a cluster action"),
            ({"node": OnNode("nic", _nothing, _nothing)}, "node action's part 'nic'"),
            ({"targets": frozenset({"gpu", "port"})}, "need a cluster action"),
            ({"many": True}, "need a cluster action"),
            ({"params": (Param("a", "x"), Param("a", "y"))}, "listed twice"),
            ({"params": (Param("q", "x", shapes=frozenset({"port"})),)}, "parameter 'q' is for shapes"),
            ({"demo": ({"nope": 1},)}, "demo parameters {'nope': 1}: nope: unknown key"),
            ({"node": None, "cluster": OnCluster(_nothing, _nothing), "demo": ({},)}, "only a kind with a node"),
        ],
    )
    def test_an_incomplete_entry_is_refused(self, changes: dict[str, Any], message: str) -> None:
        """An entry that could not be injected, checked or answered fails when the table is built."""
        with pytest.raises(ValueError, match="fault kind 'x_fault': ") as info:
            FaultTable([a_kind(**changes)])
        assert message in str(info.value)

    def test_lookups(self) -> None:
        """An unknown kind names the known ones; only kinds with a node action act on one node."""
        with pytest.raises(UnknownFault, match=r"unknown fault kind 'gpu_melt' \(known: .*gpu_xid"):
            FAULTS["gpu_melt"]
        assert FAULTS.get("gpu_melt") is None and FAULTS.get(None) is None and "gpu_melt" not in FAULTS
        with pytest.raises(UnknownFault, match="'switch_down' is not a node fault"):
            FAULTS.on_node("switch_down")
        kind, action = FAULTS.on_node("gpu_xid")
        assert kind.name == "gpu_xid" and action.part == "gpu"
        assert len(FAULTS) == len(FAULTS.names()) == len(set(FAULTS.names()))

    def test_every_kind_is_answered_by_known_incident_kinds(self) -> None:
        """The runner's detection check reads these: each must be an incident kind the controller opens."""
        for kind in FAULTS:
            assert kind.incidents and set(kind.incidents) <= set(vocab.INCIDENT_KINDS), kind.name
            assert kind.doc, kind.name

    def test_part_index(self) -> None:
        assert part_index("gpu-2", "gpu") == 2 and part_index("node-003/nic-15", "nic") == 15
        for bad in ("nic-2", "gpu-", "gpu-x", "gpu2"):
            with pytest.raises(UnknownFault, match="is not a gpu"):
                part_index(bad, "gpu")


class TestParams:
    def test_defaults_are_filled_and_values_typed(self) -> None:
        assert FAULTS["nic_flap"].check_params({}, "nic") == {"count": 3}
        assert FAULTS["gpu_slow"].check_params({"factor": 1}, "gpu") == {"factor": 1.0}
        assert isinstance(FAULTS["gpu_slow"].check_params({"factor": 1}, "gpu")["factor"], float)
        assert FAULTS["gpu_xid"].check_params({"xid": 79}, "gpu") == {"xid": 79}
        assert FAULTS["gpu_ecc_dbe"].check_params({}, "gpu") == {}

    def test_a_parameter_for_one_shape_only(self) -> None:
        """A PFC storm's queue exists on a switch port (optional, no default), not on a NIC."""
        storm = FAULTS["pfc_storm"]
        assert storm.check_params({}, "port") == {}
        assert storm.check_params({"queue": 4}, "port") == {"queue": 4}
        with pytest.raises(FaultError, match=r"^queue: unknown key \(allowed: \)$"):
            storm.check_params({"queue": 4}, "nic")

    @pytest.mark.parametrize(
        ("kind", "raw", "key", "message"),
        [
            ("gpu_xid", {}, "xid", "is required"),
            ("gpu_xid", {"xid": None}, "xid", "is required"),
            ("gpu_xid", {"xid": "79"}, "xid", "must be an integer, got '79'"),
            ("gpu_xid", {"xid": True}, "xid", "must be an integer, got True"),
            ("gpu_xid", {"xid": 0}, "xid", "must be >= 1, got 0"),
            ("gpu_nvlink_down", {"link": 18}, "link", "must be <= 17, got 18"),
            ("gpu_slow", {"factor": 0}, "factor", "must be a number in (0, 1], got 0"),
            ("gpu_slow", {"factor": "fast"}, "factor", "must be a number in (0, 1], got 'fast'"),
            ("gpu_slow", {"factor": float("nan")}, "factor", "must be a number in (0, 1], got nan"),
            ("nic_degraded", {"rate_gbps": 0}, "rate_gbps", "must be > 0, got 0"),
            ("nic_degraded", {"rate_gbps": "fast"}, "rate_gbps", "must be a number, got 'fast'"),
            ("nic_flap", {"count": 2.5}, "count", "must be an integer, got 2.5"),
            ("nic_down", {"xid": 3}, "xid", "unknown key (allowed: )"),
            ("gpu_xid", {"xid": 79, "link": 1, "a": 2}, "a", "unknown key (allowed: xid)"),
        ],
    )
    def test_a_bad_parameter_names_its_key(self, kind: str, raw: dict[str, Any], key: str, message: str) -> None:
        with pytest.raises(FaultError) as info:
            FAULTS[kind].check_params(raw, next(iter(FAULTS[kind].targets)))
        assert (info.value.key, info.value.message) == (key, message)
        assert str(info.value) == f"{key}: {message}"


@pytest.mark.parametrize("kind", NODE_KINDS, ids=[k.name for k in NODE_KINDS])
def test_every_node_fault_shows_and_clears(kind: FaultKind, tmp_path: Path) -> None:
    """Injected on a SimNode, each node fault shows on the hardware; cleared, the node is healthy again."""
    assert kind.node is not None
    part = kind.node.part
    sim = SimNode("node-000", tmp_path, gpus=2, nics=2, seed=3, vendor=kind.needs_vendor or "nvidia")
    watch = Watch(lambda: node_view(sim), lambda: sim.advance(1.0))
    params = examples(kind, part)
    sim.inject(kind.name, f"{part}-1", **params)
    assert watch.shows(), f"{kind.name} changed nothing a collector reads"
    sim.clear(kind.name, f"{part}-1", **params)
    assert watch.left_behind() == [], kind.name


class TestSimNode:
    def test_a_fabric_fault_is_not_a_node_fault(self, tmp_path: Path) -> None:
        sim = SimNode("node-000", tmp_path, gpus=1, nics=1)
        with pytest.raises(UnknownFault, match="'optics_degraded' is not a node fault"):
            sim.inject("optics_degraded", "nic-0")

    def test_a_part_the_node_lacks(self, tmp_path: Path) -> None:
        sim = SimNode("node-000", tmp_path, gpus=1, nics=1)
        with pytest.raises(UnknownFault, match="node-000 has no gpu-1"):
            sim.inject("gpu_lost", "gpu-1")
        with pytest.raises(UnknownFault, match="is not a nic"):
            sim.inject("nic_down", "gpu-0")

    def test_parameters_are_the_tables(self, tmp_path: Path) -> None:
        """Direct callers get the same checks and defaults as a scenario file."""
        sim = SimNode("node-000", tmp_path, gpus=1, nics=1)
        with pytest.raises(FaultError, match="factor: must be a number in"):
            sim.inject("gpu_slow", "gpu-0", factor=2)
        sim.inject("gpu_slow", "gpu-0")
        assert sim.nvml.gpu(0).slow_factor == 0.7

    def test_overlapping_degradations_stack(self, tmp_path: Path) -> None:
        """The latest degradation still held shows; the last one cleared restores the nominal rate."""
        sim = SimNode("node-000", tmp_path, gpus=1, nics=1)
        rate = Path(sim.sysfs_root, "class/infiniband", sim.sysfs.rdma_devices()[0], "ports/1/rate")
        sim.inject("nic_degraded", "nic-0", rate_gbps=200)
        sim.inject("nic_degraded", "nic-0", rate_gbps=100)
        assert rate.read_text().startswith("100 Gb/sec")
        sim.clear("nic_degraded", "nic-0", rate_gbps=100)
        assert rate.read_text().startswith("200 Gb/sec")
        sim.clear("nic_degraded", "nic-0", rate_gbps=200)
        assert rate.read_text().startswith("400 Gb/sec")

    def test_a_nic_coming_up_keeps_its_other_faults(self, tmp_path: Path) -> None:
        """nic_down's clear brings the port up; a storm and a lower rate held on it stay."""
        sim = SimNode("node-000", tmp_path, gpus=1, nics=1)
        sim.inject("pfc_storm", "nic-0")
        sim.inject("nic_degraded", "nic-0", rate_gbps=100)
        sim.inject("nic_down", "nic-0")
        sim.clear("nic_down", "nic-0")
        nic = sim.sysfs._nics[0]
        assert (nic.up, nic.storm, nic.rate_gbps) == (True, True, 100.0)
