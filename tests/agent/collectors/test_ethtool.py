"""ethtool -S parsing, counter selection, caching and failure isolation."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from agent.collectors.ethtool import EthtoolCollector, parse_ethtool_stats, parse_interesting, select_interesting
from starpulse.core.clock import FakeClock
from starpulse.v1 import telemetry_pb2 as tpb

SAMPLE = Path(__file__).resolve().parents[2] / "fixtures" / "ethtool" / "mlx5_ens1f0np0.txt"


def report(*netdevs: str) -> tpb.Report:
    r = tpb.Report()
    for i, nd in enumerate(netdevs):
        r.nics.add(rdma_device=f"mlx5_{i}", port=1, netdev=nd)
    return r


class FakeRunner:
    def __init__(self, texts: dict[str, str], fail: Sequence[str] = ()) -> None:
        self.texts = texts
        self.fail = set(fail)
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> str:
        self.calls.append(list(argv))
        nd = argv[-1]
        if nd in self.fail:
            raise subprocess.CalledProcessError(94, list(argv), stderr="no stats available")
        return self.texts[nd]


class TestParse:
    def test_parses_mlx5_sample(self):
        """Every "name: value" line of a real-looking mlx5 ethtool -S is parsed; the header is not."""
        stats = parse_ethtool_stats(SAMPLE.read_text())
        assert "NIC statistics" not in stats
        assert stats["rx_packets"] == 61553081
        assert stats["rx_bytes_phy"] == 36220481201044883
        assert stats["rx_prio3_pause"] == 5549017
        assert stats["tx0_bytes"] == 1732844
        assert len(stats) == 95  # every line but the header

    def test_ignores_junk(self):
        """Lines without an integer value are ignored."""
        assert parse_ethtool_stats("NIC statistics:\n  a: 1\n  b: x\n  c:\n  d: -5\n\n") == {"a": 1}

    def test_selects_interesting_counters(self):
        """Only pause, storm, PHY error, buffer, PCIe and module counters are kept."""
        got = select_interesting(parse_ethtool_stats(SAMPLE.read_text()))
        assert got["rx_prio3_pause"] == 5549017 and got["tx_prio3_pause_duration"] == 14099744
        assert got["tx_pause_storm_warning_events"] == 4 and got["rx_out_of_buffer"] == 17
        assert got["rx_crc_errors_phy"] == 3 and got["rx_corrected_bits_phy"] == 2814
        assert got["link_down_events_phy"] == 1 and got["module_unplug"] == 0
        assert got["rx_pci_signal_integrity"] == 0 and got["rx_discards_phy"] == 2
        for dropped in (
            "rx_packets",
            "rx_bytes_phy",
            "rx_prio3_pause_transition",
            "rx_prio3_bytes",
            "outbound_pci_stalled_rd",
            "rx_err_lane_0_phy",
            "tx0_bytes",
        ):
            assert dropped not in got
        assert len(got) == 24

    def test_one_pass_parse_keeps_the_same(self):
        """parse_interesting (what the collector runs) equals select_interesting(parse_ethtool_stats(..))."""
        junk = (
            "NIC statistics:\n  rx_prio0_pause: -3\n  rx_prio1_pause : 7 \n  x rx_prio2_pause: 9\n"
            "  tx_prio4_pause_duration:\t11\r\nmodule_high_temp: 2\n  rx_prio5_pause: x\n  rx_crc_errors_phy: -0\n"
            "  rx_prio6_pause: 1\n  rx_prio6_pause: 4\n  tx_pause_storm_error_events 5\n"
        )
        for text in (SAMPLE.read_text(), junk):
            assert parse_interesting(text) == select_interesting(parse_ethtool_stats(text))
        assert parse_interesting(junk) == {
            "rx_prio1_pause": 7,
            "tx_prio4_pause_duration": 11,
            "module_high_temp": 2,
            "rx_crc_errors_phy": 0,
            "rx_prio6_pause": 4,
        }


class TestEthtoolCollector:
    def test_fills_samples_with_netdevs(self):
        """Samples with a netdev get ethtool_stats via ``ethtool -S <netdev>``; others are left alone."""
        runner = FakeRunner({"ens1f0np0": SAMPLE.read_text()})
        c = EthtoolCollector(runner=runner)
        assert c.supported()
        r = report("ens1f0np0", "")
        assert c.collect(r) == []
        assert r.nics[0].ethtool_stats["rx_prio3_pause"] == 5549017
        assert len(r.nics[1].ethtool_stats) == 0
        assert runner.calls == [["ethtool", "-S", "ens1f0np0"]]

    def test_caches_between_runs(self):
        """Within min_interval_s the last values are re-used without running the tool."""
        clock = FakeClock(monotonic_s=100.0)
        runner = FakeRunner({"ens1f0np0": "NIC statistics:\n     rx_prio3_pause: 1\n"})
        c = EthtoolCollector(runner=runner, min_interval_s=10.0, clock=clock.monotonic)
        c.collect(report("ens1f0np0"))
        runner.texts["ens1f0np0"] = "NIC statistics:\n     rx_prio3_pause: 2\n"
        clock.advance(5)
        r = report("ens1f0np0")
        c.collect(r)
        assert r.nics[0].ethtool_stats["rx_prio3_pause"] == 1 and len(runner.calls) == 1
        clock.advance(6)
        r = report("ens1f0np0")
        c.collect(r)
        assert r.nics[0].ethtool_stats["rx_prio3_pause"] == 2 and len(runner.calls) == 2

    def test_one_failing_netdev_loses_nothing_else(self):
        """A netdev whose ethtool fails is skipped; the others still get their stats."""
        runner = FakeRunner({"a": "NIC statistics:\n     module_unplug: 3\n"}, fail=["bond0"])
        c = EthtoolCollector(runner=runner)
        r = report("bond0", "a")
        c.collect(r)
        assert len(r.nics[0].ethtool_stats) == 0
        assert r.nics[1].ethtool_stats["module_unplug"] == 3

    def test_stats_dir(self, tmp_path):
        """With stats_dir, ``<stats_dir>/<netdev>`` stands in for the binary; a missing file is skipped."""
        (tmp_path / "ens1f0np0").write_text(SAMPLE.read_text())
        c = EthtoolCollector(stats_dir=str(tmp_path))
        assert c.supported()
        r = report("ens1f0np0", "ens2f0np0")
        c.collect(r)
        assert r.nics[0].ethtool_stats["tx_prio3_pause"] == 881234
        assert len(r.nics[1].ethtool_stats) == 0

    def test_netdev_allowlist(self):
        """``netdevs`` limits which netdevs are queried."""
        runner = FakeRunner({"a": "x: 1\n module_unplug: 1\n", "b": "module_unplug: 2\n"})
        c = EthtoolCollector(runner=runner, netdevs=["b"])
        r = report("a", "b")
        c.collect(r)
        assert [len(s.ethtool_stats) for s in r.nics] == [0, 1]
        assert runner.calls == [["ethtool", "-S", "b"]]
