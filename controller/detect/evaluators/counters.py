"""What the counter kinds share: a threshold as a rate or a count in a window, and saturation.

A rule on cumulative counters (``nic_counter``, ``gpu_nvlink_errors``) fires on the worst
of its counters: a per-second rate (``threshold: "1/s"``, per read or averaged over a
``window``) or a count in a window (``threshold: "3"``, ``window: "10m"``).

IBA counters saturate at their maximum instead of wrapping, and what a counter at its
maximum means depends on when it got there. One that *reached* it inside the window (below
it at an earlier read, at it now) counted errors just now, and its delta is only a lower
bound: it fires on its own ("at least", ``saturated_fires``). One already at its maximum at
first sight, or since before the window, says "blind since some time", not "errors now":
real nodes run for months with ``excessive_buffer_overrun_errors`` at 15 and ``link_downed``
at 255. That is an info-level note (clear the counters so they can count again), never a
reason to take the node out of service. A counter that goes down was cleared or wrapped:
its delta is the count since then (controller.detect.rates), never a burst by itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controller.detect.evaluators.base import Derived
from controller.detect.model import Defaults, Rule
from controller.detect.rates import CounterRate, RateSample
from starpulse.core.units import Quantity


def prepare_threshold(
    params: Mapping[str, Any], where: str, errors: list[str], counter_keys: tuple[str, ...]
) -> Derived:
    """A counter rule's threshold and window, checked together (a count needs a window)."""
    threshold: Quantity = params["threshold"]
    window: Quantity | None = params.get("window")
    if threshold.dimension == "count" and window is None:
        errors.append(f"{where}: 'threshold': {threshold.text!r} is a count and needs a 'window' to count in")
    return Derived(
        threshold=threshold.value,
        threshold_is_rate=threshold.dimension == "rate",
        window_s=window.value if window is not None else 0.0,
        counter_keys=counter_keys,
    )


# (rate per second or count in the window, REACHED: at its maximum having moved inside the
# window, STUCK: at its maximum and still since the window began or since first sight)
Measured = tuple[float, bool, bool]

STUCK_SEVERITY = "info"
STUCK_ACTION = "none"


def measure(
    rates: CounterRate, rule: Rule, entity: str, counter: str, sample: RateSample | None, now: int
) -> Measured | None:
    """What one counter measures now; None when unknown yet (first sight).

    ``sample`` is this read's (None when nothing of the entity moved and nothing of it sits
    at a maximum, so "at its maximum now" is the sample's own word). Reached or stuck is told
    by whether the counter moved inside the window (per-read rules: since the last read)."""
    at_max = sample is not None and sample.saturated
    if rule.window_s:
        total, _ = rates.window_sum(entity, counter, rule.window_s, now)
        value = total / rule.window_s if rule.threshold_is_rate else float(total)
        return value, at_max and total > 0, at_max and total == 0
    if sample is None:
        return None
    return sample.rate, at_max and sample.delta > 0, at_max and sample.delta == 0


def exceeds(rule: Rule, defaults: Defaults, measured: Measured) -> bool:
    """Whether the counter fires the rule: over its threshold, or having reached its maximum
    inside the window (``saturated_fires``). A counter stuck at its maximum never fires."""
    if measured[0] >= rule.threshold:
        return True
    fires = rule.params.get("saturated_fires")
    return measured[1] and (defaults.saturated_fires if fires is None else fires)


def worse(measured: Measured, worst: tuple[Any, ...]) -> bool:
    """Whether a counter's measure replaces the worst so far: a higher value, or reached its
    maximum where the worst did not (its value is only a lower bound, and ``exceeds`` may
    fire on that alone). NIC and NVLink counter rules both pick this way."""
    return measured[0] > worst[0] or (measured[1] and not worst[1])


def stuck_message(what: str, saturation: int, clear: str) -> str:
    """The note for a counter found at its maximum: it can count nothing more until cleared."""
    return f"{what}: counter saturated (at its maximum, {saturation}): {clear}, it can no longer show new errors"


def stuck_evidence(counter: str, value: int | None, saturation: int, **extra: Any) -> dict[str, Any]:
    evidence: dict[str, Any] = {
        "counter": counter,
        "value": value,
        "saturation": saturation,
        "saturated": True,
        "stuck": True,
        "at_least": False,
    }
    evidence.update(extra)
    return evidence


def threshold_message(rule: Rule, what: str, value: float, saturated: bool) -> str:
    threshold = rule.params["threshold"]
    if rule.threshold_is_rate:
        measured = f"{value:.3g}/s" + (f" over {rule.window_s:g}s" if rule.window_s else "")
    else:
        measured = f"{value:g} in {rule.window_s:g}s"
    if saturated:
        return f"{what}: counter saturated, at least {measured} (threshold {threshold.text})"
    return f"{what}: {measured} (threshold {threshold.text})"


def threshold_evidence(rule: Rule, counter: str, value: float, saturated: bool, **extra: Any) -> dict[str, Any]:
    threshold = rule.params["threshold"]
    evidence: dict[str, Any] = {
        "counter": counter,
        "rate" if rule.threshold_is_rate else "count": round(value, 6),
        "threshold": threshold.value,
        "threshold_text": threshold.text,
        "unit": threshold.unit,
        "window_s": rule.window_s or None,
        "saturated": saturated,
        "at_least": saturated,
    }
    evidence.update(extra)
    return evidence
