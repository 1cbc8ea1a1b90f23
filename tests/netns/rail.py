"""A routed rail data plane in network namespaces, for the probe mesh's real UDP probes.

Layout, built from a ``generate_fabric`` fabric (names as the controller knows them)::

    nic ns "node-000.r0" ── eth0 ═ h0 ── leaf-b0-r0 ── u0 ═ d0 ── spine-0
                                                   └── u1 ═ d0 ── spine-1
    nic ns "node-000.r1" ── eth0 ═ h0 ── leaf-b0-r1 ── u0 ═ d1 ── spine-0 ...

- Every leaf and spine is its own namespace that routes (``ip_forward``); no bridges: a leaf
  reaches its spines over point-to-point /31 cables and holds a multipath default route
  (``nexthop via spine-0 nexthop via spine-1``) with ``fib_multipath_hash_policy=1``, so flows
  spread over the spines by their UDP ports (the 5-tuple), as an ECMP switch does.
- Every NIC of a node is its own namespace with one veth (``eth0``) to its leaf port and the
  rail address the probe plan gives it (its /32, default route to the leaf). One namespace
  per NIC, not per host: within one namespace the kernel delivers a packet to another local
  address over loopback, so a Hostping probe from a node's rail-0 NIC to its rail-1 NIC would
  never cross leaf and spine. "The host" is the NICs of one node taken together.
- Probes are real UDP sockets opened inside the NIC's namespace (``NamespaceEndpoints``: the
  opening thread enters the namespace for ``socket()`` and ``bind()`` and leaves again; a
  socket stays in the namespace it was made in), driven by real agents' probers in this
  process; the agents' gRPC to the controller stays on loopback in the root namespace.
- A flow that loses probes is traced (``agent.probe.prober``: TTL 2 expires at the spine its
  ECMP hash picked); the spine-side addresses of its cables are the spine's ``addresses`` in
  the fabric, as a fabric file gives them, so the controller names the spine.
- Faults: loss with nftables random drop on a leaf's forwarding (``leaf_loss``), on one
  leaf-spine cable (``link_loss``) or on one NIC's cable (``nic_loss``); this kernel has no
  ``tc netem``. A host's own delay is ``host_delay``: everything its NICs send leaves late,
  below the responder's processing stamp (a slow host stack), so it shows in round trips.
"""

from __future__ import annotations

import ctypes
import heapq
import ipaddress
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent.probe.endpoint import Endpoint, UdpEndpoint
from controller.fabric import Fabric
from tests.netns.harness import ROOT_PREFIX, Lab, run, tool

SUBNET = ipaddress.IPv4Network("10.213.0.0/16")
# {rail}{block} in the third octet: rail 0 block 1 is 10.213.101.x; slots from .10
ADDRESS_TEMPLATE = "10.213.1{rail}{block}.1{slot}"
_CLONE_NEWNET = 0x40000000


def missing_rail_prerequisites() -> list[str]:
    """Why the rail lab cannot run here (empty: it can): root, iproute2, nftables, and a kernel
    that lets this process make a network namespace (a container without CAP_SYS_ADMIN does not)."""
    problems = [] if os.geteuid() == 0 else ["not root"]
    for name in ("ip", "nft"):
        if shutil.which(name) is None and not os.path.exists(f"/usr/sbin/{name}"):
            problems.append(f"{name} not installed")
    if not problems:
        probe = f"{ROOT_PREFIX}{os.getpid()}x{os.urandom(3).hex()}-check"  # sweep_stale's pattern
        made = subprocess.run([tool("ip"), "netns", "add", probe], capture_output=True, text=True, check=False)
        if made.returncode != 0:
            problems.append(f"`ip netns add` refused: {made.stderr.strip() or made.returncode}")
        else:
            subprocess.run([tool("ip"), "netns", "delete", probe], capture_output=True, check=False)
    return problems


def require_rail_lab() -> None:
    """Skip cleanly where the rail lab cannot run (fail in CI, as the other netns tests do)."""
    import pytest

    problems = missing_rail_prerequisites()
    if problems:
        msg = "the rail data plane needs root, iproute2, nftables and network namespaces: " + ", ".join(problems)
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


