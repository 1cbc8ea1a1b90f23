"""The fabric's background loss, and whether a component's loss stands out from it (issue 29).

A clean fabric is never loss-free: a stray drop here and there (a flapping optic's CRC, a
buffer at a busy hour) spreads evenly over every path. Judged against an absolute threshold,
an even 0.2 % background gives each NIC a couple of expected losses per window, and across
thousands of NICs some reach any small fixed count by chance, window after window: incidents
with no faulty component. So a component is suspect only when its losses are more than the
background predicts for its traffic: a one-sided Poisson test (losses ~ Poisson(background x
sent)) at a false-alarm probability ``alpha`` for the whole fabric, split over the components
tested (Bonferroni). An elevated background itself is one fabric-wide finding (a metric and a
log line), never a per-NIC incident. Delay has its own baseline (``delay_baseline``, below):
robust (median and MAD of the paths' p99), since round trips are not counts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple


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


# -- delay -------------------------------------------------------------------------------------
# The delay vote's analogue. A large fabric's round trips spread (more hops, deeper buffers,
# busier hosts), and where the whole fabric's p99 sits near or above ``rtt_threshold_us`` every
# path reads slow against the absolute threshold: the vote would blame whichever hosts and
# leaves carry the most paths. So a path is slow for the vote only when its p99 also stands out
# from the fabric's own baseline: above the median of every counted path's p99 by ``DELAY_Z``
# robust deviations (1.4826 x the median absolute deviation, the normal's sigma), and never by
# less than ``DELAY_MIN_EXCESS`` of the median. A fabric fast against the threshold (the usual
# case: tens of microseconds against 500) keeps the threshold as it was; one cable or host that
# adds delay stands far out of a baseline that its few paths do not move.
DELAY_Z = 4.0
DELAY_MIN_EXCESS = 0.25  # the cut is at least the median x 1.25, even where every path reads alike
DELAY_SAMPLE = 4096  # paths the baseline is taken from, at most (a median needs no more)


class DelayBaseline(NamedTuple):
    median_us: float
    sigma_us: float  # 1.4826 x the median absolute deviation
    cut_us: float  # a path's p99 must reach this to count as slow: at least the threshold
    paths: int  # paths the baseline was taken from


def delay_baseline(p99s: Sequence[float], threshold_us: float) -> DelayBaseline:
    """The fabric's round-trip baseline from its paths' p99s (answered paths only), and the cut
    a path's p99 must reach to be slow: the absolute threshold, or the baseline's own outlier
    bound where that is higher."""
    if not p99s:
        return DelayBaseline(0.0, 0.0, threshold_us, 0)
    values = sorted(p99s)
    median = _median(values)
    sigma = 1.4826 * _median(sorted(abs(v - median) for v in values))
    excess = max(DELAY_Z * sigma, DELAY_MIN_EXCESS * median)
    return DelayBaseline(median, sigma, max(threshold_us, median + excess), len(values))


def _median(sorted_values: Sequence[float]) -> float:
    n = len(sorted_values)
    mid = n // 2
    return sorted_values[mid] if n % 2 else (sorted_values[mid - 1] + sorted_values[mid]) / 2
