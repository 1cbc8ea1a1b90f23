"""Network namespaces as hosts: veth links, bridges, nftables and processes, all cleaned up.

A ``Lab`` owns every namespace it creates. Each name starts with a per-run prefix
``spn<pid>x<random>-``, so parallel runs never collide and a later run can tell which
leftovers belong to a run that died (its pid is gone) and sweep them (``sweep_stale``).
Links are made directly inside their namespaces (``ip link add ... netns``), so nothing
ever appears in the root namespace; deleting a namespace deletes its links.

Safety: addresses are only ever assigned inside the lab's namespaces and only processes
started inside them connect to them (from the root namespace, 10.x routes to the
outside). ``check_address`` refuses anything outside the subnet the lab was given.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT_PREFIX = "spn"
_STALE_RE = re.compile(rf"^{ROOT_PREFIX}(\d+)x[0-9a-f]+-")
_TOOLS = ("ip", "nft", "lldpd", "lldpcli")


class LabError(RuntimeError):
    """A lab command failed; the message has the command and its stderr."""


def missing_prerequisites() -> list[str]:
    """Why a lab cannot run here (empty: it can): not root, a tool missing, ``ip netns`` refused."""
    problems = []
    if os.geteuid() != 0:
        problems.append("not root")
    for tool in _TOOLS:
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            problems.append(f"{tool} not installed")
    return problems


def require_lab() -> None:
    """Skip when a lab cannot run here, except in CI (CI=true), where that is a failure."""
    import pytest

    problems = missing_prerequisites()
    if problems:
        msg = "network-namespace tests need root, iproute2, nftables and lldpd: " + ", ".join(problems)
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """While inside, SIGTERM raises KeyboardInterrupt in the main thread, so a CI job that is
    cancelled still runs the finalizers that delete the lab (SIGKILL cannot be caught: the
    next run's ``sweep_stale`` removes what such a run left)."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def tool(name: str) -> str:
    """Path of a system tool (root's PATH may lack /usr/sbin)."""
    return shutil.which(name) or f"/usr/sbin/{name}"


def run(
    argv: Sequence[str], *, input_text: str | None = None, check: bool = True, timeout: float = 20.0
) -> subprocess.CompletedProcess[str]:
    """Run a command without a shell; LabError with its stderr when it fails."""
    res = subprocess.run(list(argv), check=False, input=input_text, capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise LabError(f"{' '.join(argv)}: exit {res.returncode}: {res.stderr.strip()}")
    return res


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def list_namespaces() -> list[str]:
    """Names of every network namespace (``ip netns list`` prints "name (id: N)")."""
    out = run([tool("ip"), "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _kill_namespace_processes(ns: str) -> None:
    """SIGKILL whatever still runs in ``ns`` (after the polite stop), by pid."""
    res = run([tool("ip"), "netns", "pids", ns], check=False)
    for tok in res.stdout.split():
        if tok.isdigit():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(tok), signal.SIGKILL)


def delete_namespace(ns: str) -> None:
    """Kill what runs in ``ns`` and delete it (its links go with it)."""
    _kill_namespace_processes(ns)
    run([tool("ip"), "netns", "delete", ns], check=False)


def sweep_stale(tmp_dir: str = "/tmp") -> list[str]:
    """Delete namespaces (and socket folders under ``tmp_dir``) of this harness whose creating
    process is dead: what a run killed with SIGKILL left behind."""
    swept = []
    for ns in list_namespaces():
        m = _STALE_RE.match(ns)
        if m and not _pid_alive(int(m.group(1))):
            delete_namespace(ns)
            swept.append(ns)
    for entry in os.scandir(tmp_dir):
        m = _STALE_RE.match(entry.name)
        if m and entry.is_dir(follow_symlinks=False) and not _pid_alive(int(m.group(1))):
            shutil.rmtree(entry.path, ignore_errors=True)
            swept.append(entry.path)
    return swept


@dataclass
class Proc:
    """A process started in a namespace; its output goes to ``log``."""

    name: str
    host: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Lab:
    """Hosts (namespaces), links between them and processes in them; ``close()`` removes it all."""

    workdir: Path
    subnet: ipaddress.IPv4Network = field(default_factory=lambda: ipaddress.ip_network("10.213.0.0/24"))
    prefix: str = field(default_factory=lambda: f"{ROOT_PREFIX}{os.getpid()}x{secrets.token_hex(3)}-")
    hosts: dict[str, str] = field(default_factory=dict)  # host -> namespace
    procs: list[Proc] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.subnet.is_private or not self.subnet.subnet_of(ipaddress.ip_network("10.0.0.0/8")):
            raise ValueError(f"lab subnet {self.subnet} must be inside 10.0.0.0/8")
        self.workdir.mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- hosts and links --------------------------------------------------------------
    def ns(self, host: str) -> str:
        """The namespace of one of this lab's hosts (KeyError for anything else)."""
        return self.hosts[host]

    def add_host(self, host: str) -> str:
        ns = self.prefix + host
        run([tool("ip"), "netns", "add", ns])
        self.hosts[host] = ns
        self.ip(host, "link", "set", "lo", "up")
        return ns

    def ip(self, host: str, *args: str) -> subprocess.CompletedProcess[str]:
        """``ip -n <ns> ...`` in one of this lab's hosts."""
        return run([tool("ip"), "-n", self.ns(host), *args])

    def link(self, a: str, a_if: str, b: str, b_if: str) -> None:
        """A cable: a veth pair with one end in each host, both up."""
        run(
            [
                tool("ip"),
                "link",
                "add",
                a_if,
                "netns",
                self.ns(a),
                "type",
                "veth",
                "peer",
                "name",
                b_if,
                "netns",
                self.ns(b),
            ]
        )
        self.ip(a, "link", "set", a_if, "up")
        self.ip(b, "link", "set", b_if, "up")

    def bridge(self, host: str, name: str, ports: Sequence[str]) -> None:
        """A Linux bridge in ``host`` over ``ports`` (no STP: forwarding at once)."""
        self.ip(host, "link", "add", name, "type", "bridge")
        for port in ports:
            self.ip(host, "link", "set", port, "master", name)
        self.ip(host, "link", "set", name, "up")

    def check_address(self, address: str) -> ipaddress.IPv4Address:
        addr = ipaddress.IPv4Address(address.split("/", maxsplit=1)[0])
        if addr not in self.subnet:
            raise ValueError(f"{address} is outside the lab subnet {self.subnet}")
        return addr

    def address(self, host: str, ifname: str, address: str) -> None:
        """Assign ``address`` (in the lab subnet, with the subnet's prefix length) inside ``host``."""
        addr = self.check_address(address)
        self.ip(host, "addr", "add", f"{addr}/{self.subnet.prefixlen}", "dev", ifname)

    def set_link(self, host: str, ifname: str, up: bool) -> None:
        """Bring one end of a cable up or down (the peer sees carrier go with it)."""
        self.ip(host, "link", "set", ifname, "up" if up else "down")

    def operstate(self, host: str, ifname: str) -> str:
        out = self.ip(host, "-o", "link", "show", ifname).stdout
        m = re.search(r"state (\S+)", out)
        return m.group(1) if m else ""

    def nft(self, host: str, ruleset: str) -> None:
        """Load an nftables ruleset inside ``host``."""
        run([tool("ip"), "netns", "exec", self.ns(host), tool("nft"), "-f", "-"], input_text=ruleset)

    def nft_flush(self, host: str) -> None:
        run([tool("ip"), "netns", "exec", self.ns(host), tool("nft"), "flush", "ruleset"])

    # -- processes --------------------------------------------------------------------
    def spawn(
        self,
        host: str,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
    ) -> Proc:
        """Start ``argv`` inside ``host``; stdout and stderr go to ``<workdir>/<name>.log``."""
        log = self.workdir / f"{name}.log"
        with log.open("wb") as fh:  # the child keeps its own descriptor
            popen = subprocess.Popen(
                [tool("ip"), "netns", "exec", self.ns(host), *argv],
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                cwd=cwd,
                start_new_session=True,
            )
        proc = Proc(name, host, popen, log)
        self.procs.append(proc)
        return proc

    def stop(self, proc: Proc, timeout: float = 5.0) -> None:
        """SIGTERM, wait, then SIGKILL: the process and anything it started in its session."""
        if proc.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.popen.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(5)

    def close(self) -> None:
        """Stop every process (newest first), then delete every namespace. Safe to call twice."""
        errors: list[str] = []
        for proc in reversed(self.procs):
            try:
                self.stop(proc)
            except Exception as exc:  # keep cleaning up
                errors.append(f"{proc.name}: {exc}")
        self.procs.clear()
        for ns in list(self.hosts.values()):
            try:
                delete_namespace(ns)
            except Exception as exc:
                errors.append(f"{ns}: {exc}")
        self.hosts.clear()
        if errors:
            raise LabError("cleanup: " + "; ".join(errors))

    def leftovers(self) -> list[str]:
        """Namespaces with this lab's prefix that still exist (empty after close())."""
        return [ns for ns in list_namespaces() if ns.startswith(self.prefix)]


def wait_until(
    pred: Callable[[], object],
    timeout: float,
    what: str,
    interval: float = 0.2,
    diagnose: Callable[[], str] | None = None,
) -> object:
    """Poll ``pred`` until it returns something truthy; AssertionError naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    extra = f"\n{diagnose()}" if diagnose is not None else ""
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what} (last: {last!r}){extra}")
