"""The evaluator registry and the engine's fast path built from what evaluators declare."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any, ClassVar

import pytest

from controller.detect.conditions import ConditionEngine
from controller.detect.evaluators.base import DuplicateKind, Evaluator, GpuEvaluator, Owned, Registry
from controller.detect.evaluators.gpu import GpuFlag
from controller.detect.evaluators.registry import REGISTRY
from controller.detect.model import Rule
from controller.detect.rules import KINDS, RuleSet, parse_rules
from starpulse.core.clock import FakeClock
from starpulse.v1 import telemetry_pb2 as tpb
from tests.support.conditions import NODE, compute_node, good_report, opened, resolved

GPU5 = f"{NODE}/gpu-5"


class RetiredDbe(GpuEvaluator):
    """A test kind on a field no default rule reads: retired pages (double-bit) above zero."""

    kind = "gpu_retired_dbe"
    asked: ClassVar[list[str]] = []  # components it was asked about, to see the fast path skip

    @classmethod
    def reads(cls, rule: Rule) -> tuple[str, ...]:
        return ("retired_pages_dbe",)

    @classmethod
    def wake(cls, rule: Rule) -> Mapping[str, int]:
        return {"retired_pages_dbe": -1}

    def gpu(self, nid: str, comp: str, g: tpb.GpuSample, state: tuple[Any, ...], now: int, owned: Owned) -> None:
        self.asked.append(comp)
        for rule in self.rules:
            if g.retired_pages_dbe:
                self.judge.bad(rule, comp, "gpu", nid, nid, f"{comp}: retired", {"pages": g.retired_pages_dbe}, now)
            elif g.HasField("retired_pages_dbe"):
                self.judge.good(owned, rule, comp, now)


class HotMemory(GpuEvaluator):
    """A test kind without a wake (a float field cannot have one): asked about every GPU."""

    kind = "gpu_hot_memory"

    @classmethod
    def reads(cls, rule: Rule) -> tuple[str, ...]:
        return ("memory_temperature_c",)

    def gpu(self, nid: str, comp: str, g: tpb.GpuSample, state: tuple[Any, ...], now: int, owned: Owned) -> None:
        if g.HasField("memory_temperature_c") and g.memory_temperature_c >= 95:
            for rule in self.rules:
                self.judge.bad(rule, comp, "gpu", nid, nid, f"{comp}: hot HBM", {}, now)


def _ruleset(registry: Registry, *kinds: str) -> RuleSet:
    body = "".join(
        textwrap.dedent(f"""
        - id: test.{kind}
          description: "a test rule"
          category: gpu
          severity: warning
          action: investigate
          kind: {kind}
        """)
        for kind in kinds
    )
    return parse_rules("version: 1\nrules:\n" + textwrap.indent(body, "  "), "test", registry)


def _engine(rules: RuleSet) -> tuple[ConditionEngine, FakeClock]:
    clock = FakeClock(1_000_000)
    return ConditionEngine(rules, clock=clock), clock


class TestRegistry:
    def test_a_duplicate_kind_is_refused(self) -> None:
        """Two evaluators claiming one kind is an error when the registry is built, naming both."""

        class Other(GpuFlag):
            pass

        with pytest.raises(DuplicateKind, match="rule kind 'gpu_flag' is registered twice: GpuFlag and Other"):
            Registry([GpuFlag, Other])

    def test_an_evaluator_of_no_family_is_refused(self) -> None:
        """An evaluator the engine would never call is an error, not a kind that silently never fires."""

        class Nowhere(Evaluator):
            kind = "nowhere"

        with pytest.raises(TypeError, match="Nowhere is of no family"):
            Registry([Nowhere])

    def test_kinds_are_the_registrys(self) -> None:
        """rules.KINDS (kind -> parameters) is derived from the one registry, in its order."""
        assert list(KINDS) == list(REGISTRY.kinds())
        assert all(KINDS[cls.kind] is cls.params for cls in REGISTRY)
        assert {"gpu_field", "nic_field"} <= set(KINDS)

    def test_a_kind_outside_the_registry_is_unknown(self) -> None:
        """A rules file may use only the kinds of the registry it is loaded with."""
        with pytest.raises(ValueError, match="'kind': unknown kind 'gpu_retired_dbe'"):
            _ruleset(REGISTRY, "gpu_retired_dbe")


class TestFastPath:
    def test_a_new_evaluators_wake_field_is_read(self) -> None:
        """A kind added beside the defaults fires on an otherwise healthy GPU: its declared field is
        on the one read per GPU, and a set field wakes the GPU."""
        registry = Registry([*REGISTRY, RetiredDbe])
        engine, clock = _engine(_ruleset(registry, "gpu_retired_dbe"))
        node = compute_node()
        assert engine.on_report(node, good_report(clock.time_ms())) == []
        clock.advance(5)
        bad = good_report(clock.time_ms())
        bad.gpus[5].retired_pages_dbe = 2
        assert opened(engine.on_report(node, bad)) == [("test.gpu_retired_dbe", GPU5)]
        clock.advance(5)
        back = good_report(clock.time_ms())
        back.gpus[5].retired_pages_dbe = 0
        for _ in range(2):
            changes = engine.on_report(node, back)
            clock.advance(5)
        assert resolved(changes) == [("test.gpu_retired_dbe", GPU5)]

    def test_a_quiet_gpu_is_not_asked(self) -> None:
        """With its wake field zero and nothing open, a GPU costs the evaluator nothing."""
        registry = Registry([*REGISTRY, RetiredDbe])
        engine, clock = _engine(_ruleset(registry, "gpu_retired_dbe"))
        RetiredDbe.asked.clear()
        for _ in range(3):
            engine.on_report(compute_node(), good_report(clock.time_ms()))
            clock.advance(5)
        assert RetiredDbe.asked == []
        r = good_report(clock.time_ms())
        r.gpus[2].retired_pages_dbe = 1
        engine.on_report(compute_node(), r)
        assert RetiredDbe.asked == [f"{NODE}/gpu-2"]

    def test_an_evaluator_without_a_wake_is_asked_about_every_gpu(self) -> None:
        """No wake declared: the evaluator sees every GPU of every report, healthy or not."""
        registry = Registry([*REGISTRY, HotMemory])
        engine, clock = _engine(_ruleset(registry, "gpu_hot_memory"))
        r = good_report(clock.time_ms())
        r.gpus[5].memory_temperature_c = 97
        assert opened(engine.on_report(compute_node(), r)) == [("test.gpu_hot_memory", GPU5)]

    def test_a_field_the_sample_lacks_fails_the_build(self) -> None:
        """An evaluator declaring a field GpuSample does not have is a bug found when the engine is built."""

        class Typo(RetiredDbe):
            kind = "gpu_typo"

            @classmethod
            def reads(cls, rule: Rule) -> tuple[str, ...]:
                return ("retired_pages_dbee",)

            @classmethod
            def wake(cls, rule: Rule) -> Mapping[str, int]:
                return {"retired_pages_dbee": -1}

        rules = _ruleset(Registry([*REGISTRY, Typo]), "gpu_typo")
        with pytest.raises(ValueError, match="reads 'retired_pages_dbee', which GpuSample does not have"):
            ConditionEngine(rules, clock=FakeClock())

    def test_a_float_cannot_wake(self) -> None:
        """A wake mask applies to integers and flags; a float wake field fails the build."""

        class FloatWake(HotMemory):
            kind = "gpu_float_wake"

            @classmethod
            def wake(cls, rule: Rule) -> Mapping[str, int]:
                return {"memory_temperature_c": -1}

        rules = _ruleset(Registry([*REGISTRY, FloatWake]), "gpu_float_wake")
        with pytest.raises(ValueError, match="memory_temperature_c is not an integer or a flag"):
            ConditionEngine(rules, clock=FakeClock())

    def test_an_open_condition_on_the_gpu_wakes_it(self) -> None:
        """A GPU with a condition open is asked although its fields are quiet, so it can resolve."""
        registry = Registry([*REGISTRY, RetiredDbe])
        engine, clock = _engine(_ruleset(registry, "gpu_retired_dbe"))
        node = compute_node()
        r = good_report(clock.time_ms())
        r.gpus[5].retired_pages_dbe = 1
        engine.on_report(node, r)
        RetiredDbe.asked.clear()
        clock.advance(5)
        quiet = good_report(clock.time_ms())
        quiet.gpus[5].retired_pages_dbe = 0
        engine.on_report(node, quiet)
        assert RetiredDbe.asked == [GPU5]  # only the GPU with something open, not its seven neighbours
