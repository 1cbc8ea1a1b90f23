"""The prober across a controller restart and a late peer (issue 29), over loopback UDP.

A new controller's first plan differs from the running one only in its version: the prober
keeps its windows, flows and responders (a controller restart costs the mesh no window). A
peer whose responder comes up after ours (its plan arrived later) is not judged for what it
missed before its first answer, within its grace; one that never answers is judged after it.
"""

from __future__ import annotations

import socket
import time

from agent.probe.prober import Prober
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb

ADDR = {"a/nic-0": "127.0.51.1", "b/nic-0": "127.0.52.1"}


def _udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _plan(version: int, me: str, peer: str, port: int, sports: list[int], timeout_ms: int = 300) -> spb.ProbePlan:
    plan = spb.ProbePlan(version=version, port=port, dscp=26, payload_bytes=200, timeout_ms=timeout_ms, window_s=1)
    plan.listen[me] = ADDR[me]
    plan.targets.add(
        local_nic=me,
        local_address=ADDR[me],
        peer_nic=peer,
        peer_address=ADDR[peer],
        src_ports=sports,
        packets_per_s=100.0,
        purpose="cross",
    )
    return plan


def _results_until(p: Prober, done: object, limit_s: float = 15.0) -> list[tpb.ProbeResult]:
    out: list[tpb.ProbeResult] = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        out += p.take_results()
        if done(out):  # type: ignore[operator]
            return out
        time.sleep(0.05)
    raise AssertionError(f"not done within {limit_s}s: {[(r.plan_version, r.sent, r.lost) for r in out]}")


def test_a_plan_new_only_in_its_version_keeps_the_prober_running() -> None:
    port = _udp_port()
    sports = [_udp_port(), _udp_port()]
    a, b = Prober(seed=1, tick_s=0.005), Prober(seed=2, tick_s=0.005)
    a.start()
    b.start()
    try:
        b.apply(_plan(1, "b/nic-0", "a/nic-0", port, [_udp_port()]))
        a.apply(_plan(1, "a/nic-0", "b/nic-0", port, sports))
        _results_until(a, lambda out: any(r.sent for r in out))
        flows, responders = list(a._flows), list(a._responders)
        a.apply(_plan(2, "a/nic-0", "b/nic-0", port, sports))  # a new controller's first plan
        got = _results_until(a, lambda out: any(r.plan_version == 2 for r in out))
        assert a.plan.version == 2
        assert a._flows == flows and all(x is y for x, y in zip(a._flows, flows, strict=True))
        assert all(x is y for x, y in zip(a._responders, responders, strict=True))
        assert all(r.plan_version in (1, 2) for r in got)
        # a plan that changes anything else starts over
        a.apply(_plan(3, "a/nic-0", "b/nic-0", port, [_udp_port()]))
        _results_until(a, lambda out: any(r.plan_version == 3 for r in out))
        assert not any(x is y for x in a._flows for y in flows)
    finally:
        a.stop()
        b.stop()


def test_a_late_peer_is_not_judged_before_its_first_answer_and_a_silent_one_is_after_its_grace() -> None:
    port = _udp_port()
    a, b = Prober(seed=3, tick_s=0.005), Prober(seed=4, tick_s=0.005)
    a.start()
    b.start()
    try:
        # A timeout longer than the wait: probes sent before b was up are counted lost after its
        # first answer, in the next window (a late reply under load is not lost either).
        a.apply(_plan(1, "a/nic-0", "b/nic-0", port, [_udp_port(), _udp_port()], timeout_ms=1500))
        time.sleep(0.6)  # b's plan (and responder) comes later: a's first probes go unanswered
        b.apply(_plan(1, "b/nic-0", "a/nic-0", port, [_udp_port()]))
        got = _results_until(a, lambda out: sum(1 for r in out if r.sent) >= 8)
        lossy = [r for r in got if r.lost]
        assert lossy, "a's probes before b's responder was up were lost"
        assert all(r.peer_restarted for r in lossy), [(r.sent, r.lost, r.peer_restarted) for r in got]
        assert any(r.sent > r.lost for r in got)  # b answers
    finally:
        a.stop()
        b.stop()

    # A peer that never answers: within its grace (two windows) its losses are not judged, after it they are.
    c = Prober(seed=5, tick_s=0.005)
    c.start()
    try:
        c.apply(_plan(1, "a/nic-0", "b/nic-0", _udp_port(), [_udp_port()]))
        got = _results_until(c, lambda out: sum(1 for r in out if r.sent) >= 4)
        windows = [r for r in got if r.sent]
        assert all(r.lost == r.sent for r in windows)
        assert windows[0].peer_restarted and not windows[-1].peer_restarted
    finally:
        c.stop()
