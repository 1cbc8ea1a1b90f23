"""The generic field kinds (gpu_field, nic_field): a sample field against a threshold or another field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from controller.detect.conditions import ConditionEngine
from controller.detect.evaluators.fields import FieldSpec, comparable_fields, compile_spec, field_params
from controller.detect.rules import RulesError, RuleSet, load_rules, parse_rules
from starpulse.core.clock import FakeClock
from starpulse.core.units import BadValue
from starpulse.v1 import telemetry_pb2 as tpb
from tests.support.conditions import NODE, compute_node, good_report

GPU5 = f"{NODE}/gpu-5"
NIC5 = f"{NODE}/nic-5"


def rules(body: str) -> RuleSet:
    head = 'description: "a field rule"\ncategory: gpu\nseverity: warning\naction: investigate\n'
    doc = "version: 1\nrules:\n  - id: test.field\n" + textwrap.indent(head + textwrap.dedent(body), "    ")
    return parse_rules(doc, "test")


def engine_for(body: str) -> tuple[ConditionEngine, FakeClock]:
    clock = FakeClock(1_000_000)
    return ConditionEngine(rules(body), clock=clock), clock


def feed(engine: ConditionEngine, clock: FakeClock, edit=None) -> list[tuple[str, str]]:
    """One report (``edit`` applied to a healthy one) 5 s after the last; the keys opened or resolved."""
    clock.advance(5)
    r = good_report(clock.time_ms())
    if edit is not None:
        edit(r)
    changes = engine.on_report(compute_node(), r)
    return [(c.kind, c.condition.rule) for c in changes]


def gpu5(**fields: object):
    def edit(r: tpb.Report) -> None:
        g = r.gpus[5]
        for name, value in fields.items():
            if value is None:
                g.ClearField(name)
            else:
                setattr(g, name, value)

    return edit


OPENED = [("opened", "test.field")]
RESOLVED = [("resolved", "test.field")]


class TestThreshold:
    BODY = 'kind: gpu_field\nfield: temperature_c\nop: ">="\nthreshold: "85C"\n'

    def test_opens_at_the_threshold_and_resolves_below(self) -> None:
        """temperature_c >= 85C: 85 opens (inclusive), 84 twice resolves (resolve_after 2)."""
        engine, clock = engine_for(self.BODY)
        assert feed(engine, clock, gpu5(temperature_c=84.5)) == []
        assert feed(engine, clock, gpu5(temperature_c=85)) == OPENED
        cond = engine.get("test.field", GPU5)
        assert cond is not None and cond.component_type == "gpu"
        assert (
            cond.message == f"{GPU5} (GPU 5, PCI 00000000:1C:00.0): a field rule (temperature_c 85 >= 85C)"
        )  # the operator's words too
        assert cond.evidence == {
            "field": "temperature_c",
            "value": 85.0,
            "op": ">=",
            "threshold": "85C",
            "uuid": "GPU-5",
        }
        assert feed(engine, clock, gpu5(temperature_c=84)) == []
        assert feed(engine, clock, gpu5(temperature_c=84)) == RESOLVED

    @pytest.mark.parametrize(
        ("body", "bad", "good"),
        [
            ('field: utilization_gpu_pct\nop: "<"\nthreshold: "5%"', 2.0, 50.0),
            ("field: memory_used_bytes\nop: '>'\nthreshold: 70GiB", 71 * 2**30, 10 * 2**30),
            ("field: performance_state\nop: '!='\nthreshold: 0", 8, 0),
            ("field: sm_clock_mhz\nop: '<='\nthreshold: 1000", 1000, 1980),
        ],
        ids=["percent", "bytes", "not-equal", "bare-number"],
    )
    def test_units_follow_the_field(self, body: str, bad: object, good: object) -> None:
        """A threshold is written in the field's unit ('5%', '70GiB') or as a bare number."""
        engine, clock = engine_for("kind: gpu_field\n" + body + "\nresolve_after: 1\n")
        name = body.split("\n", maxsplit=1)[0].removeprefix("field: ")
        assert feed(engine, clock, gpu5(**{name: good})) == []
        assert feed(engine, clock, gpu5(**{name: bad})) == OPENED
        assert feed(engine, clock, gpu5(**{name: good})) == RESOLVED

    def test_a_flag(self) -> None:
        """A flag compares with true/false; the packaged gpu.remap_pending is one."""
        engine, clock = engine_for("kind: gpu_field\nfield: retired_pages_pending\nop: '=='\nthreshold: true\n")
        assert feed(engine, clock, gpu5(retired_pages_pending=False)) == []
        assert feed(engine, clock, gpu5(retired_pages_pending=True)) == OPENED
        assert engine.get("test.field", GPU5).message.endswith("(retired_pages_pending is true)")  # type: ignore[union-attr]
        assert load_rules().get("gpu.remap_pending").kind == "gpu_field"


