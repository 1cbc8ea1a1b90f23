"""The fabric's background loss, and whether a component's loss stands out from it (issue 29).

A clean fabric is never loss-free: a stray drop here and there (a flapping optic's CRC, a
buffer at a busy hour) spreads evenly over every path. Judged against an absolute threshold,
an even 0.2 % background gives each NIC a couple of expected losses per window, and across
thousands of NICs some reach any small fixed count by chance, window after window: incidents
with no faulty component. So a component is suspect only when its losses are more than the
background predicts for its traffic: a one-sided Poisson test (losses ~ Poisson(background x
sent)) at a false-alarm probability ``alpha`` for the whole fabric, split over the components
tested (Bonferroni). An elevated background itself is one fabric-wide finding (a metric and a
log line), never a per-NIC incident.
"""

from __future__ import annotations

import math


def poisson_tail_at_most(k: int, lam: float, p: float) -> bool:
    """P(X >= k) <= p for X ~ Poisson(lam): summed upward from k, stopping as soon as the
    answer is known (the tail's terms fall geometrically past the mean), so a leaf's thousands
    of probes cost a few terms, not a thousand."""
    if k <= 0:
        return p >= 1.0
    if lam <= 0.0:
        return True  # no background: any loss stands out
    if k <= lam:
        return False  # at or under the mean: never significant at a small p
    term = math.exp(-lam + k * math.log(lam) - math.lgamma(k + 1))
    total = 0.0
    i = k
    while True:
        total += term
        if total > p:
            return False
        r = lam / (i + 1)  # < 1 past the mean
        if total + term * r / (1.0 - r) <= p:  # what is left is at most a geometric series
            return True
        term *= r
        i += 1


def stands_out(lost: float, sent: float, background: float, p: float) -> bool:
    """``lost`` of ``sent`` probes is more than ``background`` loss predicts, at probability ``p``."""
    return poisson_tail_at_most(math.ceil(lost), background * max(0.0, sent), p)
