"""The generic field kinds: a sample field compared with a threshold or with another field.

Most new GPU or NIC checks are a comparison of what the agent already reports, so they
are YAML only::

    - id: gpu.pcie_link_narrow
      kind: gpu_field
      field: pcie_link_width
      op: "<"                        # <, <=, >, >=, ==, != (quote it: YAML reads a bare > as a folded block)
      other: pcie_link_width_max     # or threshold: a number, a quantity in the field's unit
                                     # ("85C", "50%", "10GiB", "400Gb/s"), or true/false for a flag
      when: {field: utilization_gpu_pct, op: ">=", threshold: 50}   # optional: judge only while it holds

The fields are the sample message's own (``GpuSample``, ``NicSample``: numbers and flags,
read from the protobuf descriptor), so a field added to the proto can be used at once; a
name that is not one of them is refused when the file loads. A threshold's unit follows
the field's name (``_c`` a temperature, ``_pct`` a percentage, ``_bytes`` a size,
``_gbps`` a bandwidth, ``_dbm`` an optical power, ``_s`` a duration); a bare number is
in the field's own unit.

A field that is unset never judges: an ``optional`` field the sample does not carry (the
driver does not support it), or a number without presence at zero (how the agent leaves a
NIC value it could not read; NicSample has no optional fields). A guard (``when``) that
does not hold leaves the condition as it is, neither bad nor good: a GPU drops its PCIe
generation when idle, so an idle GPU says nothing about its link. A lost GPU is judged by
``gpu_flag`` alone (nothing else on it was readable).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from operator import eq, ge, gt, itemgetter, le, lt, ne
from typing import Any, ClassVar

from google.protobuf.descriptor import FieldDescriptor

from controller.detect.evaluators.base import Derived, GpuEvaluator, NicEvaluator, NicPort, Owned, Setup
from controller.detect.evaluators.params import EVENTS, Param, one_of
from controller.detect.model import Defaults, Rule
from starpulse.core.units import BadValue, parse_quantity
from starpulse.v1 import telemetry_pb2 as tpb

OPS: dict[str, Callable[[Any, Any], bool]] = {"<": lt, "<=": le, ">": gt, ">=": ge, "==": eq, "!=": ne}
_IDENTITY = frozenset({"index", "port"})  # which GPU / port a sample is, not a reading
_INTEGERS = frozenset(
    {
        FieldDescriptor.CPPTYPE_INT32,
        FieldDescriptor.CPPTYPE_INT64,
        FieldDescriptor.CPPTYPE_UINT32,
        FieldDescriptor.CPPTYPE_UINT64,
    }
)
_FLOATS = frozenset({FieldDescriptor.CPPTYPE_DOUBLE, FieldDescriptor.CPPTYPE_FLOAT})
# field name suffix -> the quantity a threshold may be written in (its canonical unit is the field's)
_UNIT_SUFFIXES = (
    ("_c", "temperature"),
    ("_pct", "percent"),
    ("_bytes", "bytes"),
    ("_gbps", "bandwidth"),
    ("_dbm", "power_dbm"),
    ("_s", "time"),
)


@dataclass(frozen=True, slots=True)
class FieldInfo:
    """What the loader and the engine need to know about one comparable field."""

    name: str
    flag: bool  # true/false: compared with == and != only
    integer: bool  # an integer or a flag (a fast-path mask applies to it)
    presence: bool  # proto ``optional``: absent means unsupported
    dimensions: tuple[str, ...]  # how a threshold may be written ("count" is a bare number)


def comparable_fields(desc: Any) -> dict[str, FieldInfo]:
    """The numbers and flags of a sample message, by name, in proto order."""
    out: dict[str, FieldInfo] = {}
    for f in desc.fields:
        if f.is_repeated or f.message_type is not None or f.name in _IDENTITY:
            continue
        flag = f.cpp_type == FieldDescriptor.CPPTYPE_BOOL
        if not (flag or f.cpp_type in _INTEGERS or f.cpp_type in _FLOATS):
            continue  # strings and enums are not compared
        units = tuple(dim for suffix, dim in _UNIT_SUFFIXES if f.name.endswith(suffix))[:1]
        out[f.name] = FieldInfo(f.name, flag, flag or f.cpp_type in _INTEGERS, f.has_presence, ("count", *units))
    return out


@dataclass(frozen=True, slots=True)
class FieldTest:
    """``field op value`` or ``field op other``, ready to run."""

    field: str
    op: str
    compare: Callable[[Any, Any], bool]
    value: Any  # the constant right-hand side, in the field's unit (None with ``other``)
    other: str | None
    text: str  # the right-hand side as written

    def fields(self) -> tuple[str, ...]:
        return (self.field,) if self.other is None else (self.field, self.other)

    def describe(self, value: Any, rhs: Any) -> str:
        """ "pcie_link_width 8 < pcie_link_width_max 16", "temperature_c 91 >= 85C", "remap_pending is true"."""
        if isinstance(value, bool) and self.other is None:
            return f"{self.field} is {_show(value)}"
        right = f"{self.other} {_show(rhs)}" if self.other is not None else self.text
        return f"{self.field} {_show(value)} {self.op} {right}"


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """A field rule compiled at load: its test and optional guard (``Rule.spec``)."""

    test: FieldTest
    guard: FieldTest | None

    def fields(self) -> tuple[str, ...]:
        both = self.test.fields() + (self.guard.fields() if self.guard is not None else ())
        return tuple(dict.fromkeys(both))


def field_params(desc: Any) -> dict[str, Param]:
    """A field kind's parameters; field names are checked against the message's own."""
    field = _field_of(comparable_fields(desc), desc)
    return {
        "field": Param(field, required=True),
        "op": Param(one_of(tuple(OPS)), required=True),
        "threshold": Param(_operand),
        "other": Param(field),
        "when": Param(_guard(field)),
        "events": EVENTS,
    }


def compile_spec(params: dict[str, Any], known: Mapping[str, FieldInfo], where: str, errors: list[str]) -> Derived:
    """The rule's test and guard, checked against the fields' types and units."""
    test = _compile(params, known, "", where, errors)
    guard = _compile(params["when"], known, "'when': ", where, errors) if "when" in params else None
    if test is None or ("when" in params and guard is None):
        return Derived()
    return Derived(spec=FieldSpec(test, guard))


def _field_of(known: Mapping[str, FieldInfo], desc: Any) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        if raw in known:
            return str(raw)
        if isinstance(raw, str) and raw in desc.fields_by_name:
            raise BadValue(f"{desc.name}.{raw} is not a number or a flag, it cannot be compared")
        raise BadValue(f"unknown {desc.name} field {raw!r} (expected one of {', '.join(known)})")

    return parse


def _operand(raw: Any) -> Any:
    """Checked against the field once the whole rule is read (``_compile``)."""
    if isinstance(raw, bool | int | float | str | Mapping):
        return raw
    raise BadValue(f"expected a number, a quantity like '85C' or true/false, got {raw!r}")


def _guard(field: Callable[[Any], str]) -> Callable[[Any], dict[str, Any]]:
    keys = ("field", "op", "threshold", "other")

    def parse(raw: Any) -> dict[str, Any]:
        if not isinstance(raw, Mapping):
            raise BadValue(
                f"expected a mapping like {{field: utilization_gpu_pct, op: '>=', threshold: 50}}, got {raw!r}"
            )
        unknown = [k for k in raw if k not in keys]
        if unknown:
            raise BadValue(f"unknown key {unknown[0]!r} (expected {', '.join(keys)})")
        for key in ("field", "op"):
            if key not in raw:
                raise BadValue(f"missing key {key!r}")
        parsers = {"field": field, "op": one_of(tuple(OPS)), "threshold": _operand, "other": field}
        return {key: _key(key, parsers[key], value) for key, value in raw.items()}

    return parse


def _key(key: str, parse: Callable[[Any], Any], value: Any) -> Any:
    try:
        return parse(value)
    except BadValue as bad:
        raise BadValue(f"{key!r}: {bad}") from None


def _compile(
    p: Mapping[str, Any], fields: Mapping[str, FieldInfo], prefix: str, where: str, errors: list[str]
) -> FieldTest | None:
    """One comparison from its parsed keys; None (with a line in ``errors``) when it makes no sense."""
    info = fields[p["field"]]
    op = p["op"]
    has_value, has_other = "threshold" in p, "other" in p
    if has_value and has_other:
        errors.append(f"{where}: {prefix}'threshold' and 'other' are exclusive: pick one")
        return None
    if not (has_value or has_other):
        errors.append(f"{where}: {prefix}needs 'threshold' (a value) or 'other' (a field) to compare {info.name} with")
        return None
    if info.flag and op not in ("==", "!="):
        errors.append(f"{where}: {prefix}'op': {info.name} is true or false: compare it with == or !=, not {op}")
        return None
    if has_other:
        other = fields[p["other"]]
        if other.name == info.name:
            errors.append(f"{where}: {prefix}'other': compares {info.name} with itself")
            return None
        if other.flag != info.flag:
            errors.append(
                f"{where}: {prefix}'other': {info.name} and {other.name} do not compare (a flag and a number)"
            )
            return None
        return FieldTest(info.name, op, OPS[op], None, other.name, other.name)
    raw = p["threshold"]
    if info.flag:
        if not isinstance(raw, bool):
            errors.append(f"{where}: {prefix}'threshold': {info.name} is true or false, got {raw!r}")
            return None
        return FieldTest(info.name, op, OPS[op], raw, None, _show(raw))
    try:
        if isinstance(raw, bool):
            raise BadValue(f"{info.name} is a number, got {raw!r}")
        q = parse_quantity(raw, info.dimensions)
    except BadValue as bad:
        errors.append(f"{where}: {prefix}'threshold': {bad}")
        return None
    return FieldTest(info.name, op, OPS[op], q.value, None, q.text)


@dataclass(frozen=True, slots=True)
class _Bound:
    """One field rule against the engine's read: positions instead of names."""

    rule: Rule
    test: FieldTest
    guard: FieldTest | None
    at: int
    other_at: int  # -1: the constant
    guard_at: int
    guard_other_at: int
    presence: tuple[str, ...]  # optional fields to ask HasField about before a verdict
    zero_unset: tuple[int, ...]  # positions of numbers without presence: 0 there means not read


