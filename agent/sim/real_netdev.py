"""Simulated RDMA ports whose netdevs are real interfaces of this host (the netns test harness).

On real mlx5 RoCE hardware the RDMA port state follows its netdev's carrier: pull the
cable and ``ports/1/state`` goes DOWN together with ``operstate``. In the multi-host
harness each node's rail netdevs (``ens1f0np0``...) are real veth interfaces wired to
switch hosts, so the only missing hardware is the RDMA device. This module plays the
driver's part and nothing more: it points the fake tree's ``class/net/<netdev>`` at the
real interface (so the RDMA collector reads the real operstate, MAC and statistics) and,
before each collect, sets the fake port state from the real operstate. The collector
itself runs unchanged.
"""

from __future__ import annotations

import os

import structlog

from agent.sim.fake_sysfs import FakeSysfs

log = structlog.get_logger(__name__)


def _operstate(path: str) -> str:
    try:
        with open(os.path.join(path, "operstate"), encoding="ascii", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return ""


class RealNetdevs:
    """Links the rail NICs of ``sysfs`` whose netdev exists under ``net_root`` to it."""

    def __init__(self, sysfs: FakeSysfs, net_root: str = "/sys/class/net") -> None:
        self.sysfs = sysfs
        self.net_root = net_root
        self.linked: dict[int, str] = {}  # NIC index -> real netdev directory
        self._up: dict[int, bool] = {}
        for i, netdev in enumerate(sysfs.netdevs()):
            real = os.path.join(net_root, netdev)
            if not os.path.isdir(real):
                continue
            link = os.path.join(sysfs.root, "class", "net", netdev)
            if os.path.lexists(link):
                os.unlink(link)
            os.symlink(os.path.abspath(real), link)
            self.linked[i] = real
        log.info("sim_real_netdevs", linked=sorted(os.path.basename(p) for p in self.linked.values()))

    def sync(self) -> dict[int, bool]:
        """Set each linked port ACTIVE or DOWN from its netdev's operstate; returns the changes."""
        changed: dict[int, bool] = {}
        for i, real in self.linked.items():
            up = _operstate(real) == "up"
            if self._up.get(i) == up:
                continue
            self._up[i] = up
            changed[i] = up
            if up:
                self.sysfs.set_port_up(i)
            else:
                self.sysfs.set_port_down(i)
            log.info("sim_port_follows_carrier", nic=i, netdev=os.path.basename(real), up=up)
        return changed
