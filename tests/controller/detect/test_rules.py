"""The rules file: units, validation errors, the packaged default."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from controller.detect.model import CATEGORIES
from controller.detect.rules import (
    ALL_ACTIONS,
    KINDS,
    RulesError,
    default_rules_path,
    load_rules,
    parse_rules,
)
from starpulse.core.units import BadValue, Quantity, parse_quantity
from starpulse.core.vocab import SEVERITY_ORDER
from starpulse.v1 import telemetry_pb2 as tpb

GOOD_RULE = """
  - id: nic.errors
    description: "NIC symbol errors"
    category: nic_errors
    severity: warning
    action: check_link
    kind: nic_counter
    source: counters
    counters: [symbol_error]
    threshold: "10/s"
"""


def write(tmp_path: Path, body: str, header: str = "version: 1\nrules:\n") -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(header + textwrap.dedent(body))
    return path


def errors_of(path: Path) -> list[str]:
    with pytest.raises(RulesError) as info:
        load_rules(path)
    return info.value.errors


class TestQuantities:
    @pytest.mark.parametrize(
        ("raw", "dims", "value", "dimension"),
        [
            ("10/s", ("rate",), 10.0, "rate"),
            ("6/min", ("rate",), 0.1, "rate"),
            ("36/h", ("rate",), 0.01, "rate"),
            ("3", ("count", "rate"), 3.0, "count"),
            (3, ("count",), 3.0, "count"),
            ("60s", ("time",), 60.0, "time"),
            ("10m", ("time",), 600.0, "time"),
            ("500ms", ("time",), 0.5, "time"),
            ("2h", ("time",), 7200.0, "time"),
            ("5%", ("percent", "bytes"), 5.0, "percent"),
            ("10GiB", ("percent", "bytes"), 10 * 2**30, "bytes"),
            ("85C", ("temperature",), 85.0, "temperature"),
            ("-10.5dBm", ("power_dbm",), -10.5, "power_dbm"),
            ("400Gb/s", ("bandwidth",), 400.0, "bandwidth"),
            ("200 Gbps", ("bandwidth",), 200.0, "bandwidth"),
            ({"value": 10, "unit": "/s"}, ("rate",), 10.0, "rate"),
            ({"value": 1.5, "unit": "m"}, ("time",), 90.0, "time"),
        ],
    )
    def test_parse(self, raw, dims, value, dimension):
        """Quantities with units parse to canonical values (s, /s, %, C, dBm, B, Gb/s)."""
        q = parse_quantity(raw, dims)
        assert isinstance(q, Quantity)
        assert q.value == pytest.approx(value)
        assert q.dimension == dimension

    @pytest.mark.parametrize(
        ("raw", "dims", "message"),
        [
            (
                "10/fortnight",
                ("rate",),
                "bad unit '/fortnight' in '10/fortnight' (expected a rate like '10/s' or '5/min')",
            ),
            ("60s", ("rate",), "'60s' is a time, expected a rate like '10/s' or '5/min'"),
            ("fast", ("rate",), "cannot read 'fast' as a quantity (expected a rate like '10/s' or '5/min')"),
            (True, ("count",), "expected a count like '3', got True"),
            ({"value": "x", "unit": "s"}, ("time",), "'value' must be a number, got 'x'"),
        ],
    )
    def test_bad(self, raw, dims, message):
        """Unreadable quantities say what was expected."""
        with pytest.raises(BadValue) as info:
            parse_quantity(raw, dims)
        assert message in str(info.value)


class TestLoadRules:
    def test_packaged_default_loads(self):
        """The default file ships in the package and validates."""
        path = default_rules_path()
        assert path.is_file()
        rules = load_rules(None)
        assert len(rules) >= 30
        assert rules.source == str(path)
        for rule in rules.rules:
            assert rule.category in CATEGORIES
            assert rule.severity in SEVERITY_ORDER
            assert rule.action in ALL_ACTIONS
            assert rule.kind in KINDS

    def test_default_covers_every_kind(self):
        """Every evaluator kind is used by at least one default rule."""
        rules = load_rules()
        assert {r.kind for r in rules.rules} == set(KINDS)

    def test_good_file_parses_units_and_defaults(self, tmp_path):
        """Thresholds become canonical numbers; defaults fill hold and resolve_after."""
        rules = load_rules(
            write(tmp_path, GOOD_RULE, "version: 1\ndefaults:\n  hold: 2m\n  resolve_after: 4\nrules:\n")
        )
        rule = rules.get("nic.errors")
        assert rule.threshold == 10.0
        assert rule.threshold_is_rate
        assert rule.hold_ms == 120_000
        assert rule.resolve_after == 4
        assert rule.counter_keys == ("counters/symbol_error",)
        assert rules.by_kind["nic_counter"] == (rule,)
        assert rules.defaults.hold_s == 120.0

    def test_disabled_rule_is_dropped(self, tmp_path):
        """enabled: false keeps a rule in the file but out of the RuleSet."""
        body = GOOD_RULE + GOOD_RULE.replace("nic.errors", "nic.other") + "    enabled: false\n"
        assert load_rules(write(tmp_path, body)).ids() == ["nic.errors"]

    def test_xid_dispatch_by_catalog_bucket(self):
        """Xids go to the rule of their catalog bucket; unknown Xids to investigate."""
        rules = load_rules()

        def ids(xid):
            return [r.id for r in rules.event_rules(tpb.EVENT_KIND_XID, xid)]

        assert ids(13) == ["gpu.xid.restart_app"]
        assert ids(48) == ["gpu.xid.reset_gpu"]
        assert ids(79) == ["gpu.xid.reboot"]
        assert ids(63) == ["gpu.xid.ignore"]
        assert ids(92) == ["gpu.xid.ignore"]
        assert ids(61) == ["gpu.xid.contact_support"]
        assert ids(154) == ["gpu.xid.investigate"]
        assert ids(99999) == ["gpu.xid.investigate"]
        assert [r.id for r in rules.event_rules(tpb.EVENT_KIND_ECC_DBE, 0)] == ["gpu.ecc_dbe"]

    @pytest.mark.parametrize(
        ("body", "expected"),
        [
            (
                GOOD_RULE.replace("kind: nic_counter", "kind: nic_magic"),
                "rules[0] (id 'nic.errors'): 'kind': unknown kind 'nic_magic' (expected one of event, gpu_flag,",
            ),
            (
                GOOD_RULE.replace('    description: "NIC symbol errors"\n', ""),
                "rules[0] (id 'nic.errors'): missing key 'description'",
            ),
            (
                GOOD_RULE.replace('threshold: "10/s"', 'threshold: "10/fortnight"'),
                "rules[0] (id 'nic.errors'): 'threshold': bad unit '/fortnight' in '10/fortnight' "
                "(expected a rate like '10/s' or '5/min' or a count like '3')",
            ),
            (
                GOOD_RULE + GOOD_RULE,
                "rules[1] (id 'nic.errors'): duplicate id, first used by rules[0]",
            ),
            (
                GOOD_RULE.replace("category: nic_errors", "category: nics"),
                "rules[0] (id 'nic.errors'): 'category': unknown category 'nics' (expected one of gpu, nic_link,",
            ),
            (
                GOOD_RULE.replace("severity: warning", "severity: bad"),
                "rules[0] (id 'nic.errors'): 'severity': unknown severity 'bad' "
                "(expected one of info, warning, critical, fatal)",
            ),
            (
                GOOD_RULE.replace("action: check_link", "action: panic"),
                "rules[0] (id 'nic.errors'): 'action': unknown action 'panic' (expected one of none, restart_app,",
            ),
            (
                GOOD_RULE.replace('    threshold: "10/s"\n', ""),
                "rules[0] (id 'nic.errors'): missing key 'threshold' (required by kind 'nic_counter')",
            ),
            (
                GOOD_RULE.replace('threshold: "10/s"', 'threshold: "10"'),
                "rules[0] (id 'nic.errors'): 'threshold': '10' is a count and needs a 'window' to count in",
            ),
            (
                GOOD_RULE + "    treshold: 5\n",
                "rules[0] (id 'nic.errors'): unknown key 'treshold' for kind 'nic_counter' "
                "(its parameters: source, counters, threshold, window, saturated_fires)",
            ),
            (
                GOOD_RULE.replace("source: counters", "source: sysfs"),
                "rules[0] (id 'nic.errors'): 'source': unknown value 'sysfs' "
                "(expected one of counters, hw_counters, ethtool_stats, netdev_stats)",
            ),
            (
                GOOD_RULE + '    window: "soon"\n',
                "rules[0] (id 'nic.errors'): 'window': cannot read 'soon' as a quantity",
            ),
            (
                "  - just a string\n",
                "rules[0]: expected a mapping, got str 'just a string'",
            ),
            (
                GOOD_RULE.replace("id: nic.errors", "id: ''"),
                "rules[0]: 'id': expected a non-empty string, got ''",
            ),
        ],
    )
    def test_bad_rule_errors(self, tmp_path, body, expected):
        """Each problem names the file, the rule index and id, the key, and what is wrong."""
        path = write(tmp_path, body)
        errors = errors_of(path)
        assert any(e.startswith(f"{path}: {expected}") for e in errors), errors

    def test_event_rule_errors(self, tmp_path):
        """Event rules check their event kinds and Xid selectors."""
        body = """
          - id: x
            description: d
            category: gpu
            severity: warning
            action: investigate
            kind: event
            events: [nic_link_down, gpu_on_fire]
            xid_action: reset_gpu
        """
        errors = errors_of(write(tmp_path, body))
        assert any(
            "rules[0] (id 'x'): 'events': unknown event kind 'gpu_on_fire' (expected one of xid," in e for e in errors
        )

    def test_all_errors_reported_at_once(self, tmp_path):
        """Several problems in several rules are all listed, one line each."""
        body = GOOD_RULE.replace("severity: warning", "severity: bad") + GOOD_RULE.replace("nic.errors", "b").replace(
            "kind: nic_counter", "kind: nope"
        )
        errors = errors_of(write(tmp_path, body))
        assert len(errors) == 2
        assert "rules[0]" in errors[0] and "rules[1]" in errors[1]

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("version: 2\nrules: []\n", "'version': must be 1, got 2"),
            ("version: 1\n", "'rules': expected a non-empty list of rules, got nothing"),
            ("version: 1\nrulez: []\nrules: []\n", "unknown top-level key 'rulez' (expected version, defaults, rules)"),
            ("- a\n- b\n", "expected a mapping with 'version', 'defaults' and 'rules', got list"),
            ("version: 1\ndefaults:\n  hold: forever\nrules: []\n", "defaults: 'hold': cannot read 'forever'"),
            ("version: 1\ndefaults:\n  holdd: 5s\nrules: []\n", "defaults: unknown key 'holdd' (expected one of hold,"),
            ("version: 1\nrules: [\n", "not valid YAML at line 3, column 1: expected the node content"),
        ],
    )
    def test_bad_file_errors(self, tmp_path, text, expected):
        """File-level problems name the file and the key."""
        path = tmp_path / "r.yaml"
        path.write_text(text)
        errors = errors_of(path)
        assert any(e.startswith(f"{path}: {expected}") for e in errors), errors

    def test_missing_file(self, tmp_path):
        """A missing file is a RulesError naming it, not a traceback."""
        path = tmp_path / "absent.yaml"
        assert errors_of(path) == [f"{path}: cannot read rules file: No such file or directory"]

    def test_parse_rules_names_source(self):
        """parse_rules uses the given source name in errors."""
        with pytest.raises(RulesError, match=r"^inline: 'version': must be 1"):
            parse_rules("version: 3\nrules: [{}]\n", "inline")
