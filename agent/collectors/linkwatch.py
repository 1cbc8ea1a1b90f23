"""Port state changes between cycles: netlink link notifications and a cheap fast poll.

A port that goes down must reach the controller as an event, not with the next report
(which may be a minute away). ``LinkWatch`` asks its collector every ``poll_s`` for link
state changes only (``poll_links``: a stat and two preads per port on files kept open),
and at once when rtnetlink says a netdev changed (``agent.collectors.netlink``: a carrier
lost, a cable pulled), and hands each resulting finding to the agent's sink at once. The collector keeps one view of
each port's state under a lock, so a change is reported once, by whichever of the cycle or
the watch sees it first.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable
from typing import Protocol

import structlog

from agent.collectors.netlink import LinkNotifier
from starpulse.core.findings import Finding

log = structlog.get_logger(__name__)


class LinkSource(Protocol):
    def poll_links(self) -> list[Finding]: ...


class LinkWatch:
    """A daemon thread polling ``source.poll_links`` every ``poll_s`` until ``close``."""

    def __init__(
        self,
        source: LinkSource,
        sink: Callable[[Finding], None],
        poll_s: float = 0.1,
        notifier: LinkNotifier | None = None,
        on_netdev_change: Callable[[], None] | None = None,
    ) -> None:
        """``notifier``: netlink link notifications (None: polling only); ``on_netdev_change``: run
        before the poll a notification triggers (the simulator's driver part: its RDMA ports follow
        the real netdevs, agent.sim.real_netdev)."""
        if poll_s <= 0:
            raise ValueError("poll_s must be > 0")
        self._source = source
        self._sink = sink
        self.poll_s = poll_s
        self._notifier = notifier
        self._on_netdev_change = on_netdev_change
        self.notifications = 0
        self._wake_r, self._wake_w = os.pipe() if notifier is not None else (-1, -1)  # close() ends the wait
        # poll(2), not select(2): an agent process (or a scenario's 66 agents in one) may hold
        # descriptors past select's 1024.
        self._poller = select.poll()
        if notifier is not None:
            self._poller.register(notifier.fileno(), select.POLLIN)
            self._poller.register(self._wake_r, select.POLLIN)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.polls = 0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rdma-linkwatch", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._wake_w >= 0:
            os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=max(2.0, 5 * self.poll_s))
            self._thread = None
        if self._notifier is not None:
            self._notifier.close()
            self._notifier = None
        if self._wake_r >= 0:
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1

    def _wait(self) -> bool:
        """Until the next poll is due or netlink has news; False once stopped."""
        notifier = self._notifier
        if notifier is None:
            return not self._stop.wait(self.poll_s)
        try:
            ready = self._poller.poll(self.poll_s * 1000)
        except OSError:
            log.exception("linkwatch_wait_failed")  # polling alone from here on
            self._notifier = None
            notifier.close()
            return not self._stop.wait(self.poll_s)
        if self._stop.is_set():
            return False
        if any(fd == notifier.fileno() for fd, _ in ready):
            changed = notifier.read()
            if changed:
                self.notifications += len(changed)
                if self._on_netdev_change is not None:
                    try:
                        self._on_netdev_change()
                    except Exception:
                        log.exception("linkwatch_netdev_hook_failed")
        return not self._stop.is_set()

    def _run(self) -> None:
        while self._wait():
            try:
                findings = self._source.poll_links()
            except Exception:  # a broken poll must not end the watch: the cycle still reports the port
                log.exception("linkwatch_poll_failed")
                continue
            self.polls += 1
            for finding in findings:
                try:
                    self._sink(finding)
                except Exception:
                    log.exception("linkwatch_sink_failed", component=finding.component)