class TestOtherField:
    BODY = "kind: gpu_field\nfield: power_w\nop: '>'\nother: power_limit_w\nresolve_after: 1\n"

    def test_compares_two_fields_of_the_sample(self) -> None:
        """power_w > power_limit_w: both fields come from the same sample."""
        engine, clock = engine_for(self.BODY)
        assert feed(engine, clock, gpu5(power_w=690, power_limit_w=700)) == []
        assert feed(engine, clock, gpu5(power_w=710, power_limit_w=700)) == OPENED
        cond = engine.get("test.field", GPU5)
        assert cond is not None
        assert cond.message.endswith("(power_w 710 > power_limit_w 700)")
        assert cond.evidence["other"] == "power_limit_w" and cond.evidence["other_value"] == 700
        assert feed(engine, clock, gpu5(power_w=700, power_limit_w=700)) == RESOLVED

    def test_either_field_unset_never_judges(self) -> None:
        """An absent field on either side is unknown: it neither opens nor resolves."""
        engine, clock = engine_for(self.BODY)
        assert feed(engine, clock, gpu5(power_w=710, power_limit_w=None)) == []
        assert feed(engine, clock, gpu5(power_w=710, power_limit_w=700)) == OPENED
        assert feed(engine, clock, gpu5(power_w=None, power_limit_w=700)) == []
        assert feed(engine, clock, gpu5(power_w=600, power_limit_w=None)) == []
        assert engine.get("test.field", GPU5) is not None
        assert feed(engine, clock, gpu5(power_w=600, power_limit_w=700)) == RESOLVED


class TestGuard:
    BODY = (
        "kind: gpu_field\nfield: sm_clock_mhz\nop: '<'\nthreshold: 1200\n"
        "when: {field: utilization_gpu_pct, op: '>=', threshold: 50}\nresolve_after: 1\n"
    )

    def test_judges_only_while_the_guard_holds(self) -> None:
        """A low clock opens only under load; idle says nothing (the condition stays); busy and fast resolves."""
        engine, clock = engine_for(self.BODY)
        assert feed(engine, clock, gpu5(sm_clock_mhz=300, utilization_gpu_pct=0)) == []  # idle: clocks drop
        assert feed(engine, clock, gpu5(sm_clock_mhz=900, utilization_gpu_pct=97)) == OPENED
        cond = engine.get("test.field", GPU5)
        assert cond is not None and cond.evidence["when"] == "utilization_gpu_pct 97 >= 50"
        assert cond.message.endswith("(sm_clock_mhz 900 < 1200 while utilization_gpu_pct 97 >= 50)")
        assert feed(engine, clock, gpu5(sm_clock_mhz=1980, utilization_gpu_pct=0)) == []  # idle: no verdict
        assert engine.get("test.field", GPU5) is not None
        assert feed(engine, clock, gpu5(sm_clock_mhz=1980, utilization_gpu_pct=80)) == RESOLVED

    def test_an_unset_guard_field_never_judges(self) -> None:
        """A guard on a field the GPU does not report holds for nothing, even where 0 would satisfy it."""
        engine, clock = engine_for(self.BODY.replace("op: '>='", "op: '<='"))  # 0 <= 50 would hold
        assert feed(engine, clock, gpu5(sm_clock_mhz=900, utilization_gpu_pct=None)) == []
        assert feed(engine, clock, gpu5(sm_clock_mhz=900, utilization_gpu_pct=10)) == OPENED


