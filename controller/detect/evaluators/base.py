"""What a rule kind is: an evaluator class, and the families the engine calls them in.

An evaluator is one rule kind, whole: its name (``kind``), its parameters (``params``,
checked when the rules file loads, with ``prepare`` for checks across parameters), the
sample fields it reads (``reads``, and for per-GPU kinds ``wake``), and what it judges
(one method per family, which says ``bad`` or ``good`` through the engine's ``Judge``),
and what a matching event does to its rules (``event``: by default a state kind's
condition opened early, held until a report confirms it; the event kind counts and holds).

The engine (controller.detect.conditions) composes the condition lifecycle (the ``Judge``),
the naming (``Names``), event intake and the per-report fast path, and builds that path
from these declarations: the one read per GPU or NIC port
holds every field an evaluator declares, and a per-GPU evaluator that declares no ``wake``
is asked about every GPU. So a new evaluator cannot be left off the fast path by hand.

Families (where and how often the engine asks):

- ``GpuEvaluator``: each GPU sample, when one of its ``wake`` fields is set or a condition
  is open on the GPU (always, when it declares no ``wake``);
- ``LinkStateEvaluator`` / ``LinkCounterEvaluator``: each GPU's NVLinks as of this report
  (``controller.detect.view``): states when a link is down or a condition is open on the
  GPU, counters when the GPU's counters are due (``defaults.counter_interval``);
- ``GpuSetEvaluator``: the report's GPUs against the inventory, once per report;
  ``NicSetEvaluator``: the report's RDMA ports against the inventory, once per report;
- ``NicEvaluator``: the report's NIC ports, named and read, once per report;
  ``NicCounterEvaluator``: each port's counter rates when due;
- ``SwitchPortEvaluator``, ``HostEvaluator``: each switch port, the host sample;
- ``EventEvaluator``: a kind that only events open (``accepts`` filters them; it holds
  and counts them in its ``event``); ``PresenceEvaluator``: a node going silent or coming back.

Every kind is asked about the events its rules match (``Evaluator.event``), whatever its
family: event intake (controller.detect.intake) names the component and hands over an
``EventHit``; no engine code knows a kind.

An evaluator instance belongs to one engine and holds that engine's rules of its kind.
It never raises on a sample: an absent (unsupported) field is neither bad nor good.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from controller.detect.evaluators.event_text import event_evidence, event_message
from controller.detect.evaluators.params import Param
from controller.detect.model import ComponentType, Condition, Defaults, Rule
from controller.detect.nvlinks import Links
from controller.detect.rates import CounterRate, RateSample
from controller.ingest.registry import NodeRecord
from starpulse.v1 import telemetry_pb2 as tpb

Owned = Mapping[tuple[str, str], Any] | None  # the node's open conditions by (rule, component), or None
# A NIC port of a report: (component, "mlx5_3/1", sample, the engine's read of it, on a rail)
NicPort = tuple[str, str, tpb.NicSample, tuple[Any, ...], bool]


@dataclass(frozen=True, slots=True)
class EventHit:
    """One event as event intake hands it to the kinds whose rules it matches."""

    owner: str  # the node that sent it (its conditions are that node's)
    component: str  # the fabric name of what it is about
    ctype: ComponentType
    node: str | None  # the compute node it is about (None: a switch's)
    event: tpb.Event
    count: int  # occurrences it stands for (an agent's storm summary carries 'suppressed')
    severity: int  # 0 info .. 3 fatal (unspecified reads as a warning)


class Judge(Protocol):
    """What an evaluator may tell the engine; the engine decides what that does to a condition."""

    def bad(
        self,
        rule: Rule,
        comp: str,
        ctype: ComponentType,
        node: str | None,
        owner: str,
        message: str,
        evidence: dict[str, Any],
        now: int,
        *,
        action: str | None = None,
        severity: str | None = None,
        window: tuple[str, tuple[str, ...]] | None = None,
    ) -> None:
        """The component is in the rule's bad state. ``window``: (entity, counters) of a count
        rule, which resolves when those counters' window empties rather than on good reports."""

    def good(self, owned: Owned, rule: Rule, comp: str, now: int) -> None:
        """The component is in the rule's good state (resolves after ``resolve_after`` in a row)."""

    def clear(self, rule: Rule, comp: str, now: int, reason: str) -> None:
        """The bad state is over for certain (a silent node is heard again): resolve now."""

    def repeat_event(self, rule: Rule, hit: EventHit, now: int, *, stamp: bool) -> bool:
        """Another matching event on the open condition of (rule, hit.component): count it
        (``stamp``: note its time in the evidence). False when none is open."""

    def open_event(
        self,
        rule: Rule,
        hit: EventHit,
        message: str,
        evidence: dict[str, Any],
        count: int,
        now: int,
        *,
        windowed: bool = False,
    ) -> Condition:
        """Open a condition from an event: held for ``hold`` unless a report confirms it, or
        (``windowed``) active until the rule's event window (``Windows``) empties."""


