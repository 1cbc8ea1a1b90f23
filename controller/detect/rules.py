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
        kind: nic_counter              # the evaluator (controller.detect.evaluators), see KINDS
        ...kind parameters...          # thresholds as "10/s", "60s", "5%", "85C", "400Gb/s"
        hold: "5m"                     # optional per-rule override of defaults.hold
        resolve_after: 3               # optional per-rule override
        enabled: true                  # optional

Quantities are strings with a unit or ``{value: 10, unit: "/s"}`` mappings. Each kind's
parameters, and the checks across them, belong to its evaluator
(controller.detect.evaluators); this module checks what every rule has and asks the
kind's evaluator about the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import structlog
import yaml

from controller.detect.evaluators.base import Evaluator, Registry
from controller.detect.evaluators.params import Param, boolean, integer, quantity
from controller.detect.evaluators.registry import REGISTRY
from controller.detect.model import CATEGORIES, Defaults, Rule
from starpulse.core import vocab
from starpulse.core import xid as xidcat
from starpulse.core.schema import ConfigError
from starpulse.core.units import BadValue, Quantity
from starpulse.core.vocab import SEVERITY_ORDER

log = structlog.get_logger(__name__)

DEFAULT_RULES_FILE = "default_rules.yaml"
SUPPORTED_VERSION = 1

# Actions rules may recommend beyond the Xid vocabulary.
# check_hardware: degraded but working (a narrowed PCIe link, a retraining port): a person sees
# to the part at a service window; the default policy alerts only.
EXTRA_ACTIONS = ("replace_optic", "free_disk", "check_pfc", "check_host", "check_hardware")
ALL_ACTIONS = (*vocab.ACTIONS, *EXTRA_ACTIONS)

# kind -> its parameters, from the registry of evaluators (one per kind).
KINDS: dict[str, Mapping[str, Param]] = REGISTRY.params()

_COMMON_KEYS = ("id", "description", "category", "severity", "action", "kind", "hold", "resolve_after", "enabled")
_REQUIRED_KEYS = ("id", "description", "category", "severity", "action", "kind")


class RulesError(ConfigError):
    """A rules file that cannot be used; ``errors`` holds one line per problem."""


# -- the parsed file ---------------------------------------------------------------------


_DEFAULT_KEYS: dict[str, tuple[str, Param]] = {
    "hold": ("hold_s", Param(quantity("time", positive=True))),
    "flap_window": ("flap_window_s", Param(quantity("time", positive=True))),
    "resolve_after": ("resolve_after", Param(integer(1))),
    "update_interval": ("update_interval_s", Param(quantity("time"))),
    "saturated_fires": ("saturated_fires", Param(boolean)),
    "counter_interval": ("counter_interval_s", Param(quantity("time"))),
}


