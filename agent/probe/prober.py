"""The prober: one thread that sends probes on the plan's schedule, answers peers, sums results.

Per NIC of the plan it binds one responder (rail address, the plan's port) and one socket per
flow (rail address, source port): the probes leave from that rail's own address in the RoCE
class. Each flow gets its share of its target's packets per second, started at a random
phase so a node's probes do not leave in bursts. A reply's round trip less the responder's
own processing time is the network's; a probe whose reply took the network longer than the
plan's timeout, or that has none two ticks past it, is lost. Every ``window_s`` each flow's
counts become one ``ProbeResult``, which the next report carries (``take_results``), and the
counts start again.

A peer that restarted (its responder's epoch changed) marks its flows ``peer_restarted`` for
that window: its missed replies are its restart, not the network's loss. So does a peer that
has not answered yet within ``_PEER_GRACE_WINDOWS`` windows of first being planned (and the
probes sent to it before its first answer, counted lost a timeout later): its
responder starts when its own plan arrives, which may be seconds after ours (a mesh just
turned on, agents reconnecting one by one to a new controller). A plan that differs from the
running one only in its version (a new controller's or leader's first plan) is taken without
starting over: the windows, flows and responders keep running, so a controller restart costs
the mesh no window.

A flow that loses a probe is traced, where its endpoint can (``Tracer``): one small probe of
the same flow with TTL ``TRACE_TTL`` expires at the spine the flow's ECMP hash picks, and the
spine's address from its ICMP time-exceeded becomes the flow's ``via``, so the controller can
name the leaf-spine cable. Only lossy flows are traced, at most every ``_TRACE_RETRY_NS`` until
answered and every ``_TRACE_REFRESH_NS`` after: switches police the ICMP they generate.
"""

from __future__ import annotations

import contextlib
import heapq
import math
import os
import random
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from agent.probe import mmsg, wire
from agent.probe.endpoint import Endpoint, EndpointFactory, UdpEndpoint
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

TRACE_TTL = 2  # NIC -> leaf (1) -> spine (2) on a two-tier Clos: the probe expires at the spine
_TRACE_RETRY_NS = 2_000_000_000
_TRACE_REFRESH_NS = 60_000_000_000
_PEER_GRACE_WINDOWS = 2  # windows a newly planned peer has to answer before its losses count


@dataclass(frozen=True, slots=True)
class PathFate:
    """What the simulated data plane does to one flow (tests and the simulator only)."""

    drop: float = 0.0  # probability a probe of this flow is lost
    delay_s: float = 0.0  # added to its round trip, outside the responder's processing time
    via: str = ""  # the spine it crosses, as a trace would name it


FateOf = Callable[[str, str, int], PathFate]  # (local NIC, peer NIC, source port)


@dataclass(slots=True)
class _Flow:
    local_nic: str
    peer_nic: str
    peer_address: str
    peer_port: int
    src_port: int
    interval_ns: int
    ep: Endpoint | None = None  # the socket it leaves from (None: its bind failed)
    dest: tuple[str, int] = ("", 0)  # (peer address, peer port), made once
    sent: int = 0
    lost: int = 0
    rtts_us: list[float] = field(default_factory=list)
    processing_us: float = 0.0
    via: str = ""
    restarted: bool = False
    trace_due: int = 0  # when this flow may be traced again


@dataclass(slots=True)
class _Socket:
    """What the poller knows of one open endpoint."""

    ep: Endpoint
    nic: str  # "" for a responder
    port: int
    reads: int  # datagrams read per readiness: 1 where fewer than one arrives per tick, else up to 64
    fast: bool  # a ``UdpEndpoint`` (read in place, replies sent from its buffer), else the generic seam


_READS = 64  # bounded: one busy socket does not starve the schedule
# The thread's tick: each wake-up costs ~0.1 ms of CPU whatever it does (bench/README.md, issue 29
# session 13), 0.1 % of a core at 10 a second, 0.02 % at 2. Loss is judged on the network's time
# (the arrival stamp less the responder's hold), so a tick longer than the probe timeout loses
# nothing; a responder then holds up to a tick's requests in its socket (10 at the default budget
# of 20 a second per NIC), hence the larger receive buffer it asks for.
TICK_S = 0.5
_RESPONDER_RCVBUF = 1 << 20
_DEFAULT_RCVBUF = 212_992  # Linux's net.core.rmem_default: what an endpoint that cannot say has
_MIN_TICK_NS = 20_000_000  # however busy the responders, no more than 50 wake-ups a second