class Names(Protocol):
    """How the engine names what evaluators judge."""

    def nic_evidence(self, comp: str, s: tpb.NicSample, **extra: Any) -> dict[str, Any]:
        """A NIC condition's evidence: the port, and its leaf and leaf port when the fabric knows."""

    def port_component(self, switch: str, port: str) -> tuple[str, ComponentType, str | None]:
        """(component, type, peer) of a switch port: its cable when the fabric knows the peer."""


class Windows(Protocol):
    """The engine's event windows (counted event rules), keyed (node, rule, component)."""

    def add(self, owner: str, rule: Rule, comp: str, n: int, now: int) -> int:
        """Count ``n`` occurrences now; returns the occurrences inside the rule's window."""


@dataclass(frozen=True, slots=True)
class Setup:
    """What an evaluator is built with: the engine's judge and how the engine reads samples."""

    judge: Judge
    names: Names
    windows: Windows
    defaults: Defaults
    rates: CounterRate
    gpu_fields: Mapping[str, int]  # GpuSample field -> its position in the engine's one read per GPU
    nic_fields: Mapping[str, int]  # NicSample field -> its position in the one read per port


@dataclass(frozen=True, slots=True)
class Derived:
    """What a kind precomputes on the Rule at load (controller.detect.model.Rule)."""

    threshold: float = 0.0
    threshold_is_rate: bool = False
    window_s: float = 0.0
    counter_keys: tuple[str, ...] = ()
    spec: Any = None


class Evaluator:
    """One rule kind. Subclass a family, set ``kind`` and ``params``, and list it in the registry."""

    kind: ClassVar[str]
    params: ClassVar[Mapping[str, Param]] = {}

    @classmethod
    def prepare(cls, params: dict[str, Any], defaults: Defaults, where: str, errors: list[str]) -> Derived:
        """Checks across parameters (append one line per problem, prefixed ``where``) and what
        the Rule precomputes. Called only for a rule whose parameters each parsed."""
        return Derived()

    @classmethod
    def reads(cls, rule: Rule) -> tuple[str, ...]:
        """The fields of its family's sample (GpuSample, NvLinkSample, NicSample) one rule reads:
        the engine reads them once per sample, for all kinds together."""
        return ()

    def __init__(self, rules: tuple[Rule, ...], setup: Setup) -> None:
        self.rules = rules
        self.judge = setup.judge
        self.names = setup.names
        self.windows = setup.windows

    def bad_on(
        self,
        nid: str,
        rule: Rule,
        comp: str,
        ctype: ComponentType,
        message: str,
        evidence: dict[str, Any],
        now: int,
        **kw: Any,
    ) -> None:
        """``Judge.bad`` for a component of node ``nid`` that its own reports drive (most kinds)."""
        self.judge.bad(rule, comp, ctype, nid, nid, message, evidence, now, **kw)

    def event(self, rule: Rule, hit: EventHit, now: int) -> None:
        """A matching event for ``rule`` (its ``events:``). A state kind's condition opens early
        and is held until a report confirms it; info events (restored, admin down) never open."""
        if hit.severity <= 0:
            return
        if self.judge.repeat_event(rule, hit, now, stamp=False):
            return
        cond = self.judge.open_event(
            rule, hit, event_message(hit.component, hit.event), event_evidence(hit.event, hit.count), hit.count, now
        )
        self.opened_by_event(rule, cond, hit.event)

    def opened_by_event(self, rule: Rule, cond: Condition, ev: tpb.Event) -> None:
        """An event opened ``rule``'s condition before a report confirmed it: adjust it from the
        event (most kinds take the rule's action and severity as they are)."""


class GpuEvaluator(Evaluator, ABC):
    """Judges each GPU sample. ``state`` is the engine's one read of the sample's fields."""

    # A lost GPU ("GPU is lost") has nothing else readable: only kinds that judge the lost GPU
    # itself are asked about it.
    judges_lost_gpus: ClassVar[bool] = False

    @classmethod
    def wake(cls, rule: Rule) -> Mapping[str, int] | None:
        """Integer or bool fields, each with a bit mask, such that the rule has nothing to say
        about a GPU whose fields are all zero under their masks while no condition is open on
        it (the healthy GPU, skipped at the cost of one read). None: ask about every GPU."""
        return None

    @abstractmethod
    def gpu(self, nid: str, comp: str, g: tpb.GpuSample, state: tuple[Any, ...], now: int, owned: Owned) -> None:
        """Judge one GPU (``comp``) of node ``nid``; ``state[setup.gpu_fields[f]]`` is field f."""


class LinkStateEvaluator(Evaluator, ABC):
    """Judges a GPU's NVLink states; asked when a link is down or a condition is open on the GPU."""

    @abstractmethod
    def links(self, nid: str, comp: str, view: Links, now: int, owned: Owned) -> None:
        """Judge GPU ``comp``'s links as of this report (a delta report's laid over its base)."""


class LinkCounterEvaluator(Evaluator, ABC):
    """Judges a GPU's NVLink error counters; asked when the GPU's counters are due.

    ``reads`` names the NvLinkSample counters; the engine reads each once per link and turns
    them into rates under the names ``nvlink-<position>/<counter>``."""

    @abstractmethod
    def link_counters(
        self, nid: str, comp: str, view: Links, samples: Mapping[str, RateSample] | None, now: int, owned: Owned
    ) -> None:
        """``samples``: the counters that moved since the last read (None: none moved)."""