class _Sender:
    """One thread that sends what a slow host holds back, when it falls due."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, UdpEndpoint, bytes, str, int]] = []
        self._cv = threading.Condition()
        self._n = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="rail-delay", daemon=True)
        self._thread.start()

    def later(self, at: float, ep: UdpEndpoint, data: bytes, address: str, port: int) -> None:
        with self._cv:
            self._n += 1
            heapq.heappush(self._heap, (at, self._n, ep, data, address, port))
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stop and (not self._heap or self._heap[0][0] > time.monotonic()):
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cv.wait(wait)
                if self._stop:
                    return
                _, _, ep, data, address, port = heapq.heappop(self._heap)
            ep.send(data, address, port)

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=5)


class _SlowHostEndpoint:
    """A UDP endpoint whose sends leave ``delay()`` seconds late (0: at once)."""

    def __init__(self, inner: UdpEndpoint, delay: dict[str, float], node: str, sender: _Sender) -> None:
        self._inner, self._delay, self._node, self._sender = inner, delay, node, sender
        self.stamps = inner.stamps

    @property
    def last_rx_ns(self) -> int:
        return self._inner.last_rx_ns

    def fileno(self) -> int:
        return self._inner.fileno()

    def reserve(self, nbytes: int) -> int:
        return self._inner.reserve(nbytes)

    def send(self, data: bytes, address: str, port: int) -> None:
        d = self._delay.get(self._node, 0.0)
        if d <= 0:
            self._inner.send(data, address, port)
        else:
            self._sender.later(time.monotonic() + d, self._inner, data, address, port)

    def receive(self) -> tuple[bytes, str, int] | None:
        return self._inner.receive()

    def send_ttl(self, data: bytes, address: str, port: int, ttl: int) -> None:
        self._inner.send_ttl(data, address, port, ttl)

    def expired(self) -> list[tuple[str, bytes]]:
        return self._inner.expired()

    def close(self) -> None:
        self._inner.close()


@dataclass
class RailLab:
    """The fabric's leaves, spines and NICs as routed namespaces; ``close()`` removes them."""

    fabric: Fabric
    workdir: Path
    lab: Lab = field(init=False)
    addresses: dict[str, str] = field(default_factory=dict)  # NIC -> rail address
    nic_ns: dict[str, str] = field(default_factory=dict)  # rail address -> lab host of its NIC
    host_port: dict[str, tuple[str, str]] = field(default_factory=dict)  # NIC -> (leaf, leaf's port)
    uplink: dict[tuple[str, str], str] = field(default_factory=dict)  # (leaf, spine) -> leaf's port
    host_delay_s: dict[str, float] = field(default_factory=dict)  # node -> its stack's added delay
    mtu: int = 4200  # the rails' MTU (ProbeConfig.mtu_bytes): probes are that size and never fragment
    _sender: _Sender | None = None

    def __post_init__(self) -> None:
        self.lab = Lab(self.workdir, subnet=SUBNET)

    def __enter__(self) -> RailLab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def build(self, addresses: dict[str, str]) -> None:
        """Namespaces, cables, addresses and routes for every NIC in ``addresses``."""
        self.addresses = dict(addresses)
        f = self.fabric
        leaves = sorted({leaf for nic in addresses if (leaf := f.leaf_of(nic))})
        spines = sorted({s for leaf in leaves for s in f.spines_of(leaf)})
        for name in [*leaves, *spines]:
            self.lab.add_host(name)
            # icmp_ratelimit 0: a switch's control plane answers traces at hundreds per second, not
            # Linux's one per second per destination
            self._sysctl(
                name, "net.ipv4.ip_forward=1", "net.ipv4.fib_multipath_hash_policy=1", "net.ipv4.icmp_ratelimit=0"
            )
        # leaf-spine cables: 10.213.2<spine>.<2*leaf> on the leaf, +1 on the spine
        leaf_side: dict[tuple[str, str], str] = {}
        for li, leaf in enumerate(leaves):
            for si, spine in enumerate(sorted(f.spines_of(leaf))):
                up, down = f"u{si}", f"d{li}"
                self._cable(leaf, up, spine, down)
                a = f"10.213.{200 + si}.{2 * li}"
                b = f"10.213.{200 + si}.{2 * li + 1}"
                self.lab.ip(leaf, "addr", "add", f"{a}/31", "dev", up)
                self.lab.ip(spine, "addr", "add", f"{b}/31", "dev", down)
                self.uplink[(leaf, spine)] = up
                leaf_side[(leaf, spine)] = a
                # the fabric file's switch addresses: a traced flow's time-exceeded comes from one
                f.graph.nodes[spine].setdefault("addresses", []).append(b)
        # NICs: one namespace each, a /32 and a default route to its leaf
        ports: dict[str, int] = {}
        for nic in sorted(addresses):
            leaf = f.leaf_of(nic)
            if leaf is None:
                continue
            addr = addresses[nic]
            self.lab.check_address(addr)
            host = nic.replace("/nic-", ".r")
            self.lab.add_host(host)
            port = f"h{ports.setdefault(leaf, 0)}"
            ports[leaf] += 1
            self._cable(host, "eth0", leaf, port)
            gw = str(ipaddress.ip_network(f"{addr}/24", strict=False).network_address + 1)
            self.lab.ip(host, "addr", "add", f"{addr}/32", "dev", "eth0")
            self.lab.ip(host, "route", "add", f"{gw}/32", "dev", "eth0")
            self.lab.ip(host, "route", "add", "default", "via", gw, "dev", "eth0")
            self.lab.ip(leaf, "addr", "add", f"{gw}/32", "dev", port)
            self.lab.ip(leaf, "route", "add", f"{addr}/32", "dev", port)
            self.nic_ns[addr] = host
            self.host_port[nic] = (leaf, port)
        # leaves: everything not under them over every spine; spines: each leaf's hosts via that leaf
        for leaf in leaves:
            hops: list[str] = []
            for spine in sorted(f.spines_of(leaf)):
                peer = str(ipaddress.IPv4Address(leaf_side[(leaf, spine)]) + 1)
                hops += ["nexthop", "via", peer, "dev", self.uplink[(leaf, spine)]]
            self.lab.ip(leaf, "route", "add", "default", *hops)
            for spine in sorted(f.spines_of(leaf)):
                for nic, (nl, _) in self.host_port.items():
                    if nl == leaf:
                        self.lab.ip(spine, "route", "replace", f"{addresses[nic]}/32", "via", leaf_side[(leaf, spine)])
        for name in self.lab.hosts:  # asymmetric ECMP return paths are the point: no reverse-path filter
            self._sysctl(name, "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0")

    def _cable(self, a: str, a_if: str, b: str, b_if: str) -> None:
        self.lab.link(a, a_if, b, b_if)
        self.lab.ip(a, "link", "set", a_if, "mtu", str(self.mtu))
        self.lab.ip(b, "link", "set", b_if, "mtu", str(self.mtu))

    def _sysctl(self, host: str, *settings: str) -> None:
        run([tool("ip"), "netns", "exec", self.lab.ns(host), "sysctl", "-q", "-w", *settings])

    # -- the prober's seam ------------------------------------------------------------
    def endpoints(self, address: str, port: int, dscp: int) -> Endpoint:
        """An ``EndpointFactory``: a UDP socket made and bound inside the NIC's namespace."""
        host = self.nic_ns.get(address)
        if host is None:
            raise OSError(f"no NIC namespace holds {address}")
        if self._sender is None:
            self._sender = _Sender()
        with self._inside(host):
            inner = UdpEndpoint(address, port, dscp)
        node = host.split(".r", 1)[0]
        return _SlowHostEndpoint(inner, self.host_delay_s, node, self._sender)

    def _inside(self, host: str) -> _NetnsSwitch:
        return _NetnsSwitch(f"/run/netns/{self.lab.ns(host)}")

    # -- faults -----------------------------------------------------------------------
    def _drop(self, host: str, matches: list[str], percent: float) -> None:
        """Drop ``percent`` % of the UDP that ``host`` forwards and each of ``matches`` selects
        (nft's random number per packet: a silent drop, no interface counter shows it)."""
        permille = max(1, round(percent * 10))
        rules = "".join(f"  {m} meta l4proto udp numgen random mod 1000 < {permille} drop\n" for m in matches)
        self.lab.nft(
            host,
            "table inet spfault {\n chain lossy {\n  type filter hook forward priority 0; policy accept;\n"
            f"{rules} }}\n}}\n",
        )

    def leaf_loss(self, leaf: str, percent: float) -> None:
        """A leaf that silently drops ``percent`` % of what it forwards."""
        self._drop(leaf, [""], percent)

    def link_loss(self, leaf: str, spine: str, percent: float) -> None:
        """One leaf-spine cable losing ``percent`` % each way (matched at the leaf's port)."""
        port = self.uplink[(leaf, spine)]
        self._drop(leaf, [f'iifname "{port}"', f'oifname "{port}"'], percent)

    def nic_loss(self, nic: str, percent: float) -> None:
        """One NIC's cable losing ``percent`` % each way (matched at its leaf port)."""
        leaf, port = self.host_port[nic]
        self._drop(leaf, [f'iifname "{port}"', f'oifname "{port}"'], percent)

    def host_delay(self, node: str, seconds: float) -> None:
        """Everything ``node``'s NICs send leaves ``seconds`` late (0 clears it)."""
        self.host_delay_s[node] = seconds

    def clear(self) -> None:
        self.host_delay_s.clear()
        for host in self.lab.hosts:
            run([tool("ip"), "netns", "exec", self.lab.ns(host), tool("nft"), "flush", "ruleset"], check=False)

    def close(self) -> None:
        if self._sender is not None:
            self._sender.close()
            self._sender = None
        self.lab.close()


class _NetnsSwitch:
    """Enter a namespace in this thread only, and come back to the one it was in."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._home = -1

    def __enter__(self) -> None:
        self._home = os.open(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
        fd = os.open(self._path, os.O_RDONLY)
        try:
            _setns(fd)
        finally:
            os.close(fd)

    def __exit__(self, *exc: object) -> None:
        try:
            _setns(self._home)
        finally:
            os.close(self._home)
