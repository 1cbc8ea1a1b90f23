"""A host starved of CPU is a host problem, not the network's: the prober's passes driven by hand.

Two ways a starved host used to look like a lossy network (``tests/e2e/test_probe_mesh.py``
beside CPU hogs): the prober's own thread was not scheduled for longer than the timeout and
woke with replies queued in its sockets, or the responder's thread was not scheduled and
answered after the prober's timeout. Real UDP sockets on per-rail 127.x addresses; each
prober's passes (``_step``) are called by the test, so "not scheduled" is exact.
"""

from __future__ import annotations

import select
import socket
import time

from agent.probe import wire
from agent.probe.prober import Prober
from starpulse.v1 import service_pb2 as spb

A, B = "127.0.43.1", "127.0.44.1"


def _udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _plan(me: str, port: int, *, timeout_ms: int, pps: float = 0.0) -> spb.ProbePlan:
    """``me``'s part: its responder, and probes to the other at ``pps`` (none at 0)."""
    plan = spb.ProbePlan(version=1, port=port, dscp=26, payload_bytes=1000, timeout_ms=timeout_ms, window_s=60)
    nic, peer = ("a/nic-0", "b/nic-0") if me == A else ("b/nic-0", "a/nic-0")
    plan.listen[nic] = me
    if pps:
        plan.targets.add(
            local_nic=nic,
            local_address=me,
            peer_nic=peer,
            peer_address=B if me == A else A,
            src_ports=[_udp_port(), _udp_port()],
            packets_per_s=pps,
            purpose="cross",
        )
    return plan


def _by_hand(p: Prober, plan: spb.ProbePlan) -> Prober:
    """A prober whose passes the test runs (no thread), its plan applied."""
    p._poll = select.epoll()
    p._rt_offset = time.time_ns() - time.monotonic_ns()
    p.apply(plan)
    p._step([])
    return p


def _counts(p: Prober) -> tuple[int, int, int]:
    """(sent, lost, answered) of the open window, over every flow."""
    return sum(f.sent for f in p._flows), sum(f.lost for f in p._flows), sum(len(f.rtts_us) for f in p._flows)


def test_replies_queued_while_the_prober_was_not_scheduled_are_not_lost() -> None:
    port = _udp_port()
    b = Prober(seed=2, tick_s=0.005)
    b.start()
    now = [time.monotonic_ns()]
    a = _by_hand(Prober(seed=1, tick_s=0.1, clock=lambda: now[0]), _plan(A, port, timeout_ms=5000, pps=4.0))
    try:
        b.apply(_plan(B, port, timeout_ms=5000))
        time.sleep(0.2)  # b's responder is up
        for _ in range(30):  # three seconds of a's clock: it sends, and reads nothing (not scheduled)
            now[0] += 100_000_000
            a._step([])
        sent = len(a._outstanding)
        assert sent >= 6 and a._sockets and all(s.reads == 1 for s in a._sockets.values() if s.nic)
        deadline = time.monotonic() + 10
        while b.answered_total < sent and time.monotonic() < deadline:
            time.sleep(0.05)
        assert b.answered_total >= sent  # every reply is waiting in a's sockets
        now[0] += 10_000_000_000  # a wakes ten seconds later: past every probe's timeout
        a._step(a._poll.poll(0))
        _, lost, answered = _counts(a)
        assert (lost, answered) == (0, sent)
    finally:
        b.stop()
        a._close_endpoints()


def test_a_reply_the_responders_host_held_past_the_timeout_is_not_a_loss() -> None:
    port = _udp_port()
    b = _by_hand(Prober(seed=2, tick_s=0.005), _plan(B, port, timeout_ms=50))
    a = _by_hand(Prober(seed=1, tick_s=0.005), _plan(A, port, timeout_ms=50, pps=40.0))
    try:
        start = time.monotonic()
        while time.monotonic() - start < 0.5:  # a probes; b is not scheduled: requests wait in its socket
            a._step(a._poll.poll(0.01))
        a._due = []  # a sends no more: what is out is what is counted
        _, lost, _ = _counts(a)
        assert lost >= 5  # each timed out after 50 ms, unanswered
        b._step(b._poll.poll(1.0))  # b runs at last: every request answered, its wait in the reply
        deadline = time.monotonic() + 5
        while (a._outstanding or _counts(a)[1]) and time.monotonic() < deadline:
            a._step(a._poll.poll(0.05))
        total, lost, answered = _counts(a)
        assert lost == 0 and answered == total and a.late_replies_total >= 5
        held = [r for f in a._flows for r in f.rtts_us]
        assert max(held) < 50_000  # the network's part only: the wait was b's, not the network's
        assert sum(f.processing_us for f in a._flows) / answered > 50_000  # and it shows as b's time
    finally:
        a._close_endpoints()
        b._close_endpoints()


def test_a_reply_to_a_closed_port_costs_no_other_prober_its_reply() -> None:
    """A reply to a prober whose socket has closed (its agent switched plans or restarted) comes
    back as ICMP port unreachable, which fails the responder's next send once: the replies after
    it in the same batch were dropped, a loss on this host that probers counted as the network's.
    A starved responder answers big batches, so it lost many."""
    port = _udp_port()
    b = _by_hand(Prober(seed=2, tick_s=0.005), _plan(B, port, timeout_ms=1000))
    gone = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(3)]
    alive = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(3)]
    try:
        for i, s in enumerate([*gone, *alive]):
            s.bind(("127.0.45.1", 0))
            s.sendto(wire.encode(wire.Probe(wire.REQUEST, i + 1, 0), 1000), (B, port))
        for s in gone:  # closed before the responder runs: their replies find no socket
            s.close()
        time.sleep(0.1)
        b._step(b._poll.poll(1.0))  # one pass answers all six, the closed ports' first
        replies = []
        for s in alive:
            s.settimeout(2.0)
            try:
                data = s.recv(2048)
            except TimeoutError:
                continue
            probe = wire.decode(data)
            replies.append(probe.kind if probe is not None else None)
        assert replies == [wire.REPLY] * 3
    finally:
        for s in alive:
            s.close()
        b._close_endpoints()
