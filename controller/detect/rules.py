"""Detection rules as data: a YAML file of thresholds with units, severities and actions.

Operators tune detection by editing a file, not code, so the file is checked hard at
load: every error names the file, the rule (index and id), the key and what is wrong,
and all errors are reported at once. Everything that costs (YAML, unit parsing, Xid
catalog lookups, dispatch tables) happens here, once; the engine's per-report path only
reads the parsed values.

Schema (``version: 1``)::

    version: 1
    defaults:              # all optional
      hold: "10m"          # event-driven conditions stay active this long after their last event
      flap_window: "10m"   # default window for counts ("3 link_downed in ...")
      resolve_after: 2     # good reports in a row before a state/rate condition resolves
      update_interval: "1s"  # at most one "updated" change per condition per interval
      saturated_fires: true  # a saturated counter counts as "at least the threshold"
      counter_interval: "15s"  # cumulative counters are read at most this often per NIC/GPU:
                               # a skipped report loses nothing, the next delta covers it
    rules:
      - id: nic.symbol_errors          # unique
        description: "..."
        category: nic_errors           # one of controller.detect.model.CATEGORIES
        severity: warning              # info | warning | critical | fatal
        action: check_link             # starpulse.core.vocab.ACTIONS or EXTRA_ACTIONS
        kind: nic_counter              # the evaluator, see KINDS
        ...kind parameters...          # thresholds as "10/s", "60s", "5%", "85C", "400Gb/s"
        hold: "5m"                     # optional per-rule override of defaults.hold
        resolve_after: 3               # optional per-rule override
        enabled: true                  # optional

Quantities are strings with a unit or ``{value: 10, unit: "/s"}`` mappings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import structlog
import yaml

from controller.detect.model import CATEGORIES
from starpulse.core import vocab
from starpulse.core import xid as xidcat
from starpulse.core.schema import ConfigError
from starpulse.core.units import BadValue, Quantity, parse_quantity
from starpulse.core.vocab import SEVERITY_ORDER
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

DEFAULT_RULES_FILE = "default_rules.yaml"
SUPPORTED_VERSION = 1

# Actions rules may recommend beyond the Xid vocabulary.
EXTRA_ACTIONS = ("replace_optic", "free_disk", "check_pfc", "check_host")
ALL_ACTIONS = (*vocab.ACTIONS, *EXTRA_ACTIONS)

# nvmlClocksEventReason* bits by NVML's name, as rules files write them.
CLOCK_REASON_BITS: dict[str, int] = {r.name: r.bit for r in vocab.CLOCK_EVENT_REASONS["nvidia"]}

GPU_FLAGS = ("lost", "reset_required", "remap_pending", "remap_failure", "retired_pages_pending")
NVLINK_COUNTERS = vocab.NVLINK_ERROR_COUNTERS
NIC_SOURCES = ("counters", "hw_counters", "ethtool_stats", "netdev_stats")
OPTICS_CHECKS = ("temperature", "rx_power", "tx_power")
EVENT_KINDS: dict[str, int] = {
    name.removeprefix("EVENT_KIND_").lower(): value
    for name, value in tpb.EventKind.items()
    if value != tpb.EVENT_KIND_UNSPECIFIED
}


class RulesError(ConfigError):
    """A rules file that cannot be used; ``errors`` holds one line per problem."""


# -- parameter parsers -------------------------------------------------------------------


def _quantity(*dimensions: str, positive: bool = False) -> Callable[[Any], Quantity]:
    def parse(raw: Any) -> Quantity:
        q = parse_quantity(raw, dimensions)
        if positive and q.value <= 0:
            raise BadValue(f"{q.text!r} must be greater than zero")
        return q

    return parse


def _int(minimum: int = 0) -> Callable[[Any], int]:
    def parse(raw: Any) -> int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise BadValue(f"expected an integer, got {raw!r}")
        if raw < minimum:
            raise BadValue(f"must be at least {minimum}, got {raw}")
        return raw

    return parse


def _bool(raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise BadValue(f"expected true or false, got {raw!r}")
    return raw


def _str(raw: Any) -> str:
    if not isinstance(raw, str) or not raw:
        raise BadValue(f"expected a non-empty string, got {raw!r}")
    return raw


def _one_of(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(raw: Any) -> str:
        if raw not in choices:
            raise BadValue(f"unknown value {raw!r} (expected one of {', '.join(choices)})")
        return str(raw)

    return parse


def _list_of(item: Callable[[Any], Any], *, non_empty: bool = True) -> Callable[[Any], tuple[Any, ...]]:
    def parse(raw: Any) -> tuple[Any, ...]:
        if isinstance(raw, str | int):
            raw = [raw]
        if not isinstance(raw, list):
            raise BadValue(f"expected a list, got {raw!r}")
        if non_empty and not raw:
            raise BadValue("expected a non-empty list")
        return tuple(item(x) for x in raw)

    return parse


def _event_kind(raw: Any) -> int:
    if raw not in EVENT_KINDS:
        raise BadValue(f"unknown event kind {raw!r} (expected one of {', '.join(EVENT_KINDS)})")
    return EVENT_KINDS[raw]


def _clock_reason(raw: Any) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0:
        return raw
    if raw in CLOCK_REASON_BITS:
        return CLOCK_REASON_BITS[raw]
    known = ", ".join(CLOCK_REASON_BITS)
    raise BadValue(f"unknown clock event reason {raw!r} (expected a bit value or one of {known})")


@dataclass(frozen=True, slots=True)
class Param:
    parse: Callable[[Any], Any]
    required: bool = False
    default: Any = None


_EVENTS = Param(_list_of(_event_kind))  # state rules: these events open the condition before a report confirms it
_THRESHOLD = Param(_quantity("rate", "count", positive=True), required=True)
_WINDOW = Param(_quantity("time", positive=True))

# kind -> its parameters. The engine (conditions.py) has one evaluator per kind.
KINDS: dict[str, dict[str, Param]] = {
    # An event (or a count of events within a window). Resolves hold after the last one.
    "event": {
        "events": Param(_list_of(_event_kind), required=True),
        "xids": Param(_list_of(_int(1))),
        "xid_action": Param(_one_of(vocab.ACTIONS)),  # Xids whose catalog bucket maps to this action
        "min_count": Param(_int(1), default=1),
        "window": _WINDOW,
        "min_event_severity": Param(_one_of(tuple(SEVERITY_ORDER))),
        "resolve_on": Param(_list_of(_event_kind)),
    },
    # A boolean GpuSample field that is true.
    "gpu_flag": {"field": Param(_one_of(GPU_FLAGS), required=True), "events": _EVENTS},
    # GpuSample.recovery_action non-zero; the action is the one the value names.
    "gpu_recovery_action": {"events": _EVENTS},
    # Clock-event reason bits set (hardware slowdown).
    "gpu_clock_reasons": {"reasons": Param(_list_of(_clock_reason), required=True), "events": _EVENTS},
    # Fewer GPUs in the report than in the node's inventory.
    "gpu_missing": {},
    # An NVLink the GPU reports as down.
    "gpu_nvlink_down": {"events": _EVENTS},
    # NVLink error counters, per link, as a rate or a count in a window.
    "gpu_nvlink_errors": {
        "counters": Param(_list_of(_one_of(NVLINK_COUNTERS)), required=True),
        "threshold": _THRESHOLD,
        "window": _WINDOW,
    },
    # An RDMA port whose state is not the expected one (ACTIVE).
    "nic_state": {"expect": Param(_str, default="ACTIVE"), "events": _EVENTS},
    # NIC counters from one source, as a rate or a count in a window.
    "nic_counter": {
        "source": Param(_one_of(NIC_SOURCES), required=True),
        "counters": Param(_list_of(_str), required=True),
        "threshold": _THRESHOLD,
        "window": _WINDOW,
        "saturated_fires": Param(_bool),
    },
    # An active NIC slower than nominal or than the node's fastest other rail.
    "nic_rate": {
        "nominal": Param(_quantity("bandwidth", positive=True)),
        "compare_rails": Param(_bool, default=True),
    },
    # A switch port operationally down while administratively up.
    "switch_port_state": {"events": _EVENTS},
    # A PFC watchdog queue in "stormed".
    "switch_pfc_watchdog": {"events": _EVENTS},
    # Transceiver DOM readings outside the module's own alarm thresholds.
    "switch_optics": {"checks": Param(_list_of(_one_of(OPTICS_CHECKS)), default=OPTICS_CHECKS)},
    # A mount with less free space than min_free.
    "host_disk": {
        "min_free": Param(_quantity("percent", "bytes", positive=True), required=True),
        "ignore_mounts": Param(_list_of(_str), default=()),
    },
    # Less available memory than min_available.
    "host_memory": {"min_available": Param(_quantity("percent", "bytes", positive=True), required=True)},
    # A compute node unreachable (presence).
    "heartbeat": {},
    # A switch's agent unreachable (presence of a switch-role node).
    "switch_silent": {},
}

_COMMON_KEYS = ("id", "description", "category", "severity", "action", "kind", "hold", "resolve_after", "enabled")
_REQUIRED_KEYS = ("id", "description", "category", "severity", "action", "kind")

# Kinds evaluated on events only / on presence only; everything else is evaluated on reports.
EVENT_ONLY_KINDS = frozenset({"event"})
PRESENCE_KINDS = frozenset({"heartbeat", "switch_silent"})


# -- the parsed file ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Defaults:
    hold_s: float = 600.0
    flap_window_s: float = 600.0
    resolve_after: int = 2
    update_interval_s: float = 1.0
    saturated_fires: bool = True
    counter_interval_s: float = 0.0  # read a node's cumulative counters at most this often (0: every report)


_DEFAULT_KEYS: dict[str, tuple[str, Param]] = {
    "hold": ("hold_s", Param(_quantity("time", positive=True))),
    "flap_window": ("flap_window_s", Param(_quantity("time", positive=True))),
    "resolve_after": ("resolve_after", Param(_int(1))),
    "update_interval": ("update_interval_s", Param(_quantity("time"))),
    "saturated_fires": ("saturated_fires", Param(_bool)),
    "counter_interval": ("counter_interval_s", Param(_quantity("time"))),
}


@dataclass(frozen=True, slots=True)
class Rule:
    """One validated rule. ``params`` holds the kind's parsed parameters (Quantity for thresholds)."""

    id: str
    description: str
    category: str
    severity: str
    action: str
    kind: str
    params: Mapping[str, Any]
    hold_ms: int
    resolve_after: int
    index: int = 0
    # Precomputed for the hot path.
    threshold: float = 0.0  # canonical value of params["threshold"] when present
    threshold_is_rate: bool = False
    window_s: float = 0.0  # 0 = per-interval rate
    counter_keys: tuple[str, ...] = ()

    def p(self, key: str) -> Any:
        return self.params.get(key)