class GpuSetEvaluator(Evaluator, ABC):
    """Judges a report's GPUs together against the node's inventory, once per report."""

    @abstractmethod
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
        """``indices``: the inventory's GPU indices, ``names`` their components; ``seen``: the
        indices in the report (None: not gathered, read ``report.gpus``)."""


class NicSetEvaluator(Evaluator, ABC):
    """Judges a report's RDMA ports together against the node's inventory, once per report."""

    @abstractmethod
    def nic_set(self, nid: str, inventory: Mapping[str, str], report: tpb.Report, now: int, owned: Owned) -> None:
        """``inventory``: the inventory's ports ("mlx5_0/1") and their components; the report's
        ports are ``report.nics`` (a delta report carries every port, only its counters sparse)."""


class NicEvaluator(Evaluator, ABC):
    """Judges a report's NIC ports, once per report (``state`` in each port is the engine's
    one read of the port's fields, ``setup.nic_fields`` their positions)."""

    @abstractmethod
    def nics(self, nid: str, ports: list[NicPort], now: int, owned: Owned) -> None:
        """Judge node ``nid``'s ports, named and read."""


class NicCounterEvaluator(Evaluator, ABC):
    """Judges each NIC port's counter rates, when the port's counters are due."""

    @classmethod
    def counters(cls, rule: Rule) -> tuple[str, ...]:
        """The "source/counter" entries one rule reads (the engine reads each once per port)."""
        return rule.counter_keys

    @abstractmethod
    def nic_counters(
        self, nid: str, comp: str, s: tpb.NicSample, samples: Mapping[str, RateSample] | None, now: int, owned: Owned
    ) -> None:
        """``samples``: the counters that moved since the last read (None: none moved)."""


class SwitchPortEvaluator(Evaluator, ABC):
    """Judges each port of a switch's report."""

    @abstractmethod
    def port(self, nid: str, p: tpb.SwitchPortSample, now: int, owned: Owned) -> None:
        """Judge port ``p`` of switch ``nid``."""


class HostEvaluator(Evaluator, ABC):
    """Judges a compute node's host sample."""

    @abstractmethod
    def host(self, nid: str, h: tpb.HostSample, now: int, owned: Owned) -> None:
        """Judge node ``nid``'s host sample."""


class EventEvaluator(Evaluator, ABC):
    """A kind only events open: ``accepts`` filters them, and its ``event`` holds or counts them
    (through the ``Judge`` and the ``Windows``); the lifecycle keeps what it opens."""

    @abstractmethod
    def accepts(self, rule: Rule, severity: int, action: str = "") -> bool:
        """Whether a matching event of this severity (0 info .. 3 fatal) and recommended
        ``action`` (the agent's, from the vendor's catalog) counts for the rule."""


class PresenceEvaluator(Evaluator, ABC):
    """Judges presence: a node of its role going unreachable, or back online."""

    switches: ClassVar[bool] = False  # True: switch-role nodes; False: compute nodes

    @abstractmethod
    def presence(self, node: NodeRecord, old: str, new: str, now: int) -> None:
        """Node ``node`` went from presence ``old`` to ``new``."""


class DuplicateKind(ValueError):
    """Two evaluators in one registry claim the same kind."""


FAMILIES: tuple[type[Evaluator], ...] = (
    GpuEvaluator,
    LinkStateEvaluator,
    LinkCounterEvaluator,
    GpuSetEvaluator,
    NicSetEvaluator,
    NicEvaluator,
    NicCounterEvaluator,
    SwitchPortEvaluator,
    HostEvaluator,
    EventEvaluator,
    PresenceEvaluator,
)


class Registry:
    """The rule kinds, in order: the order of the rules file's error texts and of evaluation."""

    def __init__(self, evaluators: Iterable[type[Evaluator]]) -> None:
        by_kind: dict[str, type[Evaluator]] = {}
        for cls in evaluators:
            if not issubclass(cls, FAMILIES):
                raise TypeError(
                    f"evaluator {cls.__name__} is of no family the engine calls (controller.detect.evaluators.base)"
                )
            first = by_kind.get(cls.kind)
            if first is not None:
                raise DuplicateKind(f"rule kind {cls.kind!r} is registered twice: {first.__name__} and {cls.__name__}")
            by_kind[cls.kind] = cls
        self._by_kind = by_kind

    def __iter__(self) -> Iterator[type[Evaluator]]:
        return iter(self._by_kind.values())

    def __len__(self) -> int:
        return len(self._by_kind)

    def get(self, kind: str) -> type[Evaluator] | None:
        return self._by_kind.get(kind)

    def kinds(self) -> tuple[str, ...]:
        return tuple(self._by_kind)

    def params(self) -> dict[str, Mapping[str, Param]]:
        """kind -> its parameters, in registry order."""
        return {kind: cls.params for kind, cls in self._by_kind.items()}