@dataclass
class RuleSet:
    """The loaded rules with dispatch tables: by kind, by event kind, by Xid."""

    rules: tuple[Rule, ...]
    defaults: Defaults
    source: str = "<default>"
    version: int = SUPPORTED_VERSION
    registry: Registry = field(default=REGISTRY, repr=False)  # the evaluators of its kinds
    by_kind: dict[str, tuple[Rule, ...]] = field(default_factory=dict)
    by_event: dict[int, tuple[Rule, ...]] = field(default_factory=dict)  # event kind -> rules it opens
    resolving_event: dict[int, tuple[Rule, ...]] = field(default_factory=dict)  # event kind -> rules it resolves
    _xid_cache: dict[tuple[int, str], tuple[Rule, ...]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        by_kind: dict[str, list[Rule]] = {k: [] for k in self.registry.kinds()}
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

    def event_rules(self, kind: int, xid: int, action: str = "") -> tuple[Rule, ...]:
        """Rules an event of ``kind`` (with ``xid``, 0 when none) can open; Xid filters applied, memoised.

        ``action`` is the agent's: for Xids whose action is in the message (144-150, 154) it
        picks the bucket the event files under (starpulse.core.xid.rule_action).
        """
        bucket_action = xidcat.rule_action(xid, action) if xid else ""
        key = (kind << 32 | xid, bucket_action)
        cached = self._xid_cache.get(key)
        if cached is not None:
            return cached
        candidates = self.by_event.get(kind, ())
        out = tuple(
            r
            for r in candidates
            if (
                _xid_free(r)
                or (xid and xid in (r.params.get("xids") or ()))
                or (xid and r.params.get("xid_action") is not None and bucket_action == r.params["xid_action"])
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


def load_rules(path: str | Path | None = None, registry: Registry = REGISTRY) -> RuleSet:
    """Load and validate a rules file (None: the packaged default); RulesError lists every problem.

    ``registry``: the evaluators whose kinds the file may use (tests pass their own)."""
    where = default_rules_path() if path is None else Path(path)
    try:
        text = where.read_text(encoding="utf-8")
    except OSError as err:
        raise RulesError([f"{where}: cannot read rules file: {err.strerror or err}"]) from None
    ruleset = parse_rules(text, str(where), registry)
    log.info("rules_loaded", source=str(where), rules=len(ruleset), version=ruleset.version)
    return ruleset


def parse_rules(text: str, source: str = "<rules>", registry: Registry = REGISTRY) -> RuleSet:
    """Validate rules YAML text; ``source`` names it in errors."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise RulesError([f"{source}: not valid YAML{where}: {problem}"]) from None
    return rules_from_dict(doc, source, registry)


def rules_from_dict(doc: Any, source: str = "<rules>", registry: Registry = REGISTRY) -> RuleSet:
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
        rule = _parse_rule(raw, index, defaults, source, errors, registry)
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
    enabled = tuple(r for r in rules if r.params.get("enabled", True))
    return RuleSet(enabled, defaults, source, SUPPORTED_VERSION, registry)


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


def _parse_rule(
    raw: Any, index: int, defaults: Defaults, source: str, errors: list[str], registry: Registry
) -> Rule | None:
    if not isinstance(raw, dict):
        errors.append(f"{source}: rules[{index}]: expected a mapping, got {_kind(raw)}")
        return None
    rid = raw.get("id")
    where = f"{source}: rules[{index}] (id {rid!r})" if isinstance(rid, str) and rid else f"{source}: rules[{index}]"
    before = len(errors)
    _check_common(raw, where, errors)
    kind = raw.get("kind")
    evaluator = registry.get(kind) if isinstance(kind, str) else None
    if "kind" in raw and evaluator is None:
        errors.append(f"{where}: 'kind': unknown kind {kind!r} (expected one of {', '.join(registry.kinds())})")
    params = _parse_params(raw, evaluator, where, errors) if evaluator is not None else {}
    hold_s = _rule_value(raw, "hold", quantity("time", positive=True), where, errors)
    resolve_after = _rule_value(raw, "resolve_after", integer(1), where, errors)
    if "enabled" in raw:
        enabled = _rule_value(raw, "enabled", boolean, where, errors)
        if enabled is not None:
            params["enabled"] = enabled
    if len(errors) > before or evaluator is None:
        return None
    derived = evaluator.prepare(params, defaults, where, errors)  # checks across the kind's parameters
    if len(errors) > before:
        return None
    return Rule(
        id=raw["id"],
        description=raw["description"].strip(),
        category=raw["category"],
        severity=raw["severity"],
        action=raw["action"],
        kind=evaluator.kind,
        params=params,
        hold_ms=int((hold_s.value if hold_s is not None else defaults.hold_s) * 1000),
        resolve_after=resolve_after if resolve_after is not None else defaults.resolve_after,
        index=index,
        threshold=derived.threshold,
        threshold_is_rate=derived.threshold_is_rate,
        window_s=derived.window_s,
        counter_keys=derived.counter_keys,
        spec=derived.spec,
    )


def _check_common(raw: dict[str, Any], where: str, errors: list[str]) -> None:
    """The keys every rule has, whatever its kind."""
    for key in _REQUIRED_KEYS:
        if key not in raw:
            errors.append(f"{where}: missing key {key!r}")
    rid = raw.get("id")
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


def _parse_params(raw: dict[str, Any], evaluator: type[Evaluator], where: str, errors: list[str]) -> dict[str, Any]:
    """The kind's own parameters, each parsed by its Param; required ones present, defaults filled."""
    spec = evaluator.params
    kind = evaluator.kind
    before = len(errors)
    params: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _COMMON_KEYS:
            continue
        param = spec.get(key)
        if param is None:
            allowed = ", ".join(spec) or "none"
            errors.append(f"{where}: unknown key {key!r} for kind {kind!r} (its parameters: {allowed})")
            continue
        try:
            params[key] = param.parse(value)
        except BadValue as bad:
            errors.append(f"{where}: {key!r}: {bad}")
    for key, param in spec.items():
        if key in params:
            continue
        if param.required and not any(e.startswith(f"{where}: {key!r}") for e in errors[before:]):
            errors.append(f"{where}: missing key {key!r} (required by kind {kind!r})")
        elif param.default is not None:
            params[key] = param.default
    return params


def _rule_value(raw: dict[str, Any], key: str, parse: Callable[[Any], Any], where: str, errors: list[str]) -> Any:
    """A common per-rule key (hold, resolve_after, enabled) parsed, or None when absent or bad."""
    if key not in raw:
        return None
    try:
        return parse(raw[key])
    except BadValue as bad:
        errors.append(f"{where}: {key!r}: {bad}")
        return None


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    return f"{type(value).__name__} {value!r}" if not isinstance(value, dict | list) else type(value).__name__
