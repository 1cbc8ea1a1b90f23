"""starpulse.core.schema: settings declared once as documented dataclasses, everything else derived."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml

from starpulse.core.schema import (
    ConfigError,
    Flag,
    Reading,
    Schema,
    default_of,
    flag_overrides,
    from_field,
    gather,
    meta,
    render,
    section,
    setting,
)


# -- a small service and its settings file ----------------------------------------------------
@dataclass
class ServiceConfig:
    """What a service takes: one flat dataclass, its fields documented where they are used."""

    name: str = field(metadata=meta("The service's name", nonempty=True, example="svc-1"))
    timeout_s: float = setting(15.0, "Seconds before a peer counts as gone", gt=0)
    peers: list[str] = setting(["127.0.0.1:1"], "Peer addresses", address=True)
    not_a_setting: int = 7


@dataclass
class Limits:
    """Limits, checked across fields."""

    low: int = setting(1, "Lower bound", ge=0)
    high: int = setting(10, "Upper bound", ge=0)

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) is above high ({self.high})")


@dataclass
class Main:
    """The service itself."""

    name: str = from_field(ServiceConfig, "name")
    timeout_s: float = from_field(ServiceConfig, "timeout_s")
    peers: list[str] = from_field(ServiceConfig, "peers")
    mode: Literal["fast", "safe"] = setting("safe", "How to run")
    state: Path = setting(Path("state.db"), "State file")
    signals: tuple[str, ...] = setting(("a", "b"), "Signals", choices=("a", "b", "c"))
    extra: dict[str, Any] = setting({}, "A free mapping its consumer checks")
    limits: Limits = section(Limits)


@dataclass
class Feature:
    """An optional feature."""

    level: int = setting(3, "How much", ge=1, le=5)


@dataclass
class FileLayout:
    """The whole file."""

    main: Main = section(Main)
    feature: Feature | None = section(Feature, switch="enabled", switch_doc="Turn the feature on")


SCHEMA = Schema(FileLayout, "svc")


@dataclass
class Moved:
    """Main with another default."""

    timeout_s: float = setting(42.0, "Seconds", gt=0)


@dataclass
class MovedLayout:
    """A file of Moved."""

    main: Moved = section(Moved)


FLAGS = (
    Flag("--name", "main.name"),
    Flag("--timeout-ms", "main.timeout_s", scale=0.001),
    Flag("--peer", "main.peers", split=True),
    Flag("--mode", "main.mode"),
    Flag("--feature", "feature.level", action="store_true", to=lambda on: {"feature.enabled": on}),
)


def read(raw: dict[str, Any], env: dict[str, str] | None = None, source: str = "svc.yaml", **kw: Any) -> Any:
    reading = Reading(SCHEMA, source, raw, base_dir=Path("/etc/svc"), **kw)
    reading.apply_env(env or {})
    value = reading.read()
    reading.fail()
    return value


def errors(raw: dict[str, Any], env: dict[str, str] | None = None, **kw: Any) -> list[str]:
    with pytest.raises(ConfigError) as info:
        read(raw, env, **kw)
    return info.value.errors


class TestDeclaring:
    def test_from_field_takes_the_service_default_and_doc(self) -> None:
        """A file setting declared from a service field has that field's default, doc and checks."""
        leaf = SCHEMA.leaf("main.timeout_s")
        assert leaf.default == 15.0 and leaf.spec.doc == "Seconds before a peer counts as gone"
        assert leaf.spec.gt == 0 and leaf.kind == "float"
        assert SCHEMA.leaf("main.name").required and SCHEMA.leaf("main.peers").kind == "list"

    def test_kinds_come_from_the_annotations(self) -> None:
        kinds = {leaf.key: (leaf.kind, leaf.nullable) for leaf in SCHEMA.leaves()}
        assert kinds["main.mode"] == ("enum", False) and SCHEMA.leaf("main.mode").choices == ("fast", "safe")
        assert kinds["main.state"] == ("path", False) and kinds["main.extra"] == ("map", False)
        assert kinds["main.peers"] == ("list", False) and SCHEMA.leaf("main.peers").spec.address
        assert SCHEMA.leaf("main.signals").as_tuple
        assert kinds["feature.enabled"] == ("bool", False)

    def test_an_undocumented_field_is_refused_when_the_schema_is_built(self) -> None:
        """A section field without a doc is a programming error, found at import, not in a user's file."""

        @dataclass
        class Bad:
            x: int = 1

        with pytest.raises(TypeError, match=r"Bad\.x: not a documented setting"):
            Schema(Bad, "bad")

    def test_a_type_no_file_can_hold_is_refused(self) -> None:
        @dataclass
        class Bad:
            x: frozenset[str] = setting(frozenset(), "no sets in YAML")

        with pytest.raises(TypeError, match=r"Bad\.x: type"):
            Schema(Bad, "bad")

    def test_gather_hands_values_back_to_the_service_dataclass(self) -> None:
        """The values declared from ServiceConfig's fields build a ServiceConfig, by field name."""
        main = read({"main": {"name": "svc-9", "timeout_s": 3}}).main
        assert ServiceConfig(**gather(main, ServiceConfig)) == ServiceConfig("svc-9", 3.0, ["127.0.0.1:1"])
        assert default_of(ServiceConfig, "peers") == ["127.0.0.1:1"]


