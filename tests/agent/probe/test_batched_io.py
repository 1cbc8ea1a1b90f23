"""The prober's batched I/O: many datagrams per system call, replies made in place."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from agent.probe import mmsg, wire
from agent.probe.endpoint import UdpEndpoint
from agent.probe.prober import TICK_S, Prober, fitting_tick_ns
from starpulse.v1 import service_pb2 as spb

pytestmark = pytest.mark.skipif(mmsg.batch(1, 64) is None, reason="libc without recvmmsg/sendmmsg")


def _udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def client() -> Iterator[socket.socket]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.44.2", 0))
    s.settimeout(5)
    yield s
    s.close()


def test_a_batch_reads_many_datagrams_in_one_call_and_sends_each_back(client: socket.socket) -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_TIMESTAMPNS", 35), 1)
    server.bind(("127.0.44.1", 0))
    try:
        b = mmsg.batch(8, 256)
        assert b is not None
        sizes = [40, 100, 256, 300]  # the last is longer than a slot: cut to it
        before = time.time_ns()
        for n in sizes:
            client.sendto(bytes([n % 251]) * n, server.getsockname())
        got = 0
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            got = b.recv(server.fileno())
        assert got == 4
        assert [b.length(i) for i in range(got)] == [40, 100, 256, 256]
        assert all(b.sender(i) == client.getsockname() for i in range(got))
        assert all(before <= b.stamp(i) <= time.time_ns() for i in range(got))
        assert bytes(b.data[256 : 256 + 100]) == bytes([100]) * 100
        b.data[0] = 7  # a reply written into its slot goes back at its own length
        assert b.send_back(server.fileno(), [b.length(0), b.length(1)]) == 2
        assert b.recv(server.fileno()) == 0  # empty now: nothing raised
        first, second = client.recv(1024), client.recv(1024)
        assert (len(first), first[0], len(second)) == (40, 7, 100)
    finally:
        server.close()


@pytest.mark.parametrize("use_mmsg", [True, False])
def test_a_responder_answers_every_request_in_place_and_ignores_strangers(
    client: socket.socket, use_mmsg: bool
) -> None:
    port = _udp_port()
    p = Prober(seed=1, tick_s=0.05, use_mmsg=use_mmsg)
    plan = spb.ProbePlan(version=1, port=port, dscp=26, payload_bytes=600, timeout_ms=500, window_s=1)
    plan.listen["a/nic-0"] = "127.0.44.1"
    p.apply(plan)
    p.start()
    try:
        deadline = time.monotonic() + 5
        while not p._responders and time.monotonic() < deadline:  # bound: what arrives now waits for it
            time.sleep(0.01)
        sends = [1, 2, None, 3, 4, 5]  # seqs; None: a datagram that is no probe
        for seq in sends:
            probe = wire.Probe(wire.REQUEST, seq or 0, 1000 + (seq or 0))
            data = b"not a probe, just noise" * 20 if seq is None else wire.encode(probe, 600)
            client.sendto(data, ("127.0.44.1", port))
        raw = [client.recv(2048) for _ in range(5)]
        assert {len(r) for r in raw} == {600}  # the request's size: MTU-sized both ways
        replies = [wire.decode(r) for r in raw]
        assert all(r is not None for r in replies)
        assert sorted((r.kind, r.seq, r.sent_ns, r.epoch) for r in replies if r) == [
            (wire.REPLY, s, 1000 + s, p.epoch) for s in (1, 2, 3, 4, 5)
        ]
        assert all(r is not None and 0 <= r.processing_ns < 5_000_000_000 for r in replies)
        client.settimeout(0.3)
        with pytest.raises(TimeoutError):
            client.recv(2048)  # the stranger got nothing
        assert p.answered_total == 5
    finally:
        p.stop()


@pytest.mark.parametrize(("pps", "reads"), [(2.0, 1), (400.0, 64)])
def test_a_flow_socket_is_read_once_per_tick_only_where_under_half_a_reply_a_tick_is_due(
    pps: float, reads: int
) -> None:
    """At 100 ms ticks: 2 probes/s over 2 flows is 0.1 reply a tick per socket (one read, no read
    that finds it empty); 400/s is 20 a tick (read until empty, or the socket's backlog would grow)."""
    p = Prober(seed=1, tick_s=0.1)
    plan = spb.ProbePlan(version=1, port=_udp_port(), dscp=26, payload_bytes=200, timeout_ms=500, window_s=1)
    plan.listen["a/nic-0"] = "127.0.44.1"
    plan.targets.add(
        local_nic="a/nic-0",
        local_address="127.0.44.1",
        peer_nic="b/nic-0",
        peer_address="127.0.44.3",
        src_ports=[_udp_port(), _udp_port()],
        packets_per_s=pps,
    )
    p.apply(plan)
    p.start()
    try:
        deadline = time.monotonic() + 5
        while p.plan.version != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        woke = p.wakeups_total  # the pass that applied the plan is over once the loop has gone round
        while p.wakeups_total < woke + 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        sockets = list(p._sockets.values())
        assert sorted(s.reads for s in sockets if s.nic) == [reads, reads]
        assert [s.reads for s in sockets if not s.nic] == [64]  # a responder reads until empty
    finally:
        p.stop()


def test_a_responder_asks_for_room_for_a_ticks_requests_and_a_flow_socket_does_not() -> None:
    """A responder answers once a tick, holding that tick's requests in its socket meanwhile: it
    asks for a larger receive buffer than the kernel's default (which a flow socket keeps)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as plain:
        default = plain.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    p = Prober(seed=1)
    plan = spb.ProbePlan(version=1, port=_udp_port(), dscp=26, payload_bytes=200, timeout_ms=500, window_s=1)
    plan.listen["a/nic-0"] = "127.0.44.1"
    plan.targets.add(
        local_nic="a/nic-0",
        local_address="127.0.44.1",
        peer_nic="b/nic-0",
        peer_address="127.0.44.3",
        src_ports=[_udp_port()],
        packets_per_s=2.0,
    )
    p.apply(plan)
    p.start()
    try:
        deadline = time.monotonic() + 5
        while len(p._sockets) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        buffers = {s.nic: s.ep._sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) for s in p._sockets.values()}  # type: ignore[attr-defined]
        assert buffers["a/nic-0"] == default
        assert buffers[""] > default
    finally:
        p.stop()


def test_the_tick_shortens_where_a_responders_buffer_would_not_hold_two_ticks_of_requests() -> None:
    tick = 500_000_000
    # 2 MiB granted, 4,172-byte probes: ~250 requests fit; 20 a second is 10 a tick: the tick stays
    assert fitting_tick_ns(tick, 2 << 20, 4172, 20.0) == tick
    # the kernel's default 212,992 bytes hold ~25 such requests: at 50 a second, a quarter second
    assert fitting_tick_ns(tick, 212_992, 4172, 50.0) == int(1e9 * (212_992 / 8344) / 100)
    assert fitting_tick_ns(tick, 212_992, 4172, 1e6) == 20_000_000  # never below the floor
    assert fitting_tick_ns(tick, 212_992, 4172, 0.0) == tick  # a responder-only plan


def test_a_prober_whose_responders_get_a_small_buffer_ticks_faster() -> None:
    class Small(UdpEndpoint):
        def reserve(self, nbytes: int) -> int:
            return 50_000  # as if the kernel granted little

    p = Prober(endpoints=Small, seed=1)
    plan = spb.ProbePlan(version=1, port=_udp_port(), dscp=26, payload_bytes=4172, timeout_ms=500, window_s=1)
    plan.listen["a/nic-0"] = "127.0.44.1"
    plan.targets.add(
        local_nic="a/nic-0",
        local_address="127.0.44.1",
        peer_nic="b/nic-0",
        peer_address="127.0.44.3",
        src_ports=[_udp_port()],
        packets_per_s=20.0,
    )
    p.apply(plan)
    p.start()
    try:
        deadline = time.monotonic() + 5
        while p._batch_ns == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert p._batch_ns == fitting_tick_ns(int(TICK_S * 1e9), 50_000, 4172, 20.0) < int(TICK_S * 1e9)
    finally:
        p.stop()