def fitting_tick_ns(tick_ns: int, room_bytes: int, datagram_bytes: int, arrivals_per_s: float) -> int:
    """The tick, shortened where a responder's receive buffer (``room_bytes``, as the kernel counts
    it: each datagram takes about twice its size there, with the buffer it sits in) would not hold
    twice the requests that arrive in one tick (peers send theirs in bursts at their own ticks):
    a request the buffer cannot hold is dropped, and counts as the network's loss."""
    if arrivals_per_s <= 0:
        return tick_ns
    holds = room_bytes / (2 * max(1, datagram_bytes))  # datagrams
    fits = int(1e9 * holds / (2 * arrivals_per_s))
    return max(_MIN_TICK_NS, min(tick_ns, fits))


def _arrivals_per_s(plan: spb.ProbePlan) -> float:
    """Requests a second the busiest responder should expect: the plan gives each NIC a budget it
    sends and answers (a symmetric mesh), so the largest of what a NIC's targets send."""
    per_nic: dict[str, float] = {}
    for t in plan.targets:
        per_nic[t.local_nic] = per_nic.get(t.local_nic, 0.0) + max(0.0, t.packets_per_s)
    return max(per_nic.values(), default=0.0)


_DRAIN_READS = 4096  # before probes are given up on: every waiting reply (a socket holds ~200 KiB)
_LATE_KEPT = 65536  # probes given up on whose late reply may still clear them, this window
_SLOTS = 32  # a responder's requests read (and answered) per system call
_EPOLLIN, _EPOLLERR = select.EPOLLIN, select.EPOLLERR


