"""GPU rule kinds: flags, the driver's recovery action, clock-event reasons, GPUs missing
from the report, NVLinks down and NVLink error counters."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controller.detect.evaluators import counters
from controller.detect.evaluators.base import (
    Derived,
    GpuEvaluator,
    GpuSetEvaluator,
    LinkCounterEvaluator,
    LinkStateEvaluator,
    Owned,
    Setup,
)
from controller.detect.evaluators.params import (
    CLOCK_REASON_BITS,
    EVENTS,
    THRESHOLD,
    WINDOW,
    Param,
    clock_reason,
    list_of,
    one_of,
)
from controller.detect.model import Condition, Defaults, Rule
from controller.detect.nvlinks import Links
from controller.detect.rates import RateSample
from starpulse.core import vocab
from starpulse.core import xid as xidcat
from starpulse.core.vocab import SEVERITY_ORDER
from starpulse.v1 import telemetry_pb2 as tpb

GPU_FLAGS = ("lost", "reset_required", "remap_pending", "remap_failure", "retired_pages_pending")
_FIELDS = tpb.GpuSample.DESCRIPTOR.fields_by_name
# How an operator lets a saturated NVLink error counter count again (the driver zeroes them).
_CLEAR_NVLINK = "clear its error counters (a GPU reset or driver reload zeroes them)"


class GpuFlag(GpuEvaluator):
    """A boolean GpuSample field that is true."""

    kind = "gpu_flag"
    params = {"field": Param(one_of(GPU_FLAGS), required=True), "events": EVENTS}
    judges_lost_gpus = True  # gpu.lost itself

    @classmethod
    def reads(cls, rule: Rule) -> tuple[str, ...]:
        return (rule.params["field"],)

    @classmethod
    def wake(cls, rule: Rule) -> Mapping[str, int]:
        return {rule.params["field"]: -1}

    def __init__(self, rules: tuple[Rule, ...], setup: Setup) -> None:
        super().__init__(rules, setup)
        # (rule, field, its position in the read, optional): an optional flag that is absent is
        # neither bad nor good
        self._spec = tuple(
            (r, f, setup.gpu_fields[f], _FIELDS[f].has_presence) for r in rules for f in [r.params["field"]]
        )

    def gpu(self, nid: str, comp: str, g: tpb.GpuSample, state: tuple[Any, ...], now: int, owned: Owned) -> None:
        # presence (HasField) is asked only where it decides something: a set flag is present by
        # definition, so the question is left for the GPU that has an open condition to resolve
        judge = self.judge
        for rule, fld, at, optional in self._spec:
            if state[at]:
                self.bad_on(nid, rule, comp, "gpu", f"{comp}: {rule.description}", {"field": fld, "uuid": g.uuid}, now)
            elif owned and (not optional or g.HasField(fld)):
                judge.good(owned, rule, comp, now)


class GpuRecoveryAction(GpuEvaluator):
    """GpuSample.recovery_action non-zero; the action is the one the value names."""

    kind = "gpu_recovery_action"
    params = {"events": EVENTS}

    @classmethod
    def reads(cls, rule: Rule) -> tuple[str, ...]:
        return ("recovery_action",)

    @classmethod
    def wake(cls, rule: Rule) -> Mapping[str, int]:
        return {"recovery_action": -1}

    def __init__(self, rules: tuple[Rule, ...], setup: Setup) -> None:
        super().__init__(rules, setup)
        self._at = setup.gpu_fields["recovery_action"]

    def gpu(self, nid: str, comp: str, g: tpb.GpuSample, state: tuple[Any, ...], now: int, owned: Owned) -> None:
        value = state[self._at]
        if value:
            name, action = xidcat.recovery_action(value)
            message = f"{comp}: driver recovery action {value} ({name})"
            evidence = {"recovery_action": value, "recovery_action_name": name, "uuid": g.uuid}
            for rule in self.rules:
                severity = recovery_severity(rule, action)
                self.bad_on(nid, rule, comp, "gpu", message, dict(evidence), now, action=action, severity=severity)
        elif owned and g.HasField("recovery_action"):  # absent is unknown, not 0
            for rule in self.rules:
                self.judge.good(owned, rule, comp, now)

    def opened_by_event(self, rule: Rule, cond: Condition, ev: tpb.Event) -> None:
        """The agent's recovery-action event carries the value: take the action it names."""
        value = int(ev.attributes.get("recovery_action", "0") or 0)
        if value:
            name, action = xidcat.recovery_action(value)
            cond.action = action
            cond.severity = recovery_severity(rule, action)  # type: ignore[assignment]
            cond.evidence["recovery_action"] = value
            cond.evidence["recovery_action_name"] = name