class TestUnset:
    def test_an_absent_optional_field_never_judges(self) -> None:
        """temperature_c < 10: an absent temperature reads 0 but opens nothing and resolves nothing."""
        engine, clock = engine_for("kind: gpu_field\nfield: temperature_c\nop: '<'\nthreshold: 10C\nresolve_after: 1\n")
        assert feed(engine, clock, gpu5(temperature_c=None)) == []
        assert feed(engine, clock, gpu5(temperature_c=5)) == OPENED
        assert feed(engine, clock, gpu5(temperature_c=None)) == []
        assert feed(engine, clock, gpu5(temperature_c=40)) == RESOLVED

    def test_a_nic_value_not_read_never_judges(self) -> None:
        """NicSample has no optional fields; the agent leaves what it could not read at 0."""
        engine, clock = engine_for("kind: nic_field\nfield: rate_gbps\nop: '<'\nthreshold: 200Gb/s\nresolve_after: 1\n")

        def rate(value: float):
            def edit(r: tpb.Report) -> None:
                r.nics[5].rate_gbps = value

            return edit

        assert feed(engine, clock, rate(0)) == []
        assert feed(engine, clock, rate(100)) == OPENED
        cond = engine.get("test.field", NIC5)
        assert cond is not None and cond.component_type == "nic"
        assert cond.message == f"{NIC5} (mlx5_5/1, ibp5): a field rule (rate_gbps 100 < 200Gb/s)"
        assert cond.evidence["rdma_device"] == "mlx5_5" and cond.evidence["state"] == "ACTIVE"
        assert feed(engine, clock, rate(0)) == []
        assert feed(engine, clock, rate(400)) == RESOLVED


LOW_CLOCK = "kind: gpu_field\nfield: sm_clock_mhz\nop: '<'\nthreshold: 1\n"


