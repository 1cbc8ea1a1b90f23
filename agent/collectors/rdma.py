"""RDMA NICs from sysfs: inventory, raw port counters, and link up/down transitions.

``/sys/class/infiniband`` is the one source that works for both InfiniBand and RoCE
ports without extra tools. Counters are shipped raw and cumulative (the controller
computes rates and deltas), so a lost report loses no information; the only local
judgement is a port leaving or re-entering ACTIVE/LinkUp.
"""

from __future__ import annotations

import functools
import math
import os
import re
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from agent.collectors.counterfiles import PROCESS_BUDGET, CounterFiles, FileBudget
from agent.collectors.linkwatch import LinkWatch
from agent.collectors.netlink import LinkNotifier
from agent.collectors.pci import PCI_ADDR_RE
from starpulse.core import vocab
from starpulse.core.findings import Finding
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

SOURCE = "sysfs"
STATE_ACTIVE = 4
PHYS_LINK_UP = 5
_RATE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")
_STATE_RE = re.compile(r"^\s*(\d+)\s*:\s*(\S.*?)\s*$")


@functools.lru_cache(maxsize=64)  # every port's state and rate texts, every cycle: a few distinct ones
def parse_rate_gbps(text: str) -> float:
    """ "400 Gb/sec (4X NDR)" -> 400.0; 0.0 when unparsable."""
    m = _RATE_RE.match(text)
    return float(m.group(1)) if m else 0.0


@functools.lru_cache(maxsize=64)
def parse_state(text: str) -> tuple[int, str]:
    """ "4: ACTIVE" -> (4, "ACTIVE"); (0, text) when it has no numeric code."""
    m = _STATE_RE.match(text)
    if not m:
        return 0, text.strip()
    return int(m.group(1)), m.group(2)