class GpuClockReasons(GpuEvaluator):
    """Clock-event reason bits set (hardware slowdown)."""

    kind = "gpu_clock_reasons"
    params = {"reasons": Param(list_of(clock_reason), required=True), "events": EVENTS}

    @classmethod
    def reads(cls, rule: Rule) -> tuple[str, ...]:
        return ("clock_event_reasons",)

    @classmethod
    def wake(cls, rule: Rule) -> Mapping[str, int]:
        return {"clock_event_reasons": _mask(rule)}  # an unwatched bit (SW power cap, idle) is healthy

    def __init__(self, rules: tuple[Rule, ...], setup: Setup) -> None:
        super().__init__(rules, setup)
        self._at = setup.gpu_fields["clock_event_reasons"]
        self._masks = tuple((r, _mask(r)) for r in rules)

    def gpu(self, nid: str, comp: str, g: tpb.GpuSample, state: tuple[Any, ...], now: int, owned: Owned) -> None:
        reasons = state[self._at]
        for rule, mask in self._masks:
            bits = reasons & mask
            if bits:
                names = [n for n, b in CLOCK_REASON_BITS.items() if bits & b]
                self.bad_on(
                    nid,
                    rule,
                    comp,
                    "gpu",
                    f"{comp}: hardware clock slowdown ({', '.join(names)})",
                    {
                        "clock_event_reasons": hex(reasons),
                        "reasons": names,
                        "temperature_c": g.temperature_c if g.HasField("temperature_c") else None,
                        "power_w": g.power_w if g.HasField("power_w") else None,
                    },
                    now,
                )
            elif owned and g.HasField("clock_event_reasons"):
                self.judge.good(owned, rule, comp, now)


class GpuMissing(GpuSetEvaluator):
    """Fewer GPUs in the report than in the node's inventory."""

    kind = "gpu_missing"

    def gpu_set(
        self,
        nid: str,
        indices: frozenset[int],
        names: Mapping[int, str],
        report: tpb.Report,
        seen: list[int] | None,
        now: int,
        owned: Owned,
    ) -> None:
        if not indices:
            return
        reported = set(seen) if seen is not None else {g.index for g in report.gpus}
        if not owned and indices <= reported:
            return  # every GPU reported and nothing open to resolve: no verdict can change
        gpu_status = next((c for c in report.collectors if c.name == "gpu"), None)
        if gpu_status is not None and not gpu_status.ok:
            return  # the collector failed: absent GPUs are unknown, not missing
        if not report.gpus and gpu_status is None:
            return
        for rule in self.rules:
            for index in indices:
                comp = names[index]
                if index not in reported:
                    self.bad_on(
                        nid,
                        rule,
                        comp,
                        "gpu",
                        f"{comp}: in the inventory but not in the report ({len(reported)} of {len(indices)} GPUs)",
                        {"reported_gpus": len(reported), "inventory_gpus": len(indices)},
                        now,
                    )
                elif owned:
                    self.judge.good(owned, rule, comp, now)


