"""lldpcli JSON parsing and change-only LLDP reporting."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from agent.collectors.lldp import LldpCollector, parse_lldpcli_json
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "lldp"
ONE = (FIX / "one_neighbor.json").read_text()
SEVERAL = (FIX / "several_neighbors.json").read_text()


class Runner:
    def __init__(self, text: str) -> None:
        self.text = text
        self.calls = 0
        self.fail = False

    def __call__(self, argv: Sequence[str]) -> str:
        self.calls += 1
        if self.fail:
            raise subprocess.CalledProcessError(1, list(argv), stderr="unable to connect to lldpd")
        return self.text


class TestParse:
    def test_one_neighbor(self):
        """One neighbour: interface and chassis are dicts keyed by name."""
        (n,) = parse_lldpcli_json(ONE)
        assert (n.local_interface, n.chassis_name, n.chassis_id) == ("ens1f0np0", "leaf-r01-a", "1c:34:da:7e:51:00")
        assert (n.port_id, n.port_description, n.management_address) == ("Ethernet0", "etp1", "10.20.0.11")

    def test_several_neighbors(self):
        """Several neighbours: a list of one-key dicts; mgmt-ip lists keep the first; unnamed chassis work."""
        ns = parse_lldpcli_json(SEVERAL)
        assert [n.local_interface for n in ns] == ["ens1f0np0", "ens2f0np0", "eno1"]
        assert ns[1].chassis_name == "leaf-r01-b" and ns[1].port_id == "Ethernet8"
        assert ns[1].management_address == "10.20.0.12"
        assert (ns[2].chassis_name, ns[2].chassis_id, ns[2].port_id) == ("", "00:1b:21:3c:9d:10", "00:1b:21:3c:9d:2f")
        assert ns[2].port_description == "" and ns[2].management_address == ""

    @pytest.mark.parametrize("text", ['{"lldp": {}}', '{"lldp": {"interface": []}}', "", "{}"])
    def test_no_neighbors(self, text):
        """lldpd's empty answers parse to an empty list."""
        assert parse_lldpcli_json(text) == []


class TestLldpCollector:
    def test_describe_fills_inventory(self):
        """describe() puts the neighbours into the inventory."""
        c = LldpCollector(runner=Runner(SEVERAL))
        assert c.name == "lldp" and c.supported()
        inv = ipb.Inventory()
        c.describe(inv)
        assert [n.local_interface for n in inv.lldp_neighbors] == ["ens1f0np0", "ens2f0np0", "eno1"]

    def test_reports_only_changes(self):
        """report.lldp is set on the first report and then only when the list changed."""
        runner, clock = Runner(ONE), FakeClock(monotonic_s=0.0)
        c = LldpCollector(runner=runner, min_interval_s=30.0, clock=clock.monotonic)
        r1 = tpb.Report()
        assert c.collect(r1) == []
        assert r1.HasField("lldp") and len(r1.lldp.neighbors) == 1
        clock.advance(31)
        r2 = tpb.Report()
        c.collect(r2)
        assert not r2.HasField("lldp") and runner.calls == 2
        runner.text = SEVERAL
        clock.advance(31)
        r3 = tpb.Report()
        c.collect(r3)
        assert r3.HasField("lldp") and len(r3.lldp.neighbors) == 3

    def test_rate_limited(self):
        """lldpcli runs at most once per min_interval_s."""
        runner, clock = Runner(ONE), FakeClock(monotonic_s=0.0)
        c = LldpCollector(runner=runner, min_interval_s=30.0, clock=clock.monotonic)
        c.describe(ipb.Inventory())
        for _ in range(5):
            clock.advance(1)
            c.collect(tpb.Report())
        assert runner.calls == 1

    def test_empty_list_is_reported_once(self):
        """An empty neighbour list is still reported the first time (the controller learns there are none)."""
        c = LldpCollector(runner=Runner('{"lldp": {}}'), min_interval_s=0.0)
        r = tpb.Report()
        c.collect(r)
        assert r.HasField("lldp") and len(r.lldp.neighbors) == 0
        r = tpb.Report()
        c.collect(r)
        assert not r.HasField("lldp")

    def test_failure_never_raises(self):
        """A failing or garbled lldpcli is logged; the last good list is kept and nothing raises."""
        runner, clock = Runner(ONE), FakeClock(monotonic_s=0.0)
        c = LldpCollector(runner=runner, min_interval_s=1.0, clock=clock.monotonic)
        runner.fail = True
        r = tpb.Report()
        assert c.collect(r) == [] and not r.HasField("lldp")
        c.describe(ipb.Inventory())
        runner.fail = False
        clock.advance(2)
        c.collect(r := tpb.Report())
        assert len(r.lldp.neighbors) == 1
        runner.text = "{not json"
        clock.advance(2)
        c.collect(r := tpb.Report())
        assert not r.HasField("lldp")

    def test_missing_binary_is_unsupported(self):
        """Without an injected runner, a missing lldpcli means unsupported."""
        c = LldpCollector(command=("definitely-not-lldpcli-xyz", "-f", "json", "show", "neighbors"))
        assert not c.supported()
        r = tpb.Report()
        assert c.collect(r) == [] and not r.HasField("lldp")


class TestControlSocket:
    def test_command_names_the_socket(self) -> None:
        from agent.collectors.lldp import DEFAULT_COMMAND, lldpcli_command

        assert lldpcli_command(None) == DEFAULT_COMMAND
        assert lldpcli_command("/run/x/lldpd.sock") == (
            "lldpcli",
            "-u",
            "/run/x/lldpd.sock",
            "-f",
            "json",
            "show",
            "neighbors",
        )

    def test_sim_node_reads_lldp_only_when_given_a_socket(self, tmp_path: Path) -> None:
        from agent.factory import build_collectors
        from agent.sim.node import SimNode

        sim = SimNode("node-000", tmp_path / "sim", gpus=1, nics=1)
        plan = build_collectors("sim", None, sim=sim, kmsg_path=None)
        assert not [c for c in plan.collectors if isinstance(c, LldpCollector)]
        plan = build_collectors("sim", None, sim=sim, kmsg_path=None, lldpcli_socket="/tmp/l.sock", lldp_interval_s=0.5)
        (lldp,) = [c for c in plan.collectors if isinstance(c, LldpCollector)]
        assert lldp.command[:3] == ("lldpcli", "-u", "/tmp/l.sock") and lldp.min_interval_s == 0.5

    def test_sim_node_reads_lldp_from_a_given_runner(self, tmp_path: Path) -> None:
        """The scenario cluster answers lldpcli from its fabric: the factory's collector runs last, on that runner."""
        from agent.factory import build_collectors
        from agent.sim.node import SimNode

        runner = Runner(ONE)
        sim = SimNode("node-000", tmp_path / "sim", gpus=1, nics=1)
        plan = build_collectors("sim", None, sim=sim, kmsg_path=None, lldp_runner=runner, lldp_interval_s=0.5)
        lldp = plan.collectors[-1]
        assert isinstance(lldp, LldpCollector) and lldp.supported() and lldp.min_interval_s == 0.5
        assert lldp.neighbors() == parse_lldpcli_json(ONE) and runner.calls == 1