def _read_text(path: str) -> str | None:
    """A small sysfs attribute file, stripped; None when unreadable.

    Raw os.open/os.read: a buffered text file object costs more than the read itself, and
    this runs for every port every cycle (its netdev's operstate).
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)  # a sysfs attribute is at most one page: one read
        if len(data) == 4096:  # a longer ordinary file
            while chunk := os.read(fd, 4096):
                data += chunk
    except OSError:
        return None
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace").strip()


@dataclass
class _PortFiles:
    """A port's state, phys_state and rate files kept open while its directory is the same one.

    Read every cycle, so each is re-read with pread at offset 0 like the counter files
    (sysfs regenerates the text): one syscall instead of open + read + close. One stat of
    the port directory per cycle stands in for the path lookups the opens did: a directory
    that is gone or another inode (device removed, renamed or re-created) drops the files,
    so the port goes missing at once as before.
    A file that fails (ENODEV: the device went away under it) is reopened by its path, and
    every re-list (slow_every_s) reopens them all, which bounds how long a file replaced
    within the same directory is missed where nothing says ENODEV (regular files).
    """

    ino: int
    fds: dict[str, int]  # attribute name -> open fd


def _release_port_files(kept: dict[str, _PortFiles], budget: FileBudget) -> None:
    while kept:
        files = kept.popitem()[1]
        for fd in files.fds.values():
            os.close(fd)
        budget.give_back(len(files.fds))


# Read every cycle even between full counter reads: the traffic counters (fail-slow
# throughput) and the counters whose move means the link itself changed.
FAST_COUNTERS = ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets", "link_downed")
FAST_NETDEV_STATS = ("rx_bytes", "tx_bytes")


@dataclass
class _PortState:
    ok: bool


@dataclass(frozen=True)
class _PortPaths:
    """One listed port and what rarely changes about it: its netdev and link layer."""

    dev: str
    port: int
    key: str
    path: str  # <ib_root>/<dev>/ports/<port>
    netdev: str
    nd: str  # <net_root>/<netdev>, "" without a netdev
    link_layer: str


@dataclass
class _SlowCounters:
    """A port's full counter read, reused (with fresh fast counters) until slow_every_s passes.

    Kept as a NicSample holding only the three counter maps, so a cycle between full reads
    copies it in one C-level CopyFrom instead of re-inserting ~100 map entries per port.
    """

    read_at: float
    netdev: str
    template: tpb.NicSample


class RdmaSysfsCollector:
    """RDMA devices and ports under ``<sysfs_root>/class/infiniband``."""

    name = "nic"

    def __init__(self, sysfs_root: str = "/sys", budget: FileBudget = PROCESS_BUDGET) -> None:
        """``budget``: how many files may stay open for re-reading (shared by the process's collectors)."""
        self.sysfs_root = sysfs_root
        self._budget = budget
        self.ib_root = os.path.join(sysfs_root, "class", "infiniband")
        self.net_root = os.path.join(sysfs_root, "class", "net")
        self._ports: dict[str, _PortState] = {}
        self._failing: set[str] = set()
        # Seconds between full reads of every counter file (~100 per port); 0: every cycle.
        # Error counters rarely move and the controller reads them every counter_interval
        # (15 s): at a 1 s report interval re-reading them each second is most of the
        # agent's cost. Link state and FAST_COUNTERS are read every cycle regardless.
        self.slow_every_s = 0.0
        self._slow: dict[str, _SlowCounters] = {}
        # The device and port listing, with each port's netdev and link layer, is re-read on
        # the same schedule as the slow counters (two listdirs per device and two reads per
        # port each cycle otherwise). A port that vanishes from a kept listing is dropped at
        # once and the listing re-read next cycle; a new device shows up within slow_every_s.
        self._layout: list[_PortPaths] | None = None
        self._layout_at = 0.0
        self._port_files: dict[str, _PortFiles] = {}  # by port path
        self._counters = CounterFiles(budget)  # counter directories and files kept open, closed with the collector
        # The cycle and the link watch (poll_links, another thread) share the port files and
        # each port's last state: one lock, so a change is reported once.
        self._lock = threading.Lock()
        self._watch: LinkWatch | None = None
        self._link_texts: dict[str, tuple[str | None, str | None]] = {}  # the watch's last texts per port
        weakref.finalize(self, _release_port_files, self._port_files, budget)  # dropped without close()

    # -- discovery ------------------------------------------------------------------
    def devices(self) -> list[str]:
        """RDMA device names, sorted."""
        try:
            return sorted(os.listdir(self.ib_root))
        except OSError:
            return []

    def ports(self, dev: str) -> list[int]:
        """Port numbers of one device, sorted."""
        try:
            names = os.listdir(os.path.join(self.ib_root, dev, "ports"))
        except OSError:
            return []
        return sorted(int(n) for n in names if n.isdigit())

    def netdev(self, dev: str, port: int) -> str:
        """The port's netdev: gid_attrs/ndevs/0 (RoCE, bonds), else device/net/*; "" if none."""
        nd = _read_text(os.path.join(self.ib_root, dev, "ports", str(port), "gid_attrs", "ndevs", "0"))
        if nd and nd != "<NULL>":
            return nd
        net_dir = os.path.join(self.ib_root, dev, "device", "net")
        try:
            names = sorted(os.listdir(net_dir))
        except OSError:
            return ""
        if len(names) <= 1:
            return names[0] if names else ""
        for n in names:  # several netdevs on one function: dev_port is 0-based
            if _read_text(os.path.join(net_dir, n, "dev_port")) == str(port - 1):
                return n
        return names[0]

    def pci_address(self, dev: str) -> str:
        """PCI address of the device's function, "" when ``device`` is not a PCI device."""
        link = os.path.join(self.ib_root, dev, "device")
        if not os.path.exists(link):
            return ""
        base = os.path.basename(os.path.realpath(link))
        return base if PCI_ADDR_RE.fullmatch(base) else ""

    def supported(self) -> bool:
        """True when sysfs lists at least one RDMA device."""
        return bool(self.devices())

    # -- inventory ------------------------------------------------------------------
    def describe(self, inventory: ipb.Inventory) -> None:
        """One NicInfo per (device, port); a broken device is logged and skipped."""
        for dev in self.devices():
            try:
                self._describe_device(dev, inventory)
            except Exception:
                log.exception("rdma_describe_failed", device=dev)

    def _describe_device(self, dev: str, inventory: ipb.Inventory) -> None:
        d = os.path.join(self.ib_root, dev)
        numa_txt = _read_text(os.path.join(d, "device", "numa_node"))
        try:
            numa = int(numa_txt) if numa_txt is not None else -1
        except ValueError:
            numa = -1
        node_guid = _read_text(os.path.join(d, "node_guid")) or ""
        hca_type = _read_text(os.path.join(d, "hca_type")) or ""
        fw_version = _read_text(os.path.join(d, "fw_ver")) or ""
        board_id = _read_text(os.path.join(d, "board_id")) or ""
        pci = self.pci_address(dev)
        for port in self.ports(dev):
            p = os.path.join(d, "ports", str(port))
            netdev = self.netdev(dev, port)
            mac = _read_text(os.path.join(self.net_root, netdev, "address")) if netdev else None
            inventory.nics.append(
                ipb.NicInfo(
                    rdma_device=dev,
                    port=port,
                    netdev=netdev,
                    link_layer=_read_text(os.path.join(p, "link_layer")) or "",
                    rate_gbps=parse_rate_gbps(_read_text(os.path.join(p, "rate")) or ""),
                    mac=mac or "",
                    node_guid=node_guid,
                    hca_type=hca_type,
                    fw_version=fw_version,
                    board_id=board_id,
                    pci_address=pci,
                    numa_node=numa,
                )
            )

    # -- samples ----------------------------------------------------------------------
    def start_link_watch(
        self,
        sink: Callable[[Finding], None],
        poll_s: float = 0.5,
        on_netdev_change: Callable[[], None] | None = None,
    ) -> None:
        """Report link state changes between cycles: at a netlink notification, else within ``poll_s``.

        Half a second: a cut cable or lost carrier wakes the watch at once through netlink, so
        the poll is only the fallback for port states no netdev shows. At 0.1 s the thread's
        ten wake-ups a second cost ~0.3 % of a core (bench.agent_cycle), three times the
        budget issue 18 gave the link watch; at 0.5 s the cost is within the bench's noise.
        """
        if self._watch is None:
            self._watch = LinkWatch(self, sink, poll_s, LinkNotifier.open(), on_netdev_change)
            self._watch.start()

    def poll_links(self) -> list[Finding]:
        """Only each listed port's link state (a stat and two preads on kept files): its changes as findings."""
        with self._lock:
            findings: list[Finding] = []
            seen = self._link_texts
            for pp in self._layout or ():
                texts = self._link_attrs(pp.path)
                if texts[0] is None:
                    continue  # the cycle says why (rdma_port_failed)
                if seen.get(pp.key) == texts:
                    continue  # the common case: the same two texts as the last poll
                seen[pp.key] = texts
                state_txt, phys_txt = texts
                s = tpb.NicSample(rdma_device=pp.dev, port=pp.port, link_layer=pp.link_layer, netdev=pp.netdev)
                s.state_code, s.state = parse_state(state_txt)
                s.phys_state_code, s.phys_state = parse_state(phys_txt or "")
                f = self._transition(pp.key, s)
                if f is not None:
                    findings.append(f)
            return findings

    def collect(self, report: tpb.Report) -> list[Finding]:
        """One NicSample per port; findings when a port leaves or returns to ACTIVE/LinkUp."""
        with self._lock:
            return self._collect(report)

    def _collect(self, report: tpb.Report) -> list[Finding]:
        findings: list[Finding] = []
        now = time.monotonic()
        layout = self._layout
        listed = layout is None or now - self._layout_at >= self.slow_every_s
        if layout is None or listed:
            if layout is not None:
                self._counters.revalidate(d for pp in layout for d in (f"{pp.path}/counters", f"{pp.path}/hw_counters"))
                self._counters.revalidate(f"{pp.nd}/statistics" for pp in layout if pp.nd)
            layout = self._layout = self._list_ports()
            self._layout_at = now
            for path in list(self._port_files):  # reopened by path: a file replaced within its directory
                self._drop_port_files(path)
        nics = report.nics
        for pp in layout:
            key = pp.key
            try:
                sample = self._sample(pp, now, nics)
            except Exception as e:  # one broken port must not lose the others
                if not listed and not os.path.isdir(pp.path):
                    self._layout_at = -math.inf  # gone since the listing: no sample; re-list next cycle
                    continue
                if key not in self._failing:
                    self._failing.add(key)
                    log.warning("rdma_port_failed", port=key, error=str(e) or type(e).__name__)
                continue
            if key in self._failing:
                self._failing.discard(key)
                log.info("rdma_port_recovered", port=key)
            f = self._transition(key, sample)
            if f is not None:
                findings.append(f)
        return findings

    def _list_ports(self) -> list[_PortPaths]:
        out: list[_PortPaths] = []
        for dev in self.devices():
            for port in self.ports(dev):
                p = f"{self.ib_root}/{dev}/ports/{port}"
                netdev = self.netdev(dev, port)
                nd = f"{self.net_root}/{netdev}" if netdev else ""
                link_layer = _read_text(f"{p}/link_layer") or ""
                out.append(_PortPaths(dev, port, f"{dev}/{port}", p, netdev, nd, link_layer))
        return out

    def _sample(self, pp: _PortPaths, now: float, out: RepeatedCompositeFieldContainer[tpb.NicSample]) -> tpb.NicSample:
        """Append one port's sample to ``out`` (the report's nics) and return it; nothing on error.

        Filled where it lies in the report: appending a finished sample would copy its ~100
        map entries once more.
        """
        p = pp.path
        state_txt, phys_txt, rate_txt = self._port_attrs(p)
        if state_txt is None:  # no state, no sample: a guessed "down" would be a false alarm
            raise OSError(f"cannot read {p}/state")
        s = out.add()
        try:
            self._fill(pp, now, s, state_txt, phys_txt or "", rate_txt or "")
        except BaseException:
            del out[-1]
            raise
        return s

    def _port_attrs(self, p: str) -> tuple[str | None, str | None, str | None]:
        """The port's state, phys_state and rate texts (None: unreadable), from kept files."""
        kept = self._kept(p)
        if kept is None:
            return None, None, None
        return self._attr(kept, p, "state"), self._attr(kept, p, "phys_state"), self._attr(kept, p, "rate")

    def _link_attrs(self, p: str) -> tuple[str | None, str | None]:
        """The port's state and phys_state texts only (the link watch's poll)."""
        kept = self._kept(p)
        if kept is None:
            return None, None
        return self._attr(kept, p, "state"), self._attr(kept, p, "phys_state")

    def _kept(self, p: str) -> _PortFiles | None:
        """The port's kept files, dropped and started over when its directory is gone or another one."""
        try:
            ino = os.stat(p).st_ino
        except OSError:
            self._drop_port_files(p)
            return None
        kept = self._port_files.get(p)
        if kept is not None and kept.ino != ino:
            self._drop_port_files(p)
            kept = None
        if kept is None:
            kept = self._port_files[p] = _PortFiles(ino, {})
        return kept

    def _attr(self, kept: _PortFiles, p: str, name: str) -> str | None:
        fd = kept.fds.get(name)
        if fd is not None:
            try:
                data = os.pread(fd, 4096, 0)
            except OSError:  # ENODEV (gone under the open file) or a driver error: reopen by path
                del kept.fds[name]
                os.close(fd)
                self._budget.give_back()
            else:
                return data.decode("utf-8", errors="replace").strip() if len(data) < 4096 else _read_text(f"{p}/{name}")
        path = f"{p}/{name}"
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            data = os.pread(fd, 4096, 0)
        except OSError:
            os.close(fd)
            return None
        if len(data) < 4096 and self._budget.take():
            kept.fds[name] = fd
        else:
            os.close(fd)
            if len(data) >= 4096:  # not a sysfs attribute (at most a page): read it whole
                return _read_text(path)
        return data.decode("utf-8", errors="replace").strip()

    def _drop_port_files(self, p: str) -> None:
        kept = self._port_files.pop(p, None)
        if kept is not None:
            _release_port_files({p: kept}, self._budget)

    def _fill(self, pp: _PortPaths, now: float, s: tpb.NicSample, state_txt: str, phys_txt: str, rate_txt: str) -> None:
        p = pp.path
        state_code, state = parse_state(state_txt)
        phys_code, phys = parse_state(phys_txt)
        netdev = pp.netdev
        nd = pp.nd
        key = pp.key
        slow = self._slow.get(key)
        if slow is None or slow.netdev != netdev or now - slow.read_at >= self.slow_every_s:
            template = tpb.NicSample(
                counters=self._counters.read_dir(f"{p}/counters"),
                hw_counters=self._counters.read_dir(f"{p}/hw_counters"),
                netdev_stats=self._counters.read_dir(f"{nd}/statistics") if nd else {},
            )
            self._slow[key] = _SlowCounters(now, netdev, template)
            s.CopyFrom(template)
        else:
            s.CopyFrom(slow.template)
            counters = s.counters
            for name, value in self._counters.read_names(f"{p}/counters", FAST_COUNTERS).items():
                counters[name] = value
            if nd:
                stats = s.netdev_stats
                for name, value in self._counters.read_names(f"{nd}/statistics", FAST_NETDEV_STATS).items():
                    stats[name] = value
        s.rdma_device = pp.dev
        s.port = pp.port
        s.netdev = netdev
        s.state_code = state_code
        s.state = state
        s.phys_state_code = phys_code
        s.phys_state = phys
        s.rate_gbps = parse_rate_gbps(rate_txt)
        s.link_layer = pp.link_layer
        if nd:
            s.netdev_operstate = _read_text(f"{nd}/operstate") or ""

    def _transition(self, key: str, s: tpb.NicSample) -> Finding | None:
        ok = s.state_code == STATE_ACTIVE and s.phys_state_code == PHYS_LINK_UP
        prev = self._ports.get(key)
        if prev is not None and prev.ok == ok:
            return None  # the common case: no change, nothing to build
        self._ports[key] = _PortState(ok)
        attrs = {
            "rdma_device": s.rdma_device,
            "port": str(s.port),
            "state": f"{s.state_code}: {s.state}",
            "phys_state": f"{s.phys_state_code}: {s.phys_state}",
            "rate_gbps": f"{s.rate_gbps:g}",
            "link_layer": s.link_layer,
        }
        if s.netdev:
            attrs["netdev"] = s.netdev
        if not ok and (prev is None or prev.ok):
            log.warning("rdma_link_down", port=key, state=s.state, phys_state=s.phys_state)
            return Finding(
                kind="nic_link_down",
                component=key,
                severity="critical",
                action=vocab.ACTION_CHECK_LINK,
                message=f"{key} is {s.state} / {s.phys_state}",
                source=SOURCE,
                attributes=attrs,
            )
        if ok and prev is not None and not prev.ok:
            log.info("rdma_link_up", port=key)
            return Finding(
                kind="nic_link_up",
                component=key,
                severity="info",
                action=vocab.ACTION_NONE,
                message=f"{key} is ACTIVE / LinkUp again",
                source=SOURCE,
                attributes=attrs,
            )
        return None

    def close(self) -> None:
        """Stop the link watch; close every file this collector keeps open: port attributes and counter directories."""
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        _release_port_files(self._port_files, self._budget)
        self._counters.close()