class TestLoadErrors:
    @pytest.mark.parametrize(
        ("body", "expected"),
        [
            (
                "kind: gpu_field\nfield: pcie_link_widht\nop: '<'\nthreshold: 16",
                "'field': unknown GpuSample field 'pcie_link_widht' (expected one of temperature_c, power_w,",
            ),
            (
                "kind: gpu_field\nfield: uuid\nop: '=='\nthreshold: 1",
                "'field': GpuSample.uuid is not a number or a flag",
            ),
            ("kind: nic_field\nfield: temperature_c\nop: '>'\nthreshold: 1", "'field': unknown NicSample field"),
            ("kind: gpu_field\nfield: temperature_c\nop: '=>'\nthreshold: 1", "'op': unknown value '=>' (expected"),
            ("kind: gpu_field\nfield: temperature_c\nthreshold: 1", "missing key 'op' (required by kind 'gpu_field')"),
            (
                "kind: gpu_field\nfield: temperature_c\nop: '>'",
                "needs 'threshold' (a value) or 'other' (a field) to compare temperature_c with",
            ),
            (
                "kind: gpu_field\nfield: power_w\nop: '>'\nthreshold: 1\nother: power_limit_w",
                "'threshold' and 'other' are exclusive: pick one",
            ),
            (
                "kind: gpu_field\nfield: temperature_c\nop: '>'\nthreshold: 10GiB",
                "'threshold': '10GiB' is a bytes, expected a count like '3' or a temperature like '85C'",
            ),
            (
                "kind: gpu_field\nfield: remap_pending\nop: '<'\nthreshold: true",
                "'op': remap_pending is true or false: compare it with == or !=, not <",
            ),
            (
                "kind: gpu_field\nfield: remap_pending\nop: '=='\nthreshold: 1",
                "'threshold': remap_pending is true or false, got 1",
            ),
            (
                "kind: gpu_field\nfield: temperature_c\nop: '>'\nthreshold: true",
                "'threshold': temperature_c is a number",
            ),
            (
                "kind: gpu_field\nfield: remap_pending\nop: '=='\nother: temperature_c",
                "'other': remap_pending and temperature_c do not compare",
            ),
            ("kind: gpu_field\nfield: power_w\nop: '>'\nother: power_w", "'other': compares power_w with itself"),
            (
                LOW_CLOCK + "when: {field: util, op: '>', threshold: 1}",
                "'when': 'field': unknown GpuSample field 'util'",
            ),
            (
                LOW_CLOCK + "when: {field: utilization_gpu_pct}",
                "'when': missing key 'op'",
            ),
            (
                LOW_CLOCK + "when: {field: utilization_gpu_pct, op: '>'}",
                "'when': needs 'threshold' (a value) or 'other' (a field)",
            ),
            (
                LOW_CLOCK + "when: {field: utilization_gpu_pct, op: '>', value: 1}",
                "'when': unknown key 'value' (expected field, op, threshold, other)",
            ),
            (
                "kind: gpu_field\nfield: sm_clock_mhz\nop: '<'\nthreshold: [1]",
                "'threshold': expected a number, a quantity",
            ),
        ],
    )
    def test_errors_name_the_file_rule_and_key(self, tmp_path: Path, body: str, expected: str) -> None:
        """Every problem is refused at load, on one line naming the file, the rule and the key."""
        path = tmp_path / "rules.yaml"
        head = 'description: "d"\ncategory: gpu\nseverity: warning\naction: investigate\n'
        path.write_text("version: 1\nrules:\n  - id: x\n" + textwrap.indent(head + body + "\n", "    "))
        with pytest.raises(RulesError) as info:
            load_rules(path)
        assert any(e.startswith(f"{path}: rules[0] (id 'x'): {expected}") for e in info.value.errors), info.value.errors


def _gpu_sample_with_pcie():
    """GpuSample as it will be once the proto carries the PCIe link fields (a message built here)."""
    fdp = descriptor_pb2.FileDescriptorProto(name="pcie_test.proto", package="pcietest", syntax="proto3")
    msg = fdp.message_type.add(name="GpuSample")
    fields = (("index", 13), ("pcie_link_width", 13), ("pcie_link_width_max", 13), ("utilization_gpu_pct", 1))
    for number, (name, ftype) in enumerate(fields, start=1):
        f = msg.field.add(name=name, number=number, type=ftype, label=1)
        if name != "index":  # proto3 `optional`: a synthetic oneof per field
            f.proto3_optional = True
            f.oneof_index = len(msg.oneof_decl)
            msg.oneof_decl.add(name=f"_{name}")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("pcietest.GpuSample"))


class TestExpressible:
    def test_the_pcie_rule_reads_fields_from_the_descriptor(self) -> None:
        """`pcie_link_width < pcie_link_width_max` while busy compiles as soon as the message has the fields."""
        desc = _gpu_sample_with_pcie().DESCRIPTOR
        known = comparable_fields(desc)
        assert set(known) == {"pcie_link_width", "pcie_link_width_max", "utilization_gpu_pct"}
        params = field_params(desc)
        raw = {"field": "pcie_link_width", "op": "<", "other": "pcie_link_width_max"}
        raw["when"] = {"field": "utilization_gpu_pct", "op": ">=", "threshold": "50%"}
        parsed = {key: params[key].parse(value) for key, value in raw.items()}
        errors: list[str] = []
        spec = compile_spec(parsed, known, "r", errors).spec
        assert errors == [] and isinstance(spec, FieldSpec)
        assert spec.fields() == ("pcie_link_width", "pcie_link_width_max", "utilization_gpu_pct")
        assert spec.test.compare(8, 16) and not spec.test.compare(16, 16)
        assert spec.guard is not None and spec.guard.value == 50.0
        real = field_params(tpb.GpuSample.DESCRIPTOR)["field"]  # the proto carries the fields now (gpu.pcie_*)
        assert real.parse("pcie_link_width") == "pcie_link_width"
        with pytest.raises(BadValue, match="unknown GpuSample field 'pcie_lane_count'"):
            real.parse("pcie_lane_count")

    def test_defaults_compile(self) -> None:
        """The packaged rules use both field kinds, each compiled at load."""
        loaded = load_rules()
        for kind in ("gpu_field", "nic_field"):
            assert loaded.by_kind[kind] and all(isinstance(r.spec, FieldSpec) for r in loaded.by_kind[kind])


