"""What the counter kinds share: a threshold as a rate or a count in a window, and saturation.

A rule on cumulative counters (``nic_counter``, ``gpu_nvlink_errors``) fires on the worst
of its counters: a per-second rate (``threshold: "1/s"``, per read or averaged over a
``window``) or a count in a window (``threshold: "3"``, ``window: "10m"``). A saturated
IBA counter is only a lower bound, so it counts as "at least" and may fire on its own
(``saturated_fires``).
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


def measure(
    rates: CounterRate, rule: Rule, entity: str, counter: str, sample: RateSample | None, now: int
) -> tuple[float, bool] | None:
    """(rate per second or count in window, saturated) for one counter; None when unknown yet."""
    if rule.window_s:
        total, saturated = rates.window_sum(entity, counter, rule.window_s, now)
        if sample is not None and sample.saturated:
            saturated = True
        value = total / rule.window_s if rule.threshold_is_rate else float(total)
        return value, saturated
    if sample is None:
        return None
    return sample.rate, sample.saturated


def exceeds(rule: Rule, defaults: Defaults, value: float, saturated: bool) -> bool:
    if value >= rule.threshold:
        return True
    fires = rule.params.get("saturated_fires")
    return saturated and (defaults.saturated_fires if fires is None else fires)


def worse(measured: tuple[float, bool], worst: tuple[Any, ...]) -> bool:
    """Whether a counter's (value, saturated) replaces the worst so far: a higher value, or
    saturated where the worst is not (a saturated counter's value is only a lower bound, and
    ``exceeds`` may fire on saturation alone). NIC and NVLink counter rules both pick this way."""
    return measured[0] > worst[0] or (measured[1] and not worst[1])


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
