"""Event windows: how many events of one rule on one component a node sent lately.

A counted event rule (``min_count`` in a ``window``) opens when its window holds enough
events and resolves when the window empties; the event kind adds to a window, the
condition lifecycle asks whether it has emptied. Keyed (node, rule, component).
"""

from __future__ import annotations

from collections import deque

from controller.detect.model import Rule

_MAX_EVENT_WINDOW = 4096


class EventWindows:
    """The windows of counted event rules, for one engine (its ``Windows``)."""

    def __init__(self) -> None:
        self._windows: dict[tuple[str, str, str], deque[tuple[int, int]]] = {}

    def add(self, owner: str, rule: Rule, comp: str, n: int, now: int) -> int:
        """Count ``n`` occurrences now; returns the occurrences inside the window."""
        wkey = (owner, rule.id, comp)
        win = self._windows.get(wkey)
        if win is None:
            win = self._windows[wkey] = deque(maxlen=_MAX_EVENT_WINDOW)
        win.append((now, n))
        return _prune_sum(win, now - int(rule.window_s * 1000))

    def count(self, owner: str, rule: Rule, comp: str, now: int) -> int:
        """The occurrences still inside the window (0 for a window never opened)."""
        win = self._windows.get((owner, rule.id, comp))
        if not win:
            return 0
        return _prune_sum(win, now - int(rule.window_s * 1000))

    def forget(self, node_id: str) -> None:
        for wkey in [w for w in self._windows if w[0] == node_id]:
            del self._windows[wkey]


def _prune_sum(win: deque[tuple[int, int]], horizon: int) -> int:
    while win and win[0][0] <= horizon:
        win.popleft()
    return sum(c for _, c in win)
