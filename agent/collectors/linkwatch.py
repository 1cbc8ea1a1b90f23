"""Port state changes between cycles: a cheap fast poll of each RDMA port's state files.

A port that goes down must reach the controller as an event, not with the next report
(which may be a minute away). ``LinkWatch`` asks its collector every ``poll_s`` for link
state changes only (``poll_links``: a stat and two preads per port on files kept open) and
hands each resulting finding to the agent's sink at once. The collector keeps one view of
each port's state under a lock, so a change is reported once, by whichever of the cycle or
the watch sees it first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

import structlog

from starpulse.core.findings import Finding

log = structlog.get_logger(__name__)


class LinkSource(Protocol):
    def poll_links(self) -> list[Finding]: ...


class LinkWatch:
    """A daemon thread polling ``source.poll_links`` every ``poll_s`` until ``close``."""

    def __init__(self, source: LinkSource, sink: Callable[[Finding], None], poll_s: float = 0.1) -> None:
        if poll_s <= 0:
            raise ValueError("poll_s must be > 0")
        self._source = source
        self._sink = sink
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.polls = 0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rdma-linkwatch", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(2.0, 5 * self.poll_s))
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
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
