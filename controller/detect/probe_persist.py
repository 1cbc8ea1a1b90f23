"""Persistence for the probe localisation's blames, per kind (issue 29).

A leaf and a loss "above" it (a ``path``: the leaf's own ring clean, its cross-fabric pairs
lossy) are the same component named two ways, and just after a leaf starts dropping the
evidence can read either way: its ring's small sample may show none of the one or two losses
its rate predicts for a localisation or two. So the two are told apart before an incident
says which: any naming of the component counts towards its persistence, but a ``path`` opens
only after one localisation more than a leaf needs, all of them naming it a path (the next
localisation decides between the path and its leaf), and an open path whose leaf is then
named as the leaf for ``persist`` localisations in a row is replaced by the leaf's condition.
An open leaf named a path again stays the leaf (the stronger finding, on the same evidence).

And the ring is taken as clean only when its few losses would be improbable were the leaf
itself losing at its measured rate (``ring_refutes_leaf``), not because they are under a
fixed share: just after a fault starts a small ring expects one or two losses and may show none.
"""

from __future__ import annotations

import math

PATH = "path"
PATH_RULE_SUFFIX = ".path"  # a path condition's rule: probe.loss.path, probe.delay.path
_LEAF = "leaf"
_PATH_CATEGORY = "path"  # the condition category a path blame opens (controller.detect.probes)


def opens(kind: str, streak: int, same_kind_run: int, persist: int) -> bool:
    """A blame named ``streak`` localisations in a row, the last ``same_kind_run`` of them as
    ``kind``, becomes a condition now."""
    if kind == PATH:
        return same_kind_run >= persist + 1
    return streak >= persist


def replaces(open_category: str, kind: str, same_kind_run: int, persist: int) -> bool:
    """An open path condition gives way to its leaf, named as such ``persist`` times in a row."""
    return open_category == _PATH_CATEGORY and kind == _LEAF and same_kind_run >= persist


RING_ALPHA = 0.01
"""How unlikely the ring's few losses must be, were the leaf itself losing at its measured
rate, before the ring is taken as clean (the loss above the leaf, a path)."""


def ring_refutes_leaf(ring_bad: int, ring_sent: int, leaf_rate: float, alpha: float = RING_ALPHA) -> bool:
    """The leaf's own ring (pairs under it) lost too little for the leaf to be losing at
    ``leaf_rate``: P(X <= ring_bad) <= ``alpha`` for X ~ Poisson(leaf_rate x ring_sent). A
    ring whose sample is too small to tell (a few hundred probes at 1 %, just after a fault
    starts, expect two or three losses, and none is no surprise) does not refute the leaf: the
    leaf stays the answer, not a path above it."""
    lam = leaf_rate * ring_sent
    if lam <= 0.0:
        return False
    term = math.exp(-lam)
    total = term
    for i in range(1, ring_bad + 1):
        term *= lam / i
        total += term
        if total > alpha:
            return False
    return total <= alpha
