"""The client commands' settings file (~/.config/starpulse/client.toml): flag > env > file > default."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from starpulse.app import cli
from starpulse.app.cli.common import client_token


@pytest.fixture(autouse=True)
def _keep_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    """cli.main() points logging at the (captured, later closed) stderr; keep the test's config."""
    monkeypatch.setattr("starpulse.core.logs.configure_logging", lambda *a, **k: None)


@pytest.fixture
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    for var in ("STARPULSE_CONTROLLER", "STARPULSE_CLIENT_CONFIG", "STARPULSE_ADMIN_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "starpulse").mkdir()
    return tmp_path / "starpulse"


def test_precedence_flag_env_file_default(config_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli.build_parser().parse_args(["nodes"]).controller == cli.DEFAULT_CONTROLLER  # no file: the default
    (config_home / "client.toml").write_text('controller = "from-file:7000"\ntls_ca = "ca.pem"\n')
    args = cli.build_parser().parse_args(["nodes"])
    assert args.controller == "from-file:7000"
    assert args.tls_ca == str(config_home / "ca.pem")  # relative to the file
    monkeypatch.setenv("STARPULSE_CONTROLLER", "from-env:6000")
    assert cli.build_parser().parse_args(["nodes"]).controller == "from-env:6000"
    assert cli.build_parser().parse_args(["nodes", "--controller", "flag:1"]).controller == "flag:1"


def test_help_names_the_file(config_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["nodes", "--help"])
    assert str(config_home / "client.toml") in "".join(capsys.readouterr().out.split())  # argparse wraps it


def test_admin_token_from_the_file_is_below_the_environment(config_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (config_home / "admin.token").write_text("file-token-0123456789abcdef\n")
    (config_home / "client.toml").write_text('admin_token_file = "admin.token"\n')
    args = cli.build_parser().parse_args(["breaker", "status"])
    assert client_token(args) == "file-token-0123456789abcdef"
    monkeypatch.setenv("STARPULSE_ADMIN_TOKEN", "env-token-0123456789abcdef")
    assert client_token(args) == "env-token-0123456789abcdef"


@pytest.mark.parametrize(
    ("text", "wanted"),
    [
        ("controller = [unclosed\n", "not valid TOML"),
        ('controler = "x:1"\n', "unknown key 'controler'"),
        ("controller = 5\n", "controller: must be a non-empty string"),
    ],
)
def test_a_bad_file_is_one_line_naming_it(
    config_home: Path, capsys: pytest.CaptureFixture[str], text: str, wanted: str
) -> None:
    path = config_home / "client.toml"
    path.write_text(text)
    assert cli.main(["nodes"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"starpulse nodes: {path}: ") and wanted in line
    assert cli.main(["version"]) == 0  # a command that is not a client is not stopped by it


def test_a_named_file_must_exist(
    config_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STARPULSE_CLIENT_CONFIG", str(config_home / "nope.toml"))
    assert cli.main(["events"]) == 2
    assert "nope.toml: no such file (named by $STARPULSE_CLIENT_CONFIG)" in capsys.readouterr().err


def test_namespace_without_client_flags_has_no_file_error() -> None:
    assert getattr(argparse.Namespace(), "client_file_error", None) is None