@dataclass
class RuleSet:
    """The loaded rules with dispatch tables: by kind, by event kind, by Xid."""

    rules: tuple[Rule, ...]
    defaults: Defaults
    source: str = "<default>"
    version: int = SUPPORTED_VERSION
    by_kind: dict[str, tuple[Rule, ...]] = field(default_factory=dict)
    by_event: dict[int, tuple[Rule, ...]] = field(default_factory=dict)  # event kind -> rules it opens
    resolving_event: dict[int, tuple[Rule, ...]] = field(default_factory=dict)  # event kind -> rules it resolves
    _xid_cache: dict[int, tuple[Rule, ...]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        by_kind: dict[str, list[Rule]] = {k: [] for k in KINDS}
        by_event: dict[int, list[Rule]] = {}
        resolving: dict[int, list[Rule]] = {}
        for rule in self.rules:
            by_kind[rule.kind].append(rule)
            for ev in rule.params.get("events") or ():
                by_event.setdefault(ev, []).append(rule)
            for ev in rule.params.get("resolve_on") or ():
                resolving.setdefault(ev, []).append(rule)
        self.by_kind = {k: tuple(v) for k, v in by_kind.items()}
        self.by_event = {k: tuple(v) for k, v in by_event.items()}
        self.resolving_event = {k: tuple(v) for k, v in resolving.items()}

    def __len__(self) -> int:
        return len(self.rules)

    def get(self, rule_id: str) -> Rule:
        for rule in self.rules:
            if rule.id == rule_id:
                return rule
        raise KeyError(f"no rule {rule_id!r}")

    def ids(self) -> list[str]:
        return [r.id for r in self.rules]

    def event_rules(self, kind: int, xid: int) -> tuple[Rule, ...]:
        """Rules an event of ``kind`` (with ``xid``, 0 when none) can open; Xid filters applied, memoised."""
        key = kind << 32 | xid
        cached = self._xid_cache.get(key)
        if cached is not None:
            return cached
        candidates = self.by_event.get(kind, ())
        info = xidcat.lookup(xid) if xid else None
        out = tuple(
            r
            for r in candidates
            if (
                _xid_free(r)
                or (info is not None and xid in (r.params.get("xids") or ()))
                or (
                    info is not None
                    and r.params.get("xid_action") is not None
                    and info.action == r.params["xid_action"]
                )
            )
        )
        if len(self._xid_cache) < 4096:
            self._xid_cache[key] = out
        return out


def _xid_free(rule: Rule) -> bool:
    return not rule.params.get("xids") and rule.params.get("xid_action") is None


# -- loading -----------------------------------------------------------------------------


def default_rules_path() -> Path:
    """The rules file shipped in this package."""
    return Path(str(resources.files("controller.detect").joinpath(DEFAULT_RULES_FILE)))


def load_rules(path: str | Path | None = None) -> RuleSet:
    """Load and validate a rules file (None: the packaged default); RulesError lists every problem."""
    where = default_rules_path() if path is None else Path(path)
    try:
        text = where.read_text(encoding="utf-8")
    except OSError as err:
        raise RulesError([f"{where}: cannot read rules file: {err.strerror or err}"]) from None
    ruleset = parse_rules(text, str(where))
    log.info("rules_loaded", source=str(where), rules=len(ruleset), version=ruleset.version)
    return ruleset


def parse_rules(text: str, source: str = "<rules>") -> RuleSet:
    """Validate rules YAML text; ``source`` names it in errors."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise RulesError([f"{source}: not valid YAML{where}: {problem}"]) from None
    return rules_from_dict(doc, source)


def rules_from_dict(doc: Any, source: str = "<rules>") -> RuleSet:
    """Validate an already-parsed rules document."""
    errors: list[str] = []
    if not isinstance(doc, dict):
        raise RulesError([f"{source}: expected a mapping with 'version', 'defaults' and 'rules', got {_kind(doc)}"])
    for key in doc:
        if key not in ("version", "defaults", "rules"):
            errors.append(f"{source}: unknown top-level key {key!r} (expected version, defaults, rules)")
    version = doc.get("version")
    if version != SUPPORTED_VERSION:
        errors.append(f"{source}: 'version': must be {SUPPORTED_VERSION}, got {version!r}")
    defaults = _parse_defaults(doc.get("defaults"), source, errors)
    raw_rules = doc.get("rules")
    rules: list[Rule] = []
    if not isinstance(raw_rules, list) or not raw_rules:
        errors.append(f"{source}: 'rules': expected a non-empty list of rules, got {_kind(raw_rules)}")
        raw_rules = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(raw_rules):
        rule = _parse_rule(raw, index, defaults, source, errors)
        if rule is None:
            continue
        if rule.id in seen:
            errors.append(
                f"{source}: rules[{index}] (id {rule.id!r}): duplicate id, first used by rules[{seen[rule.id]}]"
            )
            continue
        seen[rule.id] = index
        rules.append(rule)
    if errors:
        raise RulesError(errors)
    return RuleSet(tuple(r for r in rules if r.params.get("enabled", True)), defaults, source, SUPPORTED_VERSION)


def _parse_defaults(raw: Any, source: str, errors: list[str]) -> Defaults:
    if raw is None:
        return Defaults()
    if not isinstance(raw, dict):
        errors.append(f"{source}: 'defaults': expected a mapping, got {_kind(raw)}")
        return Defaults()
    values: dict[str, Any] = {}
    for key, value in raw.items():
        spec = _DEFAULT_KEYS.get(key)
        if spec is None:
            errors.append(f"{source}: defaults: unknown key {key!r} (expected one of {', '.join(_DEFAULT_KEYS)})")
            continue
        attr, param = spec
        try:
            parsed = param.parse(value)
        except BadValue as bad:
            errors.append(f"{source}: defaults: {key!r}: {bad}")
            continue
        values[attr] = parsed.value if isinstance(parsed, Quantity) else parsed
    return Defaults(**values)


# Complexity over 15 on purpose: one check per rule key, all errors collected; the per-kind parameters move into
# evaluators (issue 16, evaluators slice).
def _parse_rule(raw: Any, index: int, defaults: Defaults, source: str, errors: list[str]) -> Rule | None:  # noqa: C901
    if not isinstance(raw, dict):
        errors.append(f"{source}: rules[{index}]: expected a mapping, got {_kind(raw)}")
        return None
    rid = raw.get("id")
    where = f"{source}: rules[{index}] (id {rid!r})" if isinstance(rid, str) and rid else f"{source}: rules[{index}]"
    before = len(errors)
    for key in _REQUIRED_KEYS:
        if key not in raw:
            errors.append(f"{where}: missing key {key!r}")
    if "id" in raw and (not isinstance(rid, str) or not rid):
        errors.append(f"{where}: 'id': expected a non-empty string, got {rid!r}")
    if "description" in raw and (not isinstance(raw["description"], str) or not raw["description"].strip()):
        errors.append(f"{where}: 'description': expected a non-empty string")
    checks = (
        ("category", CATEGORIES),
        ("severity", tuple(SEVERITY_ORDER)),
        ("action", ALL_ACTIONS),
    )
    for key, choices in checks:
        if key in raw and raw[key] not in choices:
            errors.append(f"{where}: {key!r}: unknown {key} {raw[key]!r} (expected one of {', '.join(choices)})")
    kind = raw.get("kind")
    spec = KINDS.get(kind) if isinstance(kind, str) else None
    if "kind" in raw and spec is None:
        errors.append(f"{where}: 'kind': unknown kind {kind!r} (expected one of {', '.join(KINDS)})")
    params: dict[str, Any] = {}
    hold_s, resolve_after = defaults.hold_s, defaults.resolve_after
    for key, value in raw.items():
        if key in _COMMON_KEYS:
            continue
        if spec is None:
            continue  # unknown kind: its parameters cannot be checked
        param = spec.get(key)
        if param is None:
            allowed = ", ".join(spec) or "none"
            errors.append(f"{where}: unknown key {key!r} for kind {kind!r} (its parameters: {allowed})")
            continue
        try:
            params[key] = param.parse(value)
        except BadValue as bad:
            errors.append(f"{where}: {key!r}: {bad}")
    if spec is not None:
        for key, param in spec.items():
            if key in params:
                continue
            if param.required and not any(e.startswith(f"{where}: {key!r}") for e in errors[before:]):
                errors.append(f"{where}: missing key {key!r} (required by kind {kind!r})")
            elif param.default is not None:
                params[key] = param.default
    if "hold" in raw:
        try:
            hold_s = _quantity("time", positive=True)(raw["hold"]).value
        except BadValue as bad:
            errors.append(f"{where}: 'hold': {bad}")
    if "resolve_after" in raw:
        try:
            resolve_after = _int(1)(raw["resolve_after"])
        except BadValue as bad:
            errors.append(f"{where}: 'resolve_after': {bad}")
    if "enabled" in raw:
        try:
            params["enabled"] = _bool(raw["enabled"])
        except BadValue as bad:
            errors.append(f"{where}: 'enabled': {bad}")
    if len(errors) == before and spec is not None:
        _check_kind(str(kind), params, defaults, where, errors)
    if len(errors) > before or not isinstance(kind, str):
        return None
    threshold: Quantity | None = params.get("threshold")
    window: Quantity | None = params.get("window")
    window_s = window.value if window is not None else 0.0
    if kind == "event" and params.get("min_count", 1) > 1 and window is None:
        window_s = defaults.flap_window_s
    counter_keys: tuple[str, ...] = ()
    if kind == "nic_counter":
        counter_keys = tuple(f"{params['source']}/{c}" for c in params["counters"])
    elif kind == "gpu_nvlink_errors":
        counter_keys = tuple(params["counters"])
    return Rule(
        id=raw["id"],
        description=raw["description"].strip(),
        category=raw["category"],
        severity=raw["severity"],
        action=raw["action"],
        kind=kind,
        params=params,
        hold_ms=int(hold_s * 1000),
        resolve_after=resolve_after,
        index=index,
        threshold=threshold.value if threshold is not None else 0.0,
        threshold_is_rate=threshold is not None and threshold.dimension == "rate",
        window_s=window_s,
        counter_keys=counter_keys,
    )


def _check_kind(kind: str, params: dict[str, Any], defaults: Defaults, where: str, errors: list[str]) -> None:
    """Cross-parameter checks a single parser cannot make."""
    threshold: Quantity | None = params.get("threshold")
    if threshold is not None and threshold.dimension == "count" and params.get("window") is None:
        errors.append(f"{where}: 'threshold': {threshold.text!r} is a count and needs a 'window' to count in")
    if kind == "event":
        if params.get("xids") and params.get("xid_action") is not None:
            errors.append(f"{where}: 'xids' and 'xid_action' are exclusive: pick one")
        xid_kinds = {tpb.EVENT_KIND_XID, tpb.EVENT_KIND_SXID}
        if (params.get("xids") or params.get("xid_action") is not None) and not set(params["events"]) & xid_kinds:
            errors.append(f"{where}: 'xids'/'xid_action' need 'events' to include xid or sxid")
        if params.get("window") is not None and params.get("min_count", 1) == 1:
            errors.append(f"{where}: 'window' needs 'min_count' above 1 (events counted in the window)")
    if kind == "nic_rate" and params.get("nominal") is None and not params.get("compare_rails", True):
        errors.append(f"{where}: kind 'nic_rate' needs 'nominal', 'compare_rails: true', or both")
    if kind == "host_disk" and params["min_free"].dimension == "percent" and params["min_free"].value >= 100:
        errors.append(f"{where}: 'min_free': {params['min_free'].text!r} must be below 100%")
    if (
        kind == "host_memory"
        and params["min_available"].dimension == "percent"
        and params["min_available"].value >= 100
    ):
        errors.append(f"{where}: 'min_available': {params['min_available'].text!r} must be below 100%")


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    return f"{type(value).__name__} {value!r}" if not isinstance(value, dict | list) else type(value).__name__
