"""The fast-path plan: which evaluators the report path asks where, and the one read per
sample that holds every field they declare.

Built once per engine from the rule kinds in use (controller.detect.evaluators.base):
per GPU one C-level read, the wake fields first (with their masks a healthy GPU is one
``any`` over them), ``lost``, then the other fields read; per NIC port one read, its
naming fields first; the NIC and NVLink counters the counter kinds read. A kind is placed
by its family, so a new kind of an existing family is on the fast path by construction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from controller.detect.evaluators.base import (
    Evaluator,
    GpuEvaluator,
    GpuSetEvaluator,
    HostEvaluator,
    Judge,
    LinkCounterEvaluator,
    LinkStateEvaluator,
    Names,
    NicCounterEvaluator,
    NicEvaluator,
    NicSetEvaluator,
    PresenceEvaluator,
    Setup,
    SwitchPortEvaluator,
    Windows,
)
from controller.detect.rates import CounterRate
from controller.detect.rules import RuleSet
from controller.detect.view import ReportView, tuple_getter
from starpulse.v1 import telemetry_pb2 as tpb

_NIC_NAMING = ("rdma_device", "port")  # the first fields of the one read per port: its name
_WAKE_TYPES = frozenset(
    {
        FieldDescriptor.CPPTYPE_BOOL,
        FieldDescriptor.CPPTYPE_INT32,
        FieldDescriptor.CPPTYPE_INT64,
        FieldDescriptor.CPPTYPE_UINT32,
        FieldDescriptor.CPPTYPE_UINT64,
    }
)


@dataclass(frozen=True, slots=True)
class Plan:
    """The evaluators of one engine (by kind) and, by family, where the report path asks them."""

    evaluators: Mapping[str, Evaluator]
    view: ReportView  # a delta report read as the full one it stands for, with the declared counters
    gpu_read: Callable[[Any], tuple[Any, ...]]  # the one read per GPU sample
    gpu_masks: tuple[int, ...]  # the wake masks, over the read's first fields
    lost_at: int  # the position of "lost" in the GPU read
    nic_read: Callable[[Any], tuple[Any, ...]]  # the one read per NIC port, its naming first
    gpu_pre: tuple[GpuEvaluator, ...]  # GPU kinds that judge a lost GPU too
    gpu_post: tuple[GpuEvaluator, ...]  # the others
    gpu_quiet: tuple[GpuEvaluator, ...]  # kinds without a wake: asked about every GPU
    link_state: tuple[LinkStateEvaluator, ...]
    link_counter: tuple[LinkCounterEvaluator, ...]
    gpu_sets: tuple[GpuSetEvaluator, ...]
    nic_ports: tuple[NicEvaluator, ...]
    nic_sets: tuple[NicSetEvaluator, ...]
    nic_counter: tuple[NicCounterEvaluator, ...]
    switch_port: tuple[SwitchPortEvaluator, ...]
    host: tuple[HostEvaluator, ...]
    presence_switch: tuple[PresenceEvaluator, ...]
    presence_compute: tuple[PresenceEvaluator, ...]


def build_plan(rules: RuleSet, *, judge: Judge, names: Names, windows: Windows, rates: CounterRate) -> Plan:
    """One evaluator per kind in use, grouped by where the report path asks it, and the reads
    per GPU and per NIC port that hold every field they declare."""
    present = [(cls, rules.by_kind.get(cls.kind, ())) for cls in rules.registry]
    present = [(cls, kind_rules) for cls, kind_rules in present if kind_rules]
    wake: dict[str, int] = {}
    gpu_reads: dict[str, None] = {}
    always: set[type[Evaluator]] = set()
    for cls, kind_rules in present:
        if issubclass(cls, GpuEvaluator):
            for rule in kind_rules:
                masks = cls.wake(rule)
                if masks is None:
                    always.add(cls)
                else:
                    for fld, mask in masks.items():
                        wake[fld] = wake.get(fld, 0) | mask
                gpu_reads.update(dict.fromkeys(cls.reads(rule)))
    wake["lost"] = -1  # a lost GPU is judged only by the kinds that judge it (judges_lost_gpus)
    gpu_layout = (*wake, *(f for f in gpu_reads if f not in wake))
    _check_fields("GPU fast path", tpb.GpuSample.DESCRIPTOR, gpu_layout, wake)
    nic_reads = dict.fromkeys(
        f for cls, krs in present if issubclass(cls, NicEvaluator) for rule in krs for f in cls.reads(rule)
    )
    nic_layout = (*_NIC_NAMING, *(f for f in nic_reads if f not in _NIC_NAMING))
    _check_fields("NIC fast path", tpb.NicSample.DESCRIPTOR, nic_layout, {})
    nic_counters = tuple(
        k for cls, krs in present if issubclass(cls, NicCounterEvaluator) for r in krs for k in cls.counters(r)
    )
    link_counters = tuple(
        c for cls, krs in present if issubclass(cls, LinkCounterEvaluator) for r in krs for c in cls.reads(r)
    )
    _check_fields("NVLink counters", tpb.NvLinkSample.DESCRIPTOR, link_counters, {})
    setup = Setup(
        judge=judge,
        names=names,
        windows=windows,
        defaults=rules.defaults,
        rates=rates,
        gpu_fields={f: i for i, f in enumerate(gpu_layout)},
        nic_fields={f: i for i, f in enumerate(nic_layout)},
    )
    evaluators = {cls.kind: cls(kind_rules, setup) for cls, kind_rules in present}
    evs = list(evaluators.values())
    gpu = [e for e in evs if isinstance(e, GpuEvaluator)]
    pre = tuple(e for e in gpu if e.judges_lost_gpus)
    post = tuple(e for e in gpu if not e.judges_lost_gpus)
    presence = [e for e in evs if isinstance(e, PresenceEvaluator)]
    return Plan(
        evaluators=evaluators,
        view=ReportView(nic_counters, link_counters),
        gpu_read=tuple_getter(*gpu_layout),
        gpu_masks=tuple(wake.values()),
        lost_at=setup.gpu_fields["lost"],
        nic_read=tuple_getter(*nic_layout),
        gpu_pre=pre,
        gpu_post=post,
        # a woken GPU (a wake field set, or a condition open on it) is asked by every GPU kind;
        # a quiet one only by the kinds without a wake (they must look at every GPU)
        gpu_quiet=tuple(e for e in (*pre, *post) if type(e) in always),
        link_state=tuple(e for e in evs if isinstance(e, LinkStateEvaluator)),
        link_counter=tuple(e for e in evs if isinstance(e, LinkCounterEvaluator)),
        gpu_sets=tuple(e for e in evs if isinstance(e, GpuSetEvaluator)),
        nic_ports=tuple(e for e in evs if isinstance(e, NicEvaluator)),
        nic_sets=tuple(e for e in evs if isinstance(e, NicSetEvaluator)),
        nic_counter=tuple(e for e in evs if isinstance(e, NicCounterEvaluator)),
        switch_port=tuple(e for e in evs if isinstance(e, SwitchPortEvaluator)),
        host=tuple(e for e in evs if isinstance(e, HostEvaluator)),
        presence_switch=tuple(e for e in presence if e.switches),
        presence_compute=tuple(e for e in presence if not e.switches),
    )


def _check_fields(what: str, desc: Any, names: Iterable[str], wake: Mapping[str, int]) -> None:
    """Evaluators declare fields by name: a name the message lacks, or a wake field that is
    not an integer or a flag, is a bug in an evaluator, found when the engine is built."""
    fields = desc.fields_by_name
    for name in names:
        f = fields.get(name)
        if f is None:
            raise ValueError(f"{what}: an evaluator reads {name!r}, which {desc.name} does not have")
        if name in wake and f.cpp_type not in _WAKE_TYPES:
            raise ValueError(f"{what}: {desc.name}.{name} is not an integer or a flag, so it cannot wake a GPU")