def _bind(rules: tuple[Rule, ...], positions: Mapping[str, int], fields: Mapping[str, FieldInfo]) -> tuple[_Bound, ...]:
    def pos(name: str | None) -> int:
        return -1 if name is None else positions[name]

    out = []
    for rule in rules:
        spec: FieldSpec = rule.spec
        used = [fields[f] for f in spec.fields()]
        guard = spec.guard
        out.append(
            _Bound(
                rule,
                spec.test,
                guard,
                positions[spec.test.field],
                pos(spec.test.other),
                pos(guard.field) if guard is not None else -1,
                pos(guard.other) if guard is not None else -1,
                tuple(f.name for f in used if f.presence),
                tuple(positions[f.name] for f in used if not f.presence and not f.flag),
            )
        )
    return tuple(out)


def _known(b: _Bound, sample: Any, state: tuple[Any, ...]) -> bool:
    """Whether every field the rule compares is set (asked only before a verdict)."""
    for name in b.presence:
        if not sample.HasField(name):
            return False
    return all(state[at] for at in b.zero_unset)


def _guard_holds(b: _Bound, state: tuple[Any, ...]) -> bool:
    guard = b.guard
    if guard is None:
        return True
    return guard.compare(state[b.guard_at], guard.value if b.guard_other_at < 0 else state[b.guard_other_at])