class TestReading:
    def test_defaults_fill_what_the_file_leaves_out(self) -> None:
        value = read({"main": {"name": "x"}})
        assert value.main.timeout_s == 15.0 and value.main.limits == Limits() and value.feature is None
        assert value.main.state == Path("state.db")  # a default stays relative to the working directory

    def test_every_problem_at_once_naming_file_and_dotted_key(self) -> None:
        assert errors(
            {"main": {"timeout_s": "x", "mode": "yolo", "peers": ["nowhere"], "limits": {"low": -1}, "nmae": 1}}
        ) == [
            "svc.yaml: main.nmae: unknown key, did you mean 'name'?",
            "svc.yaml: main.name: is required",
            "svc.yaml: main.timeout_s: must be a number > 0, got 'x'",
            "svc.yaml: main.peers: must be a list of HOST:PORT, got ['nowhere']",
            "svc.yaml: main.mode: must be one of fast, safe, got 'yolo'",
            "svc.yaml: main.limits.low: must be an integer >= 0, got -1",
        ]

    def test_a_dataclass_check_across_fields_names_its_section(self) -> None:
        assert errors({"main": {"name": "x", "limits": {"low": 5, "high": 2}}}) == [
            "svc.yaml: main.limits: low (5) is above high (2)"
        ]

    def test_relative_paths_are_relative_to_the_file(self) -> None:
        assert read({"main": {"name": "x", "state": "db/s.db"}}).main.state == Path("/etc/svc/db/s.db")
        env = {"STARPULSE_MAIN__STATE": "db/s.db"}
        assert read({"main": {"name": "x"}}, env).main.state == Path("db/s.db")  # env: the working directory

    def test_a_switched_section_is_none_when_off_but_always_checked(self) -> None:
        assert read({"main": {"name": "x"}, "feature": {"level": 4}}).feature is None
        assert read({"main": {"name": "x"}, "feature": {"enabled": True, "level": 4}}).feature == Feature(4)
        assert errors({"main": {"name": "x"}, "feature": {"level": 9}}) == [
            "svc.yaml: feature.level: must be an integer >= 1 and <= 5, got 9"
        ]

    def test_a_missing_required_setting_names_its_flag_when_there_is_no_file(self) -> None:
        assert errors({}, source="", flags={"main.name": "--name"}) == [
            "--name is required (or main.name in --config FILE)"
        ]


class TestEnvironment:
    def test_overrides_are_typed_like_file_values(self) -> None:
        env = {
            "STARPULSE_MAIN__NAME": "from-env",
            "STARPULSE_MAIN__TIMEOUT_S": "2.5",
            "STARPULSE_MAIN__PEERS": "a:1, b:2",
            "STARPULSE_MAIN__SIGNALS": "[c]",
            "STARPULSE_MAIN__EXTRA__DEPTH": "3",  # inside a free mapping
            "STARPULSE_FEATURE__ENABLED": "true",
            "STARPULSE_OTHER__X": "1",  # another service's section
            "STARPULSE_TOKEN": "t",  # not an override
        }
        value = read({"main": {"name": "file"}}, env)
        assert (value.main.name, value.main.timeout_s, value.main.peers) == ("from-env", 2.5, ["a:1", "b:2"])
        assert value.main.signals == ("c",) and value.main.extra == {"depth": 3} and value.feature == Feature()

    def test_bad_ones_name_the_variable(self) -> None:
        env = {
            "STARPULSE_MAIN__TIMEOUT_S": "soon",
            "STARPULSE_MAIN__TIMOUT_S": "1",
            "STARPULSE_MAIN__LIMITS": "1",
            "STARPULSE_MAIN__MODE__X": "1",
        }
        assert errors({"main": {"name": "x"}}, env) == [
            "STARPULSE_MAIN__LIMITS: main.limits is a section, not a setting",
            "STARPULSE_MAIN__MODE__X: main.mode is a setting, not a section",
            "STARPULSE_MAIN__TIMOUT_S: unknown setting main.timout_s, did you mean 'timeout_s'?",
            "STARPULSE_MAIN__TIMEOUT_S: main.timeout_s: must be a number > 0, got 'soon'",
        ]


