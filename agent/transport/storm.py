"""Local storm suppression: 800K identical XIDs must not become 800K buffered events.

The same fault seen by two sources at once (NVML's event and the kernel log's
Xid line) is one event: a finding that repeats the key of one admitted from another source
within ``coalesce_s`` is dropped. Beyond that, the first ``burst`` findings with the
same (kind, component, xid) in a window pass;
the rest are counted and summarised in one finding when the window closes. The
controller still sees the storm (and its size) without the agent flooding disk and wire.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from starpulse.core.findings import Finding

_Key = tuple[str, str, int]


@dataclass
class _Window:
    started: float
    passed: int = 0
    suppressed: int = 0
    last: Finding | None = None


class StormSuppressor:
    def __init__(
        self,
        window_s: float = 60.0,
        burst: int = 5,
        coalesce_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self.burst = burst
        self.coalesce_s = coalesce_s
        self._clock = clock
        self._windows: dict[_Key, _Window] = {}
        self._last_admitted: dict[_Key, tuple[float, str]] = {}
        self.suppressed_total = 0
        self.coalesced_total = 0

    def admit(self, finding: Finding) -> Finding | None:
        """The finding when it should be sent now, None when it is counted into a summary."""
        key = (finding.kind, finding.component, finding.xid or 0)
        now = self._clock()
        last = self._last_admitted.get(key)
        if last is not None and last[1] != finding.source and now - last[0] < self.coalesce_s:
            self.coalesced_total += 1
            return None
        win = self._windows.get(key)
        if win is None or now - win.started >= self.window_s:
            win = _Window(started=now)
            self._windows[key] = win
        if win.passed < self.burst:
            win.passed += 1
            self._last_admitted[key] = (now, finding.source)
            return finding
        win.suppressed += 1
        win.last = finding
        self.suppressed_total += 1
        return None

    def flush(self) -> list[Finding]:
        """Summaries for windows that closed with suppressed findings."""
        now = self._clock()
        out: list[Finding] = []
        for key, win in list(self._windows.items()):
            if now - win.started < self.window_s:
                continue
            if win.suppressed and win.last is not None:
                attributes = dict(win.last.attributes)
                attributes["suppressed"] = str(win.suppressed)
                attributes["window_s"] = f"{self.window_s:g}"
                out.append(
                    replace(
                        win.last,
                        message=f"{win.last.message} (and {win.suppressed} more like it)",
                        attributes=attributes,
                    )
                )
            del self._windows[key]
        for key, (stamp, _) in list(self._last_admitted.items()):
            if now - stamp >= self.coalesce_s:
                del self._last_admitted[key]
        return out
