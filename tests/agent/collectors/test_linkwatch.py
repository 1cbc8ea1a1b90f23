"""The link watch: an RDMA port's state change is a finding between cycles, reported once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from agent.collectors.linkwatch import LinkWatch
from agent.collectors.rdma import RdmaSysfsCollector
from agent.sim.fake_sysfs import FakeSysfs
from starpulse.core.findings import Finding
from starpulse.v1 import telemetry_pb2 as tpb


def collect(c: RdmaSysfsCollector) -> list[Finding]:
    return c.collect(tpb.Report())


class Sink:
    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self.arrived = threading.Event()

    def __call__(self, finding: Finding) -> None:
        self.findings.append(finding)
        self.arrived.set()


class TestPollLinks:
    def test_a_port_going_down_is_one_finding_whoever_sees_it_first(self, tmp_path: Path) -> None:
        """poll_links reports the change; the next cycle, seeing the same state, reports nothing more."""
        fs = FakeSysfs(str(tmp_path), nics=4)
        c = RdmaSysfsCollector(str(tmp_path))
        assert collect(c) == [] and c.poll_links() == []
        fs.set_port_down(1)
        (down,) = c.poll_links()
        assert (down.kind, down.component, down.severity) == ("nic_link_down", "mlx5_1/1", "critical")
        assert down.attributes["netdev"] and "DOWN" in down.attributes["state"]
        assert collect(c) == [] and c.poll_links() == []
        fs.set_port_up(1)
        assert [(f.kind, f.component) for f in collect(c)] == [("nic_link_up", "mlx5_1/1")]
        assert c.poll_links() == []
        c.close()

    def test_before_the_first_cycle_there_is_nothing_to_poll(self, tmp_path: Path) -> None:
        FakeSysfs(str(tmp_path), nics=2).set_port_down(0)
        c = RdmaSysfsCollector(str(tmp_path))
        assert c.poll_links() == []  # the cycle lists the ports (and reports this one) first
        c.close()


class TestLinkWatch:
    def test_the_watch_hands_a_change_to_the_sink_without_a_cycle(self, tmp_path: Path) -> None:
        """Started after one cycle, the watch sees a port go down and sinks one nic_link_down."""
        fs = FakeSysfs(str(tmp_path), nics=4)
        c = RdmaSysfsCollector(str(tmp_path))
        collect(c)
        sink = Sink()
        c.start_link_watch(sink, poll_s=0.01)
        try:
            fs.set_port_down(3)
            assert sink.arrived.wait(5.0)
            time.sleep(0.05)  # more polls: still one finding
            assert [(f.kind, f.component) for f in sink.findings] == [("nic_link_down", "mlx5_3/1")]
        finally:
            c.close()

    def test_a_failing_poll_does_not_end_the_watch(self) -> None:
        """An exception in one poll is logged; the next polls still run."""
        calls: list[int] = []

        class Flaky:
            def poll_links(self) -> list[Finding]:
                calls.append(1)
                if len(calls) == 1:
                    raise OSError("EIO")
                return []

        watch = LinkWatch(Flaky(), lambda f: None, poll_s=0.01)
        watch.start()
        deadline = time.monotonic() + 5
        while len(calls) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        watch.close()
        assert len(calls) >= 3 and watch.polls >= 2

    def test_poll_interval_must_be_positive(self) -> None:
        with pytest.raises(ValueError, match="poll_s"):
            LinkWatch(RdmaSysfsCollector("/nonexistent"), lambda f: None, poll_s=0)


def newlink(name: str, operstate: int, kind: int = 16) -> bytes:
    """One rtnetlink RTM_NEWLINK (or DELLINK) message as the kernel lays it out."""
    import struct

    ifname = name.encode() + b"\0"
    attrs = b""
    for atype, value in ((3, ifname), (16, bytes([operstate]))):
        length = 4 + len(value)
        attrs += struct.pack("=HH", length, atype) + value + b"\0" * ((4 - length % 4) % 4)
    body = struct.pack("=BxHiII", 0, 1, 7, 0, 0) + attrs
    return struct.pack("=LHHLL", 16 + len(body), kind, 0, 0, 0) + body


class TestNetlinkParsing:
    def test_link_messages_give_name_and_operstate(self) -> None:
        """Two messages in one datagram: (name, operstate) each; DELLINK is 'gone'."""
        from agent.collectors.netlink import parse_link_messages

        data = newlink("ens1f0np0", 2) + newlink("ens2f0np0", 6) + newlink("veth9", 6, kind=17)
        assert parse_link_messages(data) == [("ens1f0np0", "down"), ("ens2f0np0", "up"), ("veth9", "gone")]

    def test_a_truncated_datagram_keeps_what_was_whole(self) -> None:
        from agent.collectors.netlink import parse_link_messages

        data = newlink("ens1f0np0", 2) + newlink("ens2f0np0", 6)[:20]
        assert parse_link_messages(data) == [("ens1f0np0", "down")]

    def test_a_notification_runs_the_hook_and_polls_at_once(self) -> None:
        """With an hour's poll, a netlink message alone makes the watch run the hook and poll, and
        close() wakes it: were it to wait out the poll, the test would hang to pytest's timeout."""
        import socket

        from agent.collectors.netlink import LinkNotifier

        ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        ours.setblocking(False)
        hooked = threading.Event()
        polled = threading.Event()

        class Source:
            def poll_links(self) -> list[Finding]:
                if hooked.is_set():
                    polled.set()
                return []

        watch = LinkWatch(
            Source(), lambda f: None, poll_s=3600.0, notifier=LinkNotifier(ours), on_netdev_change=hooked.set
        )
        watch.start()
        try:
            kernel.send(newlink("ens1f0np0", 2))
            assert polled.wait(5.0) and watch.notifications == 1
        finally:
            watch.close()  # wakes the select: no waiting out the hour's poll
            kernel.close()

    def test_a_notifier_past_select_s_fd_limit_still_wakes_the_watch(self) -> None:
        """A scenario's 66 agents in one process hold descriptors past 1024: the watch waits with poll(2)."""
        import os
        import resource
        import socket

        from agent.collectors.netlink import LinkNotifier

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and hard < 1600:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} leaves no room past 1024")
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1600), hard))
        ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        high = socket.socket(fileno=os.dup2(ours.fileno(), 1500))
        ours.close()
        high.setblocking(False)
        hooked = threading.Event()

        class Source:
            def poll_links(self) -> list[Finding]:
                return []

        watch = LinkWatch(
            Source(), lambda f: None, poll_s=60.0, notifier=LinkNotifier(high), on_netdev_change=hooked.set
        )
        watch.start()
        try:
            kernel.send(newlink("ens1f0np0", 2))
            assert hooked.wait(5.0)
        finally:
            watch.close()
            kernel.close()
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
