"""Simulated RDMA ports on real netdevs: the port follows the netdev's operstate, the rest is real sysfs."""

from __future__ import annotations

import os
from pathlib import Path

from agent.collectors.rdma import RdmaSysfsCollector
from agent.sim.node import SimNode
from starpulse.v1 import telemetry_pb2 as tpb


def _real_netdev(root: Path, name: str, operstate: str = "up", rx_bytes: int = 1234) -> Path:
    """A stand-in for /sys/class/net/<name> (in the netns harness it is the real one)."""
    d = root / name
    (d / "statistics").mkdir(parents=True)
    (d / "operstate").write_text(operstate + "\n")
    (d / "address").write_text("02:00:00:00:00:01\n")
    (d / "statistics" / "rx_bytes").write_text(f"{rx_bytes}\n")
    return d


def _collect(collector: RdmaSysfsCollector) -> tuple[dict[str, tpb.NicSample], list]:
    report = tpb.Report()
    findings = collector.collect(report)
    return {f"{s.rdma_device}/{s.port}": s for s in report.nics}, findings


def test_linked_port_reads_the_real_netdev_and_follows_its_operstate(tmp_path: Path) -> None:
    net = tmp_path / "net"
    real = _real_netdev(net, "ens1f0np0")  # rail 0 is real; rail 1 (ens2f0np0) is not here
    sim = SimNode("node-000", tmp_path / "sim", gpus=2, nics=2)
    assert sim.follow_real_netdevs(str(net)) == [0]
    assert os.path.realpath(os.path.join(sim.sysfs_root, "class", "net", "ens1f0np0")) == str(real)

    collector = RdmaSysfsCollector(sim.sysfs_root)
    sim.advance(1.0)
    samples, findings = _collect(collector)
    assert samples["mlx5_0/1"].netdev_operstate == "up"
    assert samples["mlx5_0/1"].netdev_stats["rx_bytes"] == 1234  # the real counter, not the simulated one
    assert samples["mlx5_1/1"].netdev_stats["rx_bytes"] > 0  # the fake tree's, moved by advance()
    assert findings == []

    (real / "operstate").write_text("lowerlayerdown\n")  # the peer pulled the cable
    sim.advance(1.0)
    samples, findings = _collect(collector)
    assert samples["mlx5_0/1"].state == "DOWN" and samples["mlx5_0/1"].netdev_operstate == "lowerlayerdown"
    assert [(f.kind, f.component) for f in findings] == [("nic_link_down", "mlx5_0/1")]
    assert samples["mlx5_1/1"].state == "ACTIVE"

    (real / "operstate").write_text("up\n")
    sim.advance(1.0)
    _, findings = _collect(collector)
    assert [(f.kind, f.component) for f in findings] == [("nic_link_up", "mlx5_0/1")]


def test_a_vanished_netdev_counts_as_down(tmp_path: Path) -> None:
    net = tmp_path / "net"
    real = _real_netdev(net, "ens1f0np0")
    sim = SimNode("node-000", tmp_path / "sim", gpus=1, nics=1)
    sim.follow_real_netdevs(str(net))
    (real / "operstate").unlink()
    sim.advance(1.0)
    samples, findings = _collect(RdmaSysfsCollector(sim.sysfs_root))
    assert samples["mlx5_0/1"].state == "DOWN"
    assert [f.kind for f in findings] == ["nic_link_down"]


def test_without_real_netdevs_nothing_changes(tmp_path: Path) -> None:
    sim = SimNode("node-000", tmp_path / "sim", gpus=1, nics=1)
    assert sim.follow_real_netdevs(str(tmp_path / "empty")) == []
    sim.advance(1.0)
    samples, findings = _collect(RdmaSysfsCollector(sim.sysfs_root))
    assert samples["mlx5_0/1"].state == "ACTIVE" and findings == []