def _evidence(b: _Bound, value: Any, rhs: Any, state: tuple[Any, ...]) -> tuple[str, dict[str, Any]]:
    test = b.test
    detail = test.describe(value, rhs)
    evidence: dict[str, Any] = {"field": test.field, "value": value, "op": test.op}
    if test.other is None:
        evidence["threshold"] = test.text
    else:
        evidence["other"], evidence["other_value"] = test.other, rhs
    guard = b.guard
    if guard is not None:
        g_rhs = guard.value if b.guard_other_at < 0 else state[b.guard_other_at]
        evidence["when"] = guard.describe(state[b.guard_at], g_rhs)
        detail += f" while {evidence['when']}"
    return detail, evidence


class _FieldKind:
    """What both field kinds share: their rules compile at load against ``known``."""

    known: ClassVar[dict[str, FieldInfo]]

    @classmethod
    def prepare(cls, params: dict[str, Any], defaults: Defaults, where: str, errors: list[str]) -> Derived:
        return compile_spec(params, cls.known, where, errors)

    @classmethod
    def reads(cls, rule: Rule) -> tuple[str, ...]:
        spec: FieldSpec = rule.spec
        return spec.fields()


class GpuField(_FieldKind, GpuEvaluator):
    """A GpuSample field compared with a threshold or another field."""

    kind = "gpu_field"
    known = comparable_fields(tpb.GpuSample.DESCRIPTOR)
    params = field_params(tpb.GpuSample.DESCRIPTOR)

    @classmethod
    def wake(cls, rule: Rule) -> Mapping[str, int] | None:
        """A constant test a zero can never fail (``remap_pending == true``, ``ecc_dbe_volatile > 0``)
        skips the healthy GPU; anything else (a float, another field) is asked about every GPU."""
        test: FieldTest = rule.spec.test
        if test.other is None and cls.known[test.field].integer and not test.compare(0, test.value):
            return {test.field: -1}
        return None

    def __init__(self, rules: tuple[Rule, ...], setup: Setup) -> None:
        super().__init__(rules, setup)
        self._bound = _bind(rules, setup.gpu_fields, self.known)
        # One rule without a wake (a PCIe width against its maximum) has this kind asked about
        # every GPU; its rules with a wake have nothing to say about a GPU whose wake field is
        # zero while nothing is open on the node, so there only the others are run. Why: on
        # every healthy GPU of every report, three of the five default rules were compared
        # for nothing (issue 31).
        self._always = tuple(b for b in self._bound if self.wake(b.rule) is None)
        self._woken_at = tuple(b.at for b in self._bound if self.wake(b.rule) is not None)
        # Per change, not per report: on such a GPU the others' verdict can only be "bad", and
        # only if a test holds; a test is a pure function of its fields, which (a link's width
        # and generation against their maxima) change rarely. So a GPU whose tested fields are
        # those of its last quiet report, where every test failed, is not asked again
        # (one C-level read and a tuple compare; a dict entry per GPU, the values shared).
        tested = sorted({at for b in self._always for at in (b.at, b.other_at) if at >= 0})
        self._tested = _positions_getter(tested)
        self._all_failed: dict[str, tuple[Any, ...]] = {}  # GPU -> tested fields when every test failed
        self._same: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # one tuple per distinct set of values

    def gpu(self, nid: str, comp: str, g: tpb.GpuSample, state: tuple[Any, ...], now: int, owned: Owned) -> None:
        if not owned and not any(map(state.__getitem__, self._woken_at)):
            self._quiet(nid, comp, g, state, now, owned)
            return
        self._all_failed.pop(comp, None)
        self._judge(self._bound, nid, comp, g, state, now, owned)

    def _quiet(self, nid: str, comp: str, g: tpb.GpuSample, state: tuple[Any, ...], now: int, owned: Owned) -> None:
        """A GPU with no wake field set and nothing open on its node: the rules without a wake only."""
        tested = self._tested(state)
        if self._all_failed.get(comp) == tested:
            return  # the same values every test failed on last time: the same answer
        if any(
            b.test.compare(state[b.at], b.test.value if b.other_at < 0 else state[b.other_at]) for b in self._always
        ):
            self._all_failed.pop(comp, None)
            self._judge(self._always, nid, comp, g, state, now, owned)
        else:
            same = self._same
            if len(same) < _MAX_SHARED:  # most GPUs share their values; a float field's would not
                tested = same.setdefault(tested, tested)
            self._all_failed[comp] = tested

    def _judge(
        self,
        bound: tuple[_Bound, ...],
        nid: str,
        comp: str,
        g: tpb.GpuSample,
        state: tuple[Any, ...],
        now: int,
        owned: Owned,
    ) -> None:
        for b in bound:
            test = b.test
            if b.guard is not None and not _guard_holds(b, state):
                continue  # the guard does not hold: neither bad nor good
            value = state[b.at]
            rhs = test.value if b.other_at < 0 else state[b.other_at]
            if test.compare(value, rhs):
                if _known(b, g, state):
                    detail, evidence = _evidence(b, value, rhs, state)
                    evidence["uuid"] = g.uuid
                    message = f"{comp}: {b.rule.description} ({detail})"
                    self.bad_on(nid, b.rule, comp, "gpu", message, evidence, now)
            elif owned and (b.rule.id, comp) in owned and _known(b, g, state):
                self.judge.good(owned, b.rule, comp, now)