def test_a_quiet_gpu_is_asked_only_by_rules_without_a_wake() -> None:
    """A kind with a rule that looks at every GPU (a field against another) and a rule with a
    wake runs the latter only where its field is set or something is open on the node: the
    verdicts are those of asking every rule about every GPU."""
    doc = (
        "version: 1\nrules:\n"
        "  - {id: t.wake, description: d, category: gpu, severity: warning, action: investigate,"
        " kind: gpu_field, field: remap_pending, op: '==', threshold: true}\n"
        "  - {id: t.always, description: d, category: gpu, severity: warning, action: investigate,"
        " kind: gpu_field, field: pcie_link_width, op: '<', other: pcie_link_width_max}\n"
    )
    clock = FakeClock(1_000_000)
    engine = ConditionEngine(parse_rules(doc, "test"), clock=clock)

    def narrow(r: tpb.Report) -> None:
        for g in r.gpus:
            g.pcie_link_width, g.pcie_link_width_max = 16, 16
        r.gpus[5].pcie_link_width = 8

    def pending(r: tpb.Report) -> None:
        narrow(r)
        r.gpus[2].remap_pending = True

    assert feed(engine, clock, narrow) == [("opened", "t.always")]  # quiet GPUs: the always-asked rule
    assert feed(engine, clock, pending) == [("opened", "t.wake")]  # a wake field set: its rule is asked
    # a condition open on the node: every rule is asked, so GPU 2 resolves once its field is clear
    resolved = []
    for _ in range(3):
        resolved += feed(engine, clock, narrow)
    assert resolved == [("resolved", "t.wake")]
    assert engine.get("t.always", GPU5) is not None and engine.get("t.wake", f"{NODE}/gpu-2") is None


def test_a_quiet_gpus_unchanged_fields_are_not_asked_again_yet_a_guard_that_comes_to_hold_is_heard() -> None:
    """Per change, not per report: a GPU whose tested fields are those every test failed on is
    skipped; but a test that holds while its guard does not is asked again on the next report
    (the guard may hold then with the very same fields), and a changed field is asked at once."""
    doc = (
        "version: 1\nrules:\n"
        "  - {id: t.slow, description: d, category: gpu, severity: warning, action: investigate,"
        " kind: gpu_field, field: pcie_link_gen, op: '<', other: pcie_link_gen_max,"
        " when: {field: utilization_gpu_pct, op: '>=', threshold: '50%'}}\n"
    )
    clock = FakeClock(1_000_000)
    engine = ConditionEngine(parse_rules(doc, "test"), clock=clock)

    def link(gen: int, util: float):
        def edit(r: tpb.Report) -> None:
            for g in r.gpus:
                g.pcie_link_gen, g.pcie_link_gen_max, g.utilization_gpu_pct = 5, 5, 95.0
            r.gpus[5].pcie_link_gen, r.gpus[5].utilization_gpu_pct = gen, util

        return edit

    assert feed(engine, clock, link(5, 95.0)) == []
    assert feed(engine, clock, link(5, 95.0)) == []  # same fields, every test failed: skipped
    assert feed(engine, clock, link(3, 10.0)) == []  # slower, but idle: the guard does not hold
    assert feed(engine, clock, link(3, 95.0)) == [("opened", "t.slow")]  # same link, now busy