class TestFlags:
    def parse(self, argv: list[str]) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        for flag in FLAGS:
            parser.add_argument(flag.name, **flag.argparse_kwargs(SCHEMA))
        return parser.parse_args(argv)

    def test_help_and_default_come_from_the_setting_in_the_flags_unit(self) -> None:
        kw = FLAGS[1].argparse_kwargs(SCHEMA)
        assert kw["default"] == 15000.0 and kw["type"] is float
        assert kw["help"] == "Seconds before a peer counts as gone (default: 15000)"
        mode = FLAGS[3].argparse_kwargs(SCHEMA)
        assert mode["choices"] == ("fast", "safe") and mode["default"] == "safe"

    def test_given_flags_set_their_settings_over_file_and_environment(self) -> None:
        args = self.parse(["--timeout-ms", "250", "--peer", "a:1,b:2", "--peer", "c:3", "--mode", "FAST", "--feature"])
        given = {k: v for k, v in vars(args).items() if k != "name"}
        reading = Reading(SCHEMA, "svc.yaml", {"main": {"name": "x", "timeout_s": 9}})
        reading.apply_env({"STARPULSE_MAIN__TIMEOUT_S": "8"})
        reading.apply_overrides(flag_overrides(SCHEMA, FLAGS, given))
        value = reading.read()
        assert value.main.timeout_s == 0.25 and value.main.peers == ["a:1", "b:2", "c:3"]
        assert value.main.mode == "fast" and value.feature == Feature()

    def test_a_bad_flag_value_names_the_flag_and_the_key(self) -> None:
        reading = Reading(SCHEMA, "", {"main": {"name": "x"}})
        reading.apply_overrides(flag_overrides(SCHEMA, FLAGS, {"timeout_ms": -1.0}))
        assert reading.read() is None
        assert reading.errors == ["--timeout-ms: main.timeout_s: must be a number > 0, got -0.001"]


class TestRendering:
    def test_the_rendered_file_reads_back_as_the_defaults(self) -> None:
        """Every setting is in the reference file at its default (a required one: its example), documented."""
        text = render(SCHEMA, "svc settings")
        assert text.startswith("# svc settings\n")
        assert "# Seconds before a peer counts as gone. A number > 0.\n  timeout_s: 15.0\n" in text
        assert "# Turn the feature on.\n  enabled: false\n" in text
        value = read(yaml.safe_load(text))
        assert value.main == Main(name="svc-1", state=Path("/etc/svc/state.db")) and value.feature is None

    def test_a_changed_default_shows_everywhere_it_is_derived(self) -> None:
        """The one default moves the file, the flag's help and what is read, together."""

        schema = Schema(MovedLayout, "moved")
        assert "timeout_s: 42.0" in render(schema, "x")
        assert Flag("--timeout-s", "main.timeout_s").argparse_kwargs(schema)["help"].endswith("(default: 42)")
        assert Reading(schema).read().main.timeout_s == 42.0


class TestOneErrorShape:
    def test_every_file_is_invalid_error_is_a_config_error_with_lines(self) -> None:
        """Rules, policy, notify, fabric, TLS and token errors share ConfigError's shape: one line per problem."""
        from controller.detect.rules import RulesError
        from controller.fabric.io import FabricFileError
        from controller.heal.policy import PolicyError
        from controller.outputs.notify import NotifyConfigError
        from starpulse.core.auth import AuthConfigError
        from starpulse.core.tls import TLSConfigError

        for cls in (RulesError, PolicyError, NotifyConfigError, FabricFileError, TLSConfigError, AuthConfigError):
            assert issubclass(cls, ConfigError) and issubclass(cls, ValueError)
            assert cls(["a: one", "b: two"]).errors == ["a: one", "b: two"]
            exc = cls("f.yaml: x: bad")
            assert exc.errors == ["f.yaml: x: bad"] and str(exc) == "f.yaml: x: bad"


