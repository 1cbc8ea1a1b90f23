"""The HTTP side's credentials without TLS (bearer token, /metrics open or closed) and its settings' errors.

Over HTTPS with a client certificate, Prometheus and Chromium: tests/e2e/test_http_tls.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from controller.outputs.http import build_app
from controller.outputs.http_auth import needs_credential
from controller.service import Controller, ControllerConfig
from starpulse.app import cli
from starpulse.app.config.controller import load_controller_settings
from starpulse.core.auth import HttpAuthConfig
from starpulse.core.clock import SYSTEM_CLOCK
from starpulse.core.schema import ConfigError
from starpulse.core.tls import make_test_ca, node_id_from_peercert

TOKEN = "a-token-of-enough-length-123456"
Client = TestClient[web.Request, web.Application]


@pytest.fixture(autouse=True)
def _keep_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    """cli.main() points logging at the (captured, later closed) stderr; keep the test's config."""
    monkeypatch.setattr("starpulse.core.logs.configure_logging", lambda *a, **k: None)


async def client_for(tmp_path: Path, auth: HttpAuthConfig) -> Client:
    ctl = Controller(ControllerConfig(db_path=tmp_path / "c.db"), clock=SYSTEM_CLOCK)
    app = build_app(ctl.registry, ctl.store, ctl.metrics, healthy=lambda: True, queries=ctl.queries, http_auth=auth)
    client: Client = TestClient(TestServer(app))
    await client.start_server()
    return client


@pytest.mark.parametrize("metrics", ["open", "auth"])
async def test_token_guards_dashboard_and_api_and_metrics_as_configured(tmp_path: Path, metrics: str) -> None:
    client = await client_for(tmp_path, HttpAuthConfig(require_auth=True, tokens=[TOKEN], metrics=metrics))  # type: ignore[arg-type]
    try:
        for path in ("/", "/api/nodes", "/api/summary", "/static/app.js"):
            resp = await client.get(path)
            assert resp.status == 401, path
            assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        resp = await client.get("/api/nodes", headers={"Authorization": f"Bearer {TOKEN}"})
        assert resp.status == 200 and "nodes" in await resp.json()
        assert (await client.get("/api/nodes", headers={"Authorization": "Bearer " + "x" * 30})).status == 403
        assert (await client.get("/api/nodes", headers={"Authorization": "Basic Zm9vOmJhcg=="})).status == 403
        assert (await client.get("/healthz")).status == 200
        scraped = await client.get("/metrics")
        assert scraped.status == (200 if metrics == "open" else 401)
        with_token = await client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert with_token.status == 200 and "starpulse_" in await with_token.text()
    finally:
        await client.close()


async def test_open_by_default(tmp_path: Path) -> None:
    client = await client_for(tmp_path, HttpAuthConfig())
    try:
        assert (await client.get("/api/nodes")).status == 200
        assert (await client.get("/")).status == 200
    finally:
        await client.close()


def test_needs_credential() -> None:
    closed = HttpAuthConfig(require_auth=True, tokens=[TOKEN])
    assert needs_credential(closed, "/api/incidents") and needs_credential(closed, "/")
    assert not needs_credential(closed, "/healthz") and not needs_credential(closed, "/metrics")
    assert not needs_credential(HttpAuthConfig(metrics="auth"), "/metrics")  # nothing to ask for: open
    assert not needs_credential(HttpAuthConfig(), "/api/nodes")


def test_peer_certificate_identity() -> None:
    cert = {"subject": ((("commonName", "node-007"),),), "subjectAltName": (("URI", "starpulse-node:node-007"),)}
    assert node_id_from_peercert(cert) == "node-007"
    assert node_id_from_peercert({"subject": ((("commonName", "admin"),),)}) == "admin"
    assert node_id_from_peercert(None) is None and node_id_from_peercert({}) is None


def test_token_from_file_and_env(tmp_path: Path) -> None:
    (tmp_path / "tokens").write_text("# dashboard\n" + TOKEN + "\n")
    env = {"STARPULSE_HTTP_TOKEN": "another-token-of-length-0987"}
    st = load_controller_settings(
        None, env, {"http.token_file": ("test", str(tmp_path / "tokens")), "http.require_auth": ("test", True)}
    )
    assert st.controller.http_auth.tokens == [TOKEN, "another-token-of-length-0987"]
    assert TOKEN not in repr(st.settings.http)  # the file holds the token, the settings only its path


@pytest.mark.parametrize(
    ("args", "env", "wanted"),
    [
        (["--http-token-file", "{tmp}/missing"], {}, "--http-token-file: http.token_file: HTTP token file"),
        (["--tls-ca", "{ca}", "--tls-cert", "{tmp}/gone.pem", "--tls-key", "{key}"], {}, "tls.cert_file: file"),
        ([], {"STARPULSE_HTTP__REQUIRE_AUTH": "true"}, "http.require_auth: needs a token"),
        ([], {"STARPULSE_HTTP__CERT_NAMES": "admin"}, "http.cert_names: client certificates need the tls section"),
    ],
)
def test_bad_settings_are_one_line_naming_the_key(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    env: dict[str, str],
    wanted: str,
) -> None:
    ca = make_test_ca(tmp_path / "pki", nodes=[])
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    fmt = {"tmp": str(tmp_path), "ca": str(ca.ca_cert), "key": str(ca.controller.key_file)}
    argv = ["controller", "--db", str(tmp_path / "c.db"), *(a.format(**fmt) for a in args)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and wanted in err[0], err


def test_short_token_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="STARPULSE_HTTP_TOKEN"):
        load_controller_settings(None, {"STARPULSE_HTTP_TOKEN": "short"}, {})
