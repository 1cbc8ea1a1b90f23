"""`--help` says what every flag does and what it is when not given; client commands find the controller."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from starpulse.app import cli


def _flags(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, argparse.Action]]:
    """(command path, action) for every option of every (sub)command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _flags(sub, (*path, name))
        elif action.option_strings and not isinstance(action, argparse._HelpAction | argparse._VersionAction):
            yield " ".join(path), action


FLAGS = list(_flags(cli.build_parser()))


def test_the_walk_sees_every_command() -> None:
    """The check below would pass on an empty walk: it must reach services, queries and nested commands."""
    commands = {path for path, _ in FLAGS}
    assert {"controller", "agent", "relay", "events", "topology generate", "incident show", "demo"} <= commands
    assert len(FLAGS) > 150


@pytest.mark.parametrize(("command", "action"), FLAGS, ids=[f"{p} {a.option_strings[0]}" for p, a in FLAGS])
def test_every_flag_has_help_and_says_its_default(command: str, action: argparse.Action) -> None:
    assert action.help, f"starpulse {command} {action.option_strings[0]}: no help text"
    if action.default not in (None, False, "", [], argparse.SUPPRESS):
        assert "default" in action.help, (
            f"starpulse {command} {action.option_strings[0]}: default {action.default!r} not in its help"
        )


def test_scheduler_offers_every_backend() -> None:
    (scheduler,) = [a for p, a in FLAGS if p == "controller" and "--scheduler" in a.option_strings]
    assert set(scheduler.choices or ()) == {"none", "slurm", "kubernetes", "exec", "sim"}


def test_controller_address_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """$STARPULSE_CONTROLLER sets every client command's default; --controller still wins."""
    monkeypatch.setenv("STARPULSE_CONTROLLER", "ctl.example:6000")
    parser = cli.build_parser()
    for argv in (["nodes"], ["events"], ["incident", "show", "INC-1"], ["breaker", "status"], ["topology", "show"]):
        assert parser.parse_args(argv).controller == "ctl.example:6000", argv
    assert parser.parse_args(["nodes", "--controller", "other:1"]).controller == "other:1"
    monkeypatch.setenv("STARPULSE_CONTROLLER", "ctl-1:50051,ctl-2:50051")  # as the agent's .env file has it
    assert cli.build_parser().parse_args(["nodes"]).controller == "ctl-1:50051"
    monkeypatch.delenv("STARPULSE_CONTROLLER")
    assert cli.build_parser().parse_args(["nodes"]).controller == cli.DEFAULT_CONTROLLER


def test_controller_variable_is_no_settings_override(monkeypatch: pytest.MonkeyPatch) -> None:
    """STARPULSE_CONTROLLER has no __: a service's settings ignore it (an agent and a client share a shell)."""
    from starpulse.app.config import service

    monkeypatch.setenv("STARPULSE_CONTROLLER", "ctl.example:6000")
    overrides = {"agent.node_id": ("--node-id", "n1"), "agent.controllers": ("--controller", ["c:1"])}
    config, _ = service("agent").load(None, overrides=overrides)
    assert config.controllers == ["c:1"]
