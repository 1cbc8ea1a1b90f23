"""The agent's prober over loopback: real UDP sockets on per-rail 127.x addresses."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from agent.probe import wire
from agent.probe.endpoint import UdpEndpoint
from agent.probe.prober import PathFate, Prober
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb


def _udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _plan(version: int, me: str, peer: str, port: int, *, pps: float = 200.0, timeout_ms: int = 200) -> spb.ProbePlan:
    addr = {"a/nic-0": "127.0.41.1", "b/nic-0": "127.0.42.1"}
    plan = spb.ProbePlan(version=version, port=port, dscp=26, payload_bytes=1000, timeout_ms=timeout_ms, window_s=1)
    plan.listen[me] = addr[me]
    plan.targets.add(
        local_nic=me,
        local_address=addr[me],
        peer_nic=peer,
        peer_address=addr[peer],
        src_ports=[_udp_port(), _udp_port()],
        packets_per_s=pps,
        purpose="cross",
    )
    return plan


def _wait_results(p: Prober, n: int = 1, limit_s: float = 10.0) -> list[tpb.ProbeResult]:
    out: list[tpb.ProbeResult] = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        out += p.take_results()
        if len(out) >= 2 * n:
            return out
        time.sleep(0.1)
    raise AssertionError(f"no results within {limit_s}s: {out}")


@pytest.fixture
def pair() -> Iterator[tuple[Prober, Prober, int]]:
    port = _udp_port()
    a, b = Prober(seed=1, tick_s=0.005), Prober(seed=2, tick_s=0.005)
    a.start()
    b.start()
    yield a, b, port
    a.stop()
    b.stop()


def test_two_nodes_probe_each_other_with_no_loss(pair: tuple[Prober, Prober, int]) -> None:
    a, b, port = pair
    # The responder is up before the first probe leaves, and a reply held up by a loaded
    # test machine's scheduler is late, not lost: what this asserts is the loopback's no loss.
    b.apply(_plan(1, "b/nic-0", "a/nic-0", port, timeout_ms=3000))
    a.apply(_plan(1, "a/nic-0", "b/nic-0", port, timeout_ms=3000))
    results = _wait_results(a, n=2)
    assert {r.peer_nic for r in results} == {"b/nic-0"}
    assert sum(r.sent for r in results) > 0
    assert sum(r.lost for r in results) == 0
    assert all(r.rtt_p50_us > 0 and r.rtt_p99_us >= r.rtt_p50_us for r in results if r.sent)
    assert all(r.plan_version == 1 and r.window_ms == 1000 for r in results)
    assert b.answered_total > 0


def test_a_lossy_and_slow_path_shows_in_the_results(pair: tuple[Prober, Prober, int]) -> None:
    a, b, port = pair
    a = Prober(fate=lambda local, peer, sport: PathFate(drop=0.5, delay_s=0.02, via="spine-3"), seed=3, tick_s=0.005)
    a.start()
    try:
        a.apply(_plan(1, "a/nic-0", "b/nic-0", port))
        b.apply(_plan(1, "b/nic-0", "a/nic-0", port))
        results = _wait_results(a, n=2)
        sent, lost = sum(r.sent for r in results), sum(r.lost for r in results)
        assert 0.3 < lost / sent < 0.7
        answered = [r for r in results if r.sent > r.lost]
        assert answered and all(r.rtt_p50_us >= 20_000 for r in answered)  # the network's 20 ms
        assert all(r.responder_us < 20_000 for r in answered)  # not the responder's
        assert {r.via for r in results} == {"spine-3"}
    finally:
        a.stop()


def test_a_peer_that_restarts_marks_its_flows(pair: tuple[Prober, Prober, int]) -> None:
    a, b, port = pair
    a.apply(_plan(1, "a/nic-0", "b/nic-0", port))
    b.apply(_plan(1, "b/nic-0", "a/nic-0", port))
    _wait_results(a, n=2)
    b.stop()
    b2 = Prober(seed=9)  # the peer's agent restarted: a new responder epoch
    b2.start()
    try:
        b2.apply(_plan(1, "b/nic-0", "a/nic-0", port))
        deadline = time.monotonic() + 10
        restarted = False
        while time.monotonic() < deadline and not restarted:
            restarted = any(r.peer_restarted for r in a.take_results())
            time.sleep(0.1)
        assert restarted
    finally:
        b2.stop()


def test_an_older_plan_is_ignored_and_a_paused_one_stops_probing() -> None:
    p = Prober()
    p.apply(_plan(5, "a/nic-0", "b/nic-0", 1))
    p.apply(_plan(4, "a/nic-0", "b/nic-0", 1))
    assert p._pending is not None and p._pending.version == 5
    p.apply(spb.ProbePlan(version=6, paused=True))
    p.start()
    try:
        time.sleep(0.2)
        assert p.plan.paused and p.sent_total == 0
    finally:
        p.stop()


def test_the_wire_format_round_trips_and_ignores_strangers() -> None:
    data = wire.encode(wire.Probe(wire.REQUEST, 7, 123), 64)
    assert len(data) == 64
    reply = wire.decode(wire.reply_to(data, 55, 9))
    assert reply == wire.Probe(wire.REPLY, 7, 123, 55, 9)
    assert wire.decode(b"hello world, not a probe at all!") is None


def test_batched_wakeups_keep_round_trips_exact_by_the_kernels_stamps() -> None:
    """At a 200 ms tick a reply read a tick late would add ~100 ms; the receive stamp takes it out,
    and the responder's wait for its tick is its own time, not the network's."""
    port = _udp_port()
    a, b = Prober(seed=1, tick_s=0.2), Prober(seed=2, tick_s=0.2)
    a.start()
    b.start()
    try:
        a.apply(_plan(1, "a/nic-0", "b/nic-0", port))
        # b's ticks half a tick after a's: started together, the two 200 ms tick loops could
        # run in step, and a's requests would reach b just before b wakes anyway (seen in CI)
        time.sleep(0.1)
        b.apply(_plan(1, "b/nic-0", "a/nic-0", port))
        results = [r for r in _wait_results(a, n=2) if r.sent > r.lost]
        assert results and a._batch_ns == 200_000_000
        assert max(r.rtt_p50_us for r in results) < 75_000  # loopback plus load, not half a 200 ms tick
        assert max(r.responder_us for r in results) > 10_000  # b waited for its tick: b's time
    finally:
        a.stop()
        b.stop()


def test_a_responders_hold_longer_than_the_timeout_is_not_loss() -> None:
    """The responder ticks every 400 ms, the prober every 200 ms, the timeout is 200 ms: a request
    waits up to 400 ms for its responder, so judged on whether its reply was read by the timeout
    about half the probes would be lost. Judged on the network's time (the arrival stamp less the
    responder's hold, within two of the prober's ticks of grace), none is."""
    port = _udp_port()
    a, b = Prober(seed=1, tick_s=0.2), Prober(seed=2, tick_s=0.4)
    a.start()
    b.start()
    try:
        b.apply(_plan(1, "b/nic-0", "a/nic-0", port, pps=40.0))
        a.apply(_plan(1, "a/nic-0", "b/nic-0", port, pps=40.0))
        results = _wait_results(a, n=3)
        sent, lost = sum(r.sent for r in results), sum(r.lost for r in results)
        assert sent >= 40 and lost <= 0.1 * sent, results
        assert max(r.responder_us for r in results if r.sent > r.lost) > 200_000  # b held some past the timeout
    finally:
        a.stop()
        b.stop()


def test_a_reply_that_arrives_within_the_grace_but_took_the_network_too_long_is_lost() -> None:
    """A 300 ms tick gives unanswered probes 600 ms of grace past the 300 ms timeout; a path that
    delays every probe by 500 ms answers within it, and each such probe is still lost."""
    port = _udp_port()
    b = Prober(seed=2, tick_s=0.3)
    a = Prober(fate=lambda local, peer, sport: PathFate(delay_s=0.5, via="spine-1"), seed=3, tick_s=0.3)
    a.start()
    b.start()
    try:
        b.apply(_plan(1, "b/nic-0", "a/nic-0", port, pps=20.0, timeout_ms=300))
        a.apply(_plan(1, "a/nic-0", "b/nic-0", port, pps=20.0, timeout_ms=300))
        results = _wait_results(a, n=3)
        sent, lost = sum(r.sent for r in results), sum(r.lost for r in results)
        assert sent >= 20 and lost == sent, results
        assert b.answered_total > 0  # they were answered: late, not unanswered
    finally:
        a.stop()
        b.stop()


def test_endpoints_without_stamps_wake_per_packet() -> None:
    class Plain:
        def __init__(self, address: str, port: int, dscp: int) -> None:
            self._ep = UdpEndpoint(address, port, dscp)

        def fileno(self) -> int:
            return self._ep.fileno()

        def send(self, data: bytes, address: str, port: int) -> None:
            self._ep.send(data, address, port)

        def receive(self) -> tuple[bytes, str, int] | None:
            return self._ep.receive()

        def close(self) -> None:
            self._ep.close()

    port = _udp_port()
    a, b = Prober(endpoints=Plain, seed=1, tick_s=0.2), Prober(endpoints=Plain, seed=2, tick_s=0.2)
    a.start()
    b.start()
    try:
        a.apply(_plan(1, "a/nic-0", "b/nic-0", port))
        b.apply(_plan(1, "b/nic-0", "a/nic-0", port))
        results = [r for r in _wait_results(a, n=2) if r.sent > r.lost]
        assert results and a._batch_ns == 0
        assert max(r.rtt_p50_us for r in results) < 50_000
    finally:
        a.stop()
        b.stop()


class _ExpiresAtASpine(UdpEndpoint):
    """A real UDP endpoint whose trace probes 'expire' at 10.9.9.9 (no router on loopback)."""

    def send_ttl(self, data: bytes, address: str, port: int, ttl: int) -> None:
        assert ttl == 2
        self._expired.append(("10.9.9.9", data[:64]))  # the ICMP quotes the probe's start
        super().send_ttl(data, address, port, ttl)


def test_a_lossy_flow_is_traced_and_its_results_name_the_spine() -> None:
    # nothing answers at b: every probe is lost, each port-unreachable lands on a's sockets
    a = Prober(seed=1, tick_s=0.005, endpoints=_ExpiresAtASpine)
    a.start()
    try:
        a.apply(_plan(1, "a/nic-0", "b/nic-0", _udp_port(), pps=50.0))
        deadline = time.monotonic() + 10
        traced: list[tpb.ProbeResult] = []
        while time.monotonic() < deadline and not traced:
            traced = [r for r in a.take_results() if r.lost and r.via == "10.9.9.9"]
            time.sleep(0.1)
        assert traced, "no lossy result named the spine its trace expired at"
        assert a.traced_total >= 2  # one per lossy flow, not one per lost probe
        assert a.traced_total < a.sent_total
    finally:
        a.stop()


def test_trace_probes_are_ignored_by_responders_and_read_back_from_icmp_quotes() -> None:
    data = wire.encode(wire.Probe(wire.TRACE, 77, 123), wire.HEADER)
    assert wire.decode(data) is None  # a responder the trace reaches does not answer it
    assert wire.trace_seq(data) == 77
    assert wire.trace_seq(wire.encode(wire.Probe(wire.REQUEST, 77, 123), 64)) is None
    assert wire.trace_seq(b"junk") is None