class NvLinkDown(LinkStateEvaluator):
    """An NVLink the GPU reports as down."""

    kind = "gpu_nvlink_down"
    params = {"events": EVENTS}

    def links(self, nid: str, comp: str, view: Links, now: int, owned: Owned) -> None:
        down = view.down
        if not down:
            if owned:
                for rule in self.rules:
                    self.judge.good(owned, rule, comp, now)
            return
        message = f"{comp}: NVLink {', '.join(map(str, down))} down"
        for rule in self.rules:
            self.bad_on(nid, rule, comp, "gpu", message, {"links_down": list(down), "links": len(view.numbers)}, now)


class NvLinkErrors(LinkCounterEvaluator):
    """NVLink error counters, per link, as a rate or a count in a window."""

    kind = "gpu_nvlink_errors"
    params = {
        "counters": Param(list_of(one_of(vocab.NVLINK_ERROR_COUNTERS)), required=True),
        "threshold": THRESHOLD,
        "window": WINDOW,
    }

    @classmethod
    def prepare(cls, params: dict[str, Any], defaults: Defaults, where: str, errors: list[str]) -> Derived:
        return counters.prepare_threshold(params, where, errors, tuple(params["counters"]))

    @classmethod
    def reads(cls, rule: Rule) -> tuple[str, ...]:
        return rule.counter_keys

    def __init__(self, rules: tuple[Rule, ...], setup: Setup) -> None:
        super().__init__(rules, setup)
        self._rates = setup.rates
        self._defaults = setup.defaults

    def link_counters(
        self, nid: str, comp: str, view: Links, samples: Mapping[str, RateSample] | None, now: int, owned: Owned
    ) -> None:
        if samples is None and not (owned and any((r.id, comp) in owned for r in self.rules)):
            return  # nothing moved and nothing open: no verdict can change
        numbers = view.numbers
        for rule in self.rules:
            worst: tuple[float, bool, bool, int, str] | None = None
            stuck: tuple[int, str, str] | None = None  # (link, counter, key)
            keys: list[str] = []
            for pos, link in enumerate(numbers):
                for counter in rule.counter_keys:
                    key = f"nvlink-{pos}/{counter}"
                    keys.append(key)
                    sample = samples.get(key) if samples else None
                    measured = counters.measure(self._rates, rule, comp, key, sample, now)
                    if measured is None:
                        continue
                    if worst is None or counters.worse(measured, worst):
                        worst = (*measured, link, counter)
                    if measured[2] and stuck is None:
                        stuck = (link, counter, key)
            window = None if rule.threshold_is_rate else (comp, tuple(keys))
            if worst is not None and counters.exceeds(rule, self._defaults, worst[:3]):
                value, saturated, _, link, counter = worst
                self.bad_on(
                    nid,
                    rule,
                    comp,
                    "gpu",
                    counters.threshold_message(rule, f"{comp} NVLink {link} {counter}", value, saturated),
                    counters.threshold_evidence(rule, counter, value, saturated, link=link),
                    now,
                    window=window,
                )
            elif stuck is not None:
                link, counter, key = stuck
                saturation = self._rates.saturation_of(key)
                self.bad_on(
                    nid,
                    rule,
                    comp,
                    "gpu",
                    counters.stuck_message(f"{comp} NVLink {link} {counter}", saturation, _CLEAR_NVLINK),
                    counters.stuck_evidence(counter, self._rates.last(comp, key), saturation, link=link),
                    now,
                    severity=counters.STUCK_SEVERITY,
                    action=counters.STUCK_ACTION,
                    window=window,
                )
            elif owned and (rule.id, comp) in owned and rule.threshold_is_rate:
                self.judge.good(owned, rule, comp, now)
            # count rules resolve when their window empties (tick), not on one quiet read


def recovery_severity(rule: Rule, action: str) -> str:
    """At least the rule's severity; a reboot is fatal."""
    derived = vocab.severity_for_action(action, rule.severity)
    if derived == "info":
        return rule.severity
    return derived if SEVERITY_ORDER[derived] > SEVERITY_ORDER[rule.severity] else rule.severity


def _mask(rule: Rule) -> int:
    mask = 0
    for bit in rule.params["reasons"]:
        mask |= bit
    return mask