class Prober:
    """Runs a probe plan in its own thread; ``apply`` swaps plans, ``take_results`` drains windows."""

    def __init__(
        self,
        endpoints: EndpointFactory = UdpEndpoint,
        fate: FateOf | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
        seed: int | None = None,
        tick_s: float = TICK_S,
        use_mmsg: bool = True,
    ) -> None:
        """``tick_s``: the thread wakes once per tick and does everything due in one go (sends,
        replies, reads), so its cost follows the ticks, not the packets; the kernel's receive
        stamps keep round trips exact (a request's wait in its socket is the responder's own
        time, carried in the reply). Only where every endpoint has them (``stamps``): without,
        a reply read a tick late would look a tick slower, so the thread wakes per packet.
        ``use_mmsg``: responders read and answer a tick's requests in one ``recvmmsg`` and one
        ``sendmmsg`` where libc has them (False: datagram by datagram, as elsewhere)."""
        self._use_mmsg = use_mmsg
        self._endpoints = endpoints
        self._fate = fate
        self._clock = clock
        self._tick_ns = int(tick_s * 1e9)
        self._batch_ns = 0  # the tick where every open endpoint stamps its arrivals, else 0
        self._room = _DEFAULT_RCVBUF  # the smallest receive buffer a responder of the plan was granted
        self._rt_offset: int | None = None  # CLOCK_REALTIME - our clock, for the kernel's stamps
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._pending: spb.ProbePlan | None = None
        self._results: list[tpb.ProbeResult] = []
        self._stop = threading.Event()
        self._wake: tuple[socket.socket, socket.socket] | None = None  # made by start(): none for an idle agent
        self._thread: threading.Thread | None = None
        self.epoch = int.from_bytes(os.urandom(4), "big") or 1
        self.plan = spb.ProbePlan()
        self.sent_total = 0
        self.answered_total = 0
        self.bind_errors = 0
        self.wakeups_total = 0  # passes of the thread's loop: what its fixed cost follows
        # run state, touched by the thread only
        self._poll: select.epoll | None = None  # the wake socket and every endpoint
        self._nap: select.epoll | None = None  # the wake socket alone: a nap until the next tick
        self._sockets: dict[int, _Socket] = {}  # fd -> endpoint
        self._responders: list[Endpoint] = []
        self._senders: dict[tuple[str, int], Endpoint] = {}
        self._flows: list[_Flow] = []
        self._due: list[tuple[int, int]] = []  # (due ns, flow index)
        # seq -> (flow, sent ns), in send order (dicts keep it): expiry reads from the front
        self._outstanding: dict[int, tuple[int, int]] = {}
        self._late: dict[int, tuple[int, int]] = {}  # seq -> (flow, sent ns): timed out this window
        self._delayed: list[tuple[int, int, int, bytes]] = []  # (due ns, flow, seq, data): the sim's delays
        self._probe = wire.template(wire.HEADER)  # the request every send stamps in place
        self._batch: mmsg.Batch | None = None  # responders' requests, many per call (None: one by one)
        self._peer_epoch: dict[str, int] = {}
        self._planned_at: dict[str, int] = {}  # peer NIC -> when a plan first named it (its grace starts)
        self._first_answer: dict[str, int] = {}  # peer NIC -> its first answer, when within its grace
        self._traces: dict[int, int] = {}  # trace seq -> flow index
        self.traced_total = 0
        self.late_replies_total = 0  # losses cleared by a reply the responder's host held past the timeout
        self._seq = 0
        self._window_end = 0

    # -- the agent's side --------------------------------------------------------------
    def apply(self, plan: spb.ProbePlan) -> None:
        """A newer plan from the controller; an older or equal version is ignored."""
        with self._lock:
            current = self._pending or self.plan
            if plan.version and plan.version <= current.version:
                return
            self._pending = plan
        self._poke()

    def take_results(self) -> list[tpb.ProbeResult]:
        """The windows completed since the last call (each result is handed out once)."""
        with self._lock:
            out, self._results = self._results, []
        return out

    def start(self) -> None:
        self._wake = socket.socketpair()
        self._wake[0].setblocking(False)
        self._poll = select.epoll()
        self._poll.register(self._wake[0].fileno(), _EPOLLIN)
        self._nap = select.epoll()
        self._nap.register(self._wake[0].fileno(), _EPOLLIN)
        self._thread = threading.Thread(target=self._run, name="prober", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._poke()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._close_endpoints()
        for poller in (self._poll, self._nap):
            if poller is not None:
                poller.close()
        self._poll = self._nap = None
        if self._wake is not None:
            for s in self._wake:
                s.close()
            self._wake = None

    def _poke(self) -> None:
        if self._wake is not None:
            with contextlib.suppress(OSError):
                self._wake[1].send(b"x")

    # -- the thread ----------------------------------------------------------------------
    def _run(self) -> None:
        assert self._poll is not None and self._nap is not None and self._wake is not None
        poll, nap, wake = self._poll, self._nap, self._wake[0]
        timeout = 0.0
        last = 0
        stamps = self._clock is time.monotonic_ns
        while not self._stop.is_set():
            if self._batch_ns:
                # batch: what arrives or falls due meanwhile is done together at the next tick
                rest = last + self._batch_ns - self._clock()
                if rest > 0 and nap.poll(rest / 1e9):
                    with contextlib.suppress(OSError):
                        wake.recv(512)
                if self._stop.is_set():
                    break
                events = poll.poll(0)
            else:
                events = poll.poll(timeout)
            self.wakeups_total += 1
            if stamps:
                self._rt_offset = time.time_ns() - time.monotonic_ns()
            now = last = self._step(events)
            if not self._batch_ns:
                timeout = max(0.0, (self._next_wake(now) - now) / 1e9)

    def _step(self, events: list[tuple[int, int]]) -> int:
        """One pass of the thread: what arrived, a new plan, what is due, what timed out, the window."""
        # Read what arrived before anything can time out: a thread that was not scheduled
        # for a while must not count replies waiting in its sockets as lost.
        if events:
            self._dispatch(events)
        if self._pending is not None:
            self._maybe_switch()
        now = self._clock()
        if (self._due and self._due[0][0] <= now) or self._delayed:
            self._send_due(now)
        if self._outstanding:
            self._expire(now)
        if self.plan.targets and now >= self._window_end:
            self._close_window(now)
        return now

    def _dispatch(self, events: list[tuple[int, int]]) -> None:
        """One poll's events: errors first (they fail reads until drained), then what arrived."""
        sockets = self._sockets
        for fd, mask in events:
            s = sockets.get(fd)
            if s is None:
                if self._wake is not None:
                    with contextlib.suppress(OSError):
                        self._wake[0].recv(512)
            elif s.fast:
                if mask & _EPOLLERR:
                    s.ep.drain_errors()  # type: ignore[attr-defined]
                    self._traced(s.ep)
                if mask & _EPOLLIN:
                    if not s.nic and self._batch is not None:
                        self._answer(s, self._batch)
                    else:
                        self._read_fast(s)
            else:
                self._readable(s)

    def _next_wake(self, now: int) -> int:
        wake = now + 1_000_000_000
        if self._due:
            wake = min(wake, self._due[0][0])
        if self._delayed:
            wake = min(wake, self._delayed[0][0])
        if self._outstanding:
            wake = min(wake, now + self._timeout_ns // 4)
        if self.plan.targets:
            wake = min(wake, self._window_end)
        return wake

    @property
    def _timeout_ns(self) -> int:
        return max(1, self.plan.timeout_ms) * 1_000_000

    @property
    def _grace_ns(self) -> int:
        """How long past the timeout an unanswered probe waits before it is lost: two of the
        configured ticks where the thread batches (a peer holds a request up to its tick, at most
        this long where it runs the same agent, and the thread may be scheduled late; a tick
        shortened for a small receive buffer does not shorten the peers'), none where it wakes
        per packet."""
        return 2 * self._tick_ns if self._batch_ns else 0

    def _maybe_switch(self) -> None:
        with self._lock:
            plan, self._pending = self._pending, None
        if plan is None:
            return
        if self.plan.version and _same_but_version(plan, self.plan):
            self.plan = plan  # its results say the new version; nothing starts over
            log.info("probe_plan_version_only", version=plan.version)
            return
        self._close_endpoints()
        self._batch_ns = 0
        self._room = _RESPONDER_RCVBUF * 2
        self.plan = plan
        self._flows, self._due, self._outstanding, self._delayed, self._late = [], [], {}, [], {}
        self._traces = {}
        self._probe = wire.template(max(wire.HEADER, plan.payload_bytes))
        self._batch = mmsg.batch(_SLOTS, len(self._probe)) if self._use_mmsg else None
        if plan.paused:
            log.info("probe_plan_paused", version=plan.version)
            return
        for address in sorted(set(plan.listen.values())):
            self._open(address, plan.port, responder=True)
        now = self._clock()
        rate: dict[tuple[str, int], float] = {}  # replies per second each sender socket expects
        for t in plan.targets:
            self._planned_at.setdefault(t.peer_nic, now)
            ports = list(t.src_ports) or [0]
            per_flow_pps = t.packets_per_s / len(ports) if t.packets_per_s > 0 else 0.0
            if per_flow_pps <= 0:
                continue
            interval = int(1e9 / per_flow_pps)
            for sport in ports:
                ep = self._senders.get((t.local_nic, sport))
                if ep is None:
                    ep = self._open(t.local_address, sport, responder=False, nic=t.local_nic)
                    if ep is None:
                        continue
                rate[(t.local_nic, sport)] = rate.get((t.local_nic, sport), 0.0) + per_flow_pps
                index = len(self._flows)
                self._flows.append(
                    _Flow(
                        t.local_nic,
                        t.peer_nic,
                        t.peer_address,
                        plan.port,
                        sport,
                        interval,
                        ep=ep,
                        dest=(t.peer_address, plan.port),
                    )
                )
                heapq.heappush(self._due, (now + int(self._rng.random() * interval), index))
        self._window_end = now + max(1, plan.window_s) * 1_000_000_000
        endpoints = [*self._responders, *self._senders.values()]
        stamps = bool(endpoints) and all(getattr(e, "stamps", False) for e in endpoints)
        self._batch_ns = (
            fitting_tick_ns(self._tick_ns, self._room, len(self._probe), _arrivals_per_s(plan)) if stamps else 0
        )
        # A sender socket that expects under half a reply per tick reads one per wake-up (a second
        # waits a tick, its stamp keeps its round trip exact): no read that finds nothing.
        for s in self._sockets.values():
            if s.fast and s.nic and self._batch_ns and rate.get((s.nic, s.port), 0.0) * self._batch_ns / 1e9 < 0.5:
                s.reads = 1
        log.info(
            "probe_plan_applied",
            version=plan.version,
            targets=len(plan.targets),
            flows=len(self._flows),
            responders=len(self._responders),
        )

    def _open(self, address: str, port: int, *, responder: bool, nic: str = "") -> Endpoint | None:
        try:
            ep = self._endpoints(address, port, self.plan.dscp)
        except OSError as exc:
            self.bind_errors += 1
            log.warning("probe_bind_failed", address=address, port=port, error=str(exc))
            return None
        assert self._poll is not None
        fd = ep.fileno()
        self._poll.register(fd, _EPOLLIN)
        self._sockets[fd] = _Socket(ep, nic, port, _READS, isinstance(ep, UdpEndpoint))
        if responder:
            reserve = getattr(ep, "reserve", None)
            room = reserve(_RESPONDER_RCVBUF) if reserve is not None else _DEFAULT_RCVBUF
            self._room = min(self._room, room)
            self._responders.append(ep)
        else:
            self._senders[(nic, port)] = ep
        return ep

    def _close_endpoints(self) -> None:
        for fd, s in self._sockets.items():
            try:
                if self._poll is not None:
                    self._poll.unregister(fd)
            except (KeyError, ValueError, OSError):
                pass
            s.ep.close()
        self._sockets.clear()
        self._responders, self._senders = [], {}

    def _send_due(self, now: int) -> None:
        flows, due, outstanding, fate_of = self._flows, self._due, self._outstanding, self._fate
        while self._delayed and self._delayed[0][0] <= now:
            _, index, _, data = heapq.heappop(self._delayed)
            f = flows[index]
            if f.ep is not None:
                f.ep.send(data, f.peer_address, f.peer_port)
        buf, stamp, clock = self._probe, wire.stamp_request, self._clock
        seq = self._seq
        while due and due[0][0] <= now:
            at, index = due[0]
            f = flows[index]
            heapq.heapreplace(due, (max(at + f.interval_ns, now), index))
            ep = f.ep
            if ep is None:
                continue
            seq = (seq + 1) & 0xFFFFFFFF
            # Stamped as it leaves, not at the tick: another thread of the agent holding the GIL
            # while this tick's probes go out would otherwise count as the network's round trip.
            sent = clock()
            stamp(buf, seq, sent)
            outstanding[seq] = (index, sent)
            self.sent_total += 1
            if fate_of is not None:
                fate = fate_of(f.local_nic, f.peer_nic, f.src_port)
                f.via = fate.via
                if fate.drop > 0 and self._rng.random() < fate.drop:
                    continue  # the simulated fabric ate it: it times out like a real loss
                if fate.delay_s > 0:
                    heapq.heappush(self._delayed, (sent + int(fate.delay_s * 1e9), index, seq, bytes(buf)))
                    continue
            if isinstance(ep, UdpEndpoint):
                ep.send_to(buf, f.dest)
            else:
                ep.send(bytes(buf), f.peer_address, f.peer_port)  # it may keep the bytes: a copy
        self._seq = seq

    def _read_fast(self, s: _Socket) -> None:
        """Read a ``UdpEndpoint`` in place: a request is turned into its reply in the socket's own
        buffer and sent back from it, a reply is matched by its seq; nothing is copied or made."""
        ep: UdpEndpoint = s.ep  # type: ignore[assignment]
        view, unpack = ep.view, wire.unpack_header
        for _ in range(s.reads):
            n = ep.read()
            if not n:
                return
            if n < wire.HEADER:
                continue
            magic, kind, seq, _, processing, epoch = unpack(view)
            if magic != wire.MAGIC:
                continue
            stamp = ep.last_rx_ns
            if kind == wire.REQUEST:
                # both in CLOCK_REALTIME: the request's wait in the socket is this host's time
                wire.turn_into_reply(view, max(0, time.time_ns() - stamp) if stamp else 0, self.epoch)
                ep.reply(n)
                self.answered_total += 1
            elif kind == wire.REPLY:
                now = self._clock()
                offset = self._rt_offset
                received = min(now, stamp - offset) if stamp and offset is not None else now
                self._replied(s.nic, s.port, seq, processing, epoch, received)

    def _answer(self, s: _Socket, b: mmsg.Batch) -> None:
        """A responder's waiting requests, read in one call, turned into their replies in their
        slots and sent back in one more (a socket fuller than the slots takes a few rounds)."""
        fd, data, size, epoch, unpack = s.ep.fileno(), b.data, b.size, self.epoch, wire.unpack_header
        for _ in range(_READS // _SLOTS):
            n = b.recv(fd)
            if not n:
                return
            lengths: list[int] = []
            now = time.time_ns()  # both in CLOCK_REALTIME: the wait in the socket is this host's time
            for i in range(n):
                length, at = b.length(i), i * size
                if length < wire.HEADER:
                    break
                magic, kind, _, _, _, _ = unpack(data, at)
                if magic != wire.MAGIC or kind != wire.REQUEST:
                    break
                stamp = b.stamp(i)
                wire.turn_into_reply(data[at : at + wire.HEADER], max(0, now - stamp) if stamp else 0, epoch)
                lengths.append(length)
            if lengths:
                self.answered_total += b.send_back(fd, lengths)
            if len(lengths) < n:
                self._answer_each(s, b, len(lengths), n)  # a stranger among them: the rest slot by slot
            if n < b.slots:
                return

    def _answer_each(self, s: _Socket, b: mmsg.Batch, start: int, n: int) -> None:
        """Slots ``start`` to ``n`` - 1 answered one by one (something among them is not a request)."""
        ep: UdpEndpoint = s.ep  # type: ignore[assignment]
        now = time.time_ns()
        for i in range(start, n):
            length, at = b.length(i), i * b.size
            if length < wire.HEADER:
                continue
            magic, kind, _, _, _, _ = wire.unpack_header(b.data, at)
            if magic != wire.MAGIC or kind != wire.REQUEST:
                continue
            stamp = b.stamp(i)
            wire.turn_into_reply(b.data[at : at + wire.HEADER], max(0, now - stamp) if stamp else 0, self.epoch)
            ep.send_to(bytes(b.data[at : at + length]), b.sender(i))
            self.answered_total += 1

    def _readable(self, s: _Socket) -> None:
        """The generic seam: ``receive`` until it has nothing (it drains the socket's errors then)."""
        ep = s.ep
        for _ in range(s.reads):
            got = ep.receive()
            if got is None:
                self._traced(ep)
                return
            data, address, port = got
            received = self._received(ep)
            probe = wire.decode(data)
            if probe is None:
                continue
            if probe.kind == wire.REQUEST:
                ep.send(wire.reply_to(data, max(0, self._clock() - received), self.epoch), address, port)
                self.answered_total += 1
            else:
                self._replied(s.nic, s.port, probe.seq, probe.processing_ns, probe.epoch, received)

    def _received(self, ep: Endpoint) -> int:
        """When the datagram arrived: the kernel's stamp in our clock where there is one (a
        request's wait in the socket until the tick is then the responder's time, and a reply's
        is not the network's), else now (the wait then counts as the network's, up to a tick)."""
        stamp = getattr(ep, "last_rx_ns", 0)
        now = self._clock()
        if stamp and self._rt_offset is not None:
            return min(now, stamp - self._rt_offset)
        return now

    def _replied(self, nic: str, port: int, seq: int, processing_ns: int, epoch: int, received: int) -> None:
        entry = self._outstanding.get(seq)
        late = entry is None
        if late:
            entry = self._late.get(seq)
            if entry is None:
                return  # from another plan, or given up on in an earlier window (counted lost there)
        assert entry is not None
        index, sent = entry
        f = self._flows[index]
        if f.src_port != port or f.local_nic != nic:
            return  # not this socket's probe
        network_ns = received - sent - processing_ns
        if late:
            # Given up on after its timeout and grace, but the reply came: the network's part of its
            # round trip (less the responder's own wait, which its reply carries) is within the
            # timeout, so the responder's host held it (a host starved of CPU for longer than the
            # grace), not the network: not a loss. Its responder time shows the host's delay.
            del self._late[seq]
            if network_ns > self._timeout_ns or f.lost == 0:
                return
            f.lost -= 1
            f.sent -= 1  # counted again below, as answered
            self.late_replies_total += 1
        else:
            del self._outstanding[seq]
            if network_ns > self._timeout_ns:
                # the network took longer than the timeout: lost, however soon it was read; the
                # responder's hold (its tick) is its own time and does not count against it
                f.sent += 1
                f.lost += 1
                if received >= f.trace_due and self._fate is None:
                    self._trace(index, received)
                return
        last = self._peer_epoch.get(f.peer_nic)
        if last != epoch:
            # a new epoch: the peer restarted; a first answer within its grace: what its flows
            # lost before it may be its responder not up yet
            first = last is None and self._in_grace(f.peer_nic, received)
            if first:  # probes sent before it and counted lost later are its start too (_expire)
                self._first_answer[f.peer_nic] = received
            if last is not None or first:
                for other in self._flows:
                    if other.peer_nic == f.peer_nic and (last is not None or other.lost):
                        other.restarted = True
            self._peer_epoch[f.peer_nic] = epoch
        f.sent += 1
        f.rtts_us.append(max(0.0, (received - sent - processing_ns) / 1000))
        f.processing_us += processing_ns / 1000

    def _expire(self, now: int) -> None:
        # A probe is given up on only after the timeout and the grace (a responder that batches
        # holds a request up to its tick): a reply that arrives within the grace is judged on its
        # network time (``_replied``), so the tick can be long without counting holds as loss.
        limit = now - self._timeout_ns - self._grace_ns
        if next(iter(self._outstanding.values()))[1] >= limit:
            return  # in send order: the oldest is not due, nor is any other
        # Something is about to be given up on: first read every reply waiting in this host's
        # sockets. A thread that was not scheduled for a while wakes with replies queued, and a
        # quiet socket is read one datagram per pass: what waits is this host's lateness, not loss.
        self._read_replies()
        late: list[int] = []
        for seq, (_, sent) in self._outstanding.items():
            if sent >= limit:
                break  # in send order: the rest are younger
            late.append(seq)
        first_answer = self._first_answer
        if len(self._late) + len(late) > _LATE_KEPT:
            self._late.clear()  # bounded: a dead peer's probes are not kept for ever
        for seq in late:
            entry = self._outstanding.pop(seq)
            self._late[seq] = entry  # a reply may still come, held by a starved responder
            index, sent = entry
            f = self._flows[index]
            f.sent += 1
            f.lost += 1
            if first_answer and sent < first_answer.get(f.peer_nic, 0):
                f.restarted = True  # sent before the peer's responder was up
            if now >= f.trace_due and self._fate is None:
                self._trace(index, now)

    def _read_replies(self) -> None:
        """Read every sender socket empty (replies only: responders answer on their own events)."""
        for s in self._sockets.values():
            if not s.nic:
                continue
            reads, s.reads = s.reads, _DRAIN_READS
            try:
                if s.fast:
                    self._read_fast(s)
                else:
                    self._readable(s)
            finally:
                s.reads = reads

    def _trace(self, index: int, now: int) -> None:
        """Send the flow's trace probe (TTL-limited, from the flow's own socket and port)."""
        f = self._flows[index]
        f.trace_due = now + (_TRACE_REFRESH_NS if f.via else _TRACE_RETRY_NS)
        send_ttl = getattr(f.ep, "send_ttl", None)
        if send_ttl is None:
            return
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        if len(self._traces) > 4096:  # unanswered ones (a same-leaf pair has no spine to answer)
            self._traces.clear()
        self._traces[self._seq] = index
        self.traced_total += 1
        send_ttl(
            wire.encode(wire.Probe(wire.TRACE, self._seq, now), wire.HEADER), f.peer_address, f.peer_port, TRACE_TTL
        )

    def _traced(self, ep: Endpoint) -> None:
        """Name the spine of every flow whose trace expired at one (its ICMP is on ``ep``)."""
        expired = getattr(ep, "expired", None)
        if expired is None:
            return
        for offender, data in expired():
            seq = wire.trace_seq(data)
            index = self._traces.pop(seq, None) if seq is not None else None
            if index is not None and index < len(self._flows):
                f = self._flows[index]
                f.via = offender
                f.trace_due = self._clock() + _TRACE_REFRESH_NS

    def _in_grace(self, peer_nic: str, now: int) -> bool:
        """The peer was first planned under ``_PEER_GRACE_WINDOWS`` windows ago."""
        planned = self._planned_at.get(peer_nic)
        grace = _PEER_GRACE_WINDOWS * max(1, self.plan.window_s) * 1_000_000_000
        return planned is not None and now - planned < grace

    def _close_window(self, now: int) -> None:
        window_ms = max(1, self.plan.window_s) * 1000
        for f in self._flows:  # a peer that never answered yet, within its grace: not judged
            if f.lost and f.peer_nic not in self._peer_epoch and self._in_grace(f.peer_nic, now):
                f.restarted = True
        # A flow that lost probes is reported on its own (its source port and spine name it); the
        # clean flows of one target are summed into one result with source port 0 and no spine
        # (ECMP spreads them evenly), so a report carries tens of results per window, not one per flow.
        groups: dict[tuple[str, str, str, int, bool], list[_Flow]] = {}
        slow = self.plan.slow_us or float("inf")
        for f in self._flows:
            if f.sent:
                alone = f.lost > 0 or (bool(f.rtts_us) and max(f.rtts_us) >= slow)
                key = (f.local_nic, f.peer_nic, f.via if alone else "", f.src_port if alone else 0, f.restarted)
                if key in groups:
                    groups[key].append(f)
                else:
                    groups[key] = [f]
            elif f.restarted:
                f.restarted = False
        self._late.clear()  # a late reply clears a loss of its own window only
        out: list[tpb.ProbeResult] = []
        for (local, peer, via, sport, restarted), fs in groups.items():
            rtts = sorted(fs[0].rtts_us) if len(fs) == 1 else sorted([r for f in fs for r in f.rtts_us])
            answered = len(rtts)
            out.append(
                tpb.ProbeResult(
                    local_nic=local,
                    peer_nic=peer,
                    src_port=sport,
                    sent=sum(f.sent for f in fs),
                    lost=sum(f.lost for f in fs),
                    rtt_p50_us=_quantile(rtts, 0.5),
                    rtt_p99_us=_quantile(rtts, 0.99),
                    rtt_stdev_us=_pstdev(rtts),
                    responder_us=sum(f.processing_us for f in fs) / answered if answered else 0.0,
                    plan_version=self.plan.version,
                    window_ms=window_ms,
                    via=via,
                    peer_restarted=restarted,
                )
            )
            for f in fs:  # the next window starts from zero, in the same lists (nothing made per window)
                f.sent = f.lost = 0
                f.processing_us = 0.0
                f.restarted = False
                f.rtts_us.clear()
        with self._lock:
            self._results.extend(out)
            if len(self._results) > 20_000:  # the controller is away: keep the newest windows
                del self._results[: len(self._results) - 20_000]
        self._window_end = now + window_ms * 1_000_000


def _same_but_version(a: spb.ProbePlan, b: spb.ProbePlan) -> bool:
    """The two plans differ at most in their version."""
    x, y = spb.ProbePlan(), spb.ProbePlan()
    x.CopyFrom(a)
    y.CopyFrom(b)
    x.version = y.version = 0
    return x == y


def _pstdev(values: list[float]) -> float:
    """Population standard deviation in floats (``statistics.pstdev`` sums exact fractions: ~100x slower)."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = math.fsum(values) / n
    return math.sqrt(math.fsum((v - mean) * (v - mean) for v in values) / n)


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]