_MAX_SHARED = 1024  # distinct tested values kept as one tuple each (GpuField)


def _positions_getter(positions: list[int]) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """itemgetter that always returns a tuple (itemgetter of one position returns the bare value)."""
    if len(positions) > 1:
        return itemgetter(*positions)
    if positions:
        one = positions[0]
        return lambda state: (state[one],)
    return lambda state: ()


class NicField(_FieldKind, NicEvaluator):
    """A NicSample field compared with a threshold or another field."""

    kind = "nic_field"
    known = comparable_fields(tpb.NicSample.DESCRIPTOR)
    params = field_params(tpb.NicSample.DESCRIPTOR)

    def __init__(self, rules: tuple[Rule, ...], setup: Setup) -> None:
        super().__init__(rules, setup)
        self._bound = _bind(rules, setup.nic_fields, self.known)

    def nics(self, nid: str, ports: list[NicPort], now: int, owned: Owned) -> None:
        judge = self.judge
        for b in self._bound:
            rule, guard, at, other_at = b.rule, b.guard, b.at, b.other_at
            compare, rhs = b.test.compare, b.test.value
            for port in ports:
                state = port[3]
                if guard is not None and not _guard_holds(b, state):
                    continue  # the guard does not hold: neither bad nor good
                value = state[at]
                if other_at >= 0:
                    rhs = state[other_at]
                if compare(value, rhs):
                    comp, local, s, _, _ = port
                    if _known(b, s, state):
                        detail, evidence = _evidence(b, value, rhs, state)
                        evidence = self.names.nic_evidence(comp, s, state=s.state, phys_state=s.phys_state, **evidence)
                        message = f"{comp} ({local}): {rule.description} ({detail})"
                        self.bad_on(nid, rule, comp, "nic", message, evidence, now)
                elif owned and (rule.id, port[0]) in owned and _known(b, port[2], state):
                    judge.good(owned, rule, port[0], now)


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