# -- data files: lists and mappings of sections, checks across keys -----------------------------
@dataclass(frozen=True)
class Step:
    """One item of a list of sections."""

    name: str = field(metadata=meta("The step", pattern=r"[a-z]+"))
    wait: float = setting(60.0, "How long", quantity=("time",), gt=0)
    check: bool | Limits = setting(False, "true, false or limits")
    tags: dict[str, str] = setting({}, "Tag -> mode", choices=("fast", "safe"), number_keys=True)

    def problems(self) -> list[tuple[str, str]]:
        return [("tags", "fast needs a wait under 10s")] if "fast" in self.tags.values() and self.wait >= 10 else []

    def problems_as(self, name: str) -> list[tuple[str, str]]:
        return [("", f"{name} is reserved")] if name == "root" else []


@dataclass(frozen=True)
class Plan:
    """A data file: a version, a list and a mapping of sections, an optional one."""

    version: Literal[1] = field(metadata=meta("Format version"))
    steps: list[Step] = setting([], "In order")
    named: dict[str, Step] = setting({}, "By name")
    first: Step | None = setting(None, "Optional")
    ladders: dict[str, list[str]] = setting({}, "Rungs", choices=("a", "b"))
    xids: list[int] = setting([], "Numbers")


PLAN = Schema(Plan, "plan")


def plan_errors(raw: Any) -> list[str]:
    reading = Reading(PLAN, "plan.yaml", raw)
    assert reading.read() is None
    return reading.errors


class TestDataFiles:
    def test_items_are_built_with_their_conversions(self) -> None:
        reading = Reading(
            PLAN, "plan.yaml", {"version": 1, "steps": [{"name": "a", "wait": "5m", "tags": {79: "safe"}}]}
        )
        plan = reading.read()
        assert plan.steps == [Step("a", 300.0, False, {"79": "safe"})] and plan.first is None
        reading = Reading(PLAN, "plan.yaml", {"version": 1, "first": {"name": "b", "check": {"low": 2}}})
        assert reading.read().first == Step("b", check=Limits(low=2))

    def test_every_error_keyed_where_it_sits(self) -> None:
        assert plan_errors(
            {
                "version": "1",
                "steps": [{"name": "A1", "wait": "soon"}, {"name": "b", "check": "maybe", "tags": {"x": "slow"}}],
                "named": {"n": {"wait": "0s", "bogus": 1}},
                "first": [],
                "ladders": {"g": ["a", "c"], "h": []},
                "xids": [1, "2"],
            }
        ) == [
            "plan.yaml: version: must be one of 1, got '1'",
            "plan.yaml: steps[0].name: must be a string matching [a-z]+, got 'A1'",
            "plan.yaml: steps[0].wait: cannot read 'soon' as a quantity (expected a duration like '60s', '10m', "
            "'500ms')",
            "plan.yaml: steps[1].check: must be true, false or a mapping, got 'maybe'",
            "plan.yaml: steps[1].tags: must be a mapping of names to one of fast, safe, got {'x': 'slow'}",
            "plan.yaml: named.n.bogus: unknown key",
            "plan.yaml: named.n.name: is required",
            "plan.yaml: named.n.wait: must be a time quantity (e.g. 60s, 10m, 24h) > 0, got '0s'",
            "plan.yaml: first: must be a mapping, or null, got []",
            "plan.yaml: ladders.g[1]: must be one of a, b, got 'c'",
            "plan.yaml: ladders.h: must be a non-empty list, each one of a, b, got []",
            "plan.yaml: xids: must be a list of integers, got [1, '2']",
        ]

    def test_checks_across_keys_and_by_name_join_the_same_list(self) -> None:
        fast = {"name": "a", "tags": {"t": "fast"}}
        assert plan_errors({"version": 1, "steps": [fast, fast], "named": {"root": {"name": "r"}}}) == [
            "plan.yaml: steps[0].tags: fast needs a wait under 10s",
            "plan.yaml: steps[1].tags: fast needs a wait under 10s",
            "plan.yaml: named.root: root is reserved",
        ]
