"""The HTTP side over TLS with credentials: a real controller on a test CA's certificates.

- over HTTPS (the CA trusted, nothing ignored): without a credential the dashboard and /api
  answer 401 and say how to authenticate; a wrong token 403; the bearer token or a client
  certificate 200; /healthz and /metrics stay open (``http.metrics: open``);
- a real Prometheus scrapes /metrics over TLS with the test CA in its ``tls_config``;
- headless Chromium trusts the test CA through an NSS database made with ``certutil`` (no
  flag that ignores certificate errors): it gets the sign-in page without the token and the
  dashboard with it, and without the database it gets neither.

Needs the Debian packages ``prometheus``, ``chromium`` and ``libnss3-tools`` for the parts
that use them (each skips, saying which, when absent).
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import yaml

from controller.service import Controller, ControllerConfig
from starpulse.core.auth import HttpAuthConfig
from starpulse.core.clock import SYSTEM_CLOCK
from starpulse.core.tls import TestCA, make_test_ca
from tests.e2e.test_dashboard import CHROMIUM, run_chromium
from tests.helpers import free_port

TOKEN = "dashboard-token-0123456789abcdef"
PROMETHEUS = shutil.which("prometheus")
CERTUTIL = shutil.which("certutil")
pytestmark = pytest.mark.slow


@dataclass
class Rig:
    controller: Controller
    ca: TestCA

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"https://{host}:{self.controller.http_port}{path}"

    def client_ssl(self, with_cert: bool = False) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca.ca_cert))
        if with_cert:
            ctx.load_cert_chain(str(self.ca.admin.cert_file), str(self.ca.admin.key_file))
        return ctx


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    ca = make_test_ca(tmp_path / "pki", nodes=["node-001"])
    controller = Controller(
        ControllerConfig(
            listen=f"127.0.0.1:{free_port()}",
            http="127.0.0.1:0",
            db_path=tmp_path / "controller.db",
            tls=ca.controller,
            http_auth=HttpAuthConfig(require_auth=True, tokens=[TOKEN]),
        ),
        clock=SYSTEM_CLOCK,
    )
    await controller.start()
    try:
        yield Rig(controller, ca)
    finally:
        await controller.stop()


async def get(rig: Rig, path: str, *, cert: bool = False, **headers: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(rig.url(path), ssl=rig.client_ssl(cert), headers=headers, allow_redirects=False) as resp,
    ):
        return resp.status, await resp.text()


async def test_credentials_over_https(rig: Rig) -> None:
    status, body = await get(rig, "/api/summary")
    assert status == 401 and "Bearer" in body and "client certificate" in body
    status, body = await get(rig, "/", Accept="text/html")
    assert status == 401 and 'id="auth-required"' in body and "?token=" in body
    assert (await get(rig, "/api/summary", Authorization="Bearer not-the-token-at-all-xx"))[0] == 403
    status, body = await get(rig, "/api/summary", Authorization=f"Bearer {TOKEN}")
    assert status == 200 and '"nodes"' in body
    assert (await get(rig, "/api/summary", cert=True))[0] == 200  # a client certificate the CA signed
    assert (await get(rig, "/", cert=True))[0] == 200
    assert (await get(rig, "/healthz"))[0] == 200
    status, body = await get(rig, "/metrics")
    assert status == 200 and "starpulse_" in body  # open to a plain scrape, over TLS


async def test_token_in_address_becomes_a_cookie(rig: Rig) -> None:
    jar = aiohttp.CookieJar(unsafe=True)  # an IP address host
    async with aiohttp.ClientSession(cookie_jar=jar) as session:
        async with session.get(rig.url("/?token=" + TOKEN), ssl=rig.client_ssl(), allow_redirects=False) as resp:
            assert resp.status == 303 and resp.headers["Location"] == "/"
            assert "HttpOnly" in resp.headers["Set-Cookie"] and "Secure" in resp.headers["Set-Cookie"]
        async with session.get(rig.url("/api/summary"), ssl=rig.client_ssl()) as resp:
            assert resp.status == 200
    async with (
        aiohttp.ClientSession() as session,
        session.get(rig.url("/?token=wrong-token-0123456789"), ssl=rig.client_ssl()) as resp,
    ):
        assert resp.status == 403


async def test_plain_http_is_not_served(rig: Rig) -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientError):
            async with session.get(f"http://127.0.0.1:{rig.controller.http_port}/healthz") as resp:
                await resp.read()


async def test_prometheus_scrapes_metrics_over_tls(rig: Rig, tmp_path: Path) -> None:
    if PROMETHEUS is None:
        pytest.skip("prometheus not installed (apt-get install --no-install-recommends prometheus)")
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {
                "job_name": "starpulse-controller",
                "scheme": "https",
                "tls_config": {"ca_file": str(rig.ca.ca_cert)},
                "static_configs": [{"targets": [f"127.0.0.1:{rig.controller.http_port}"]}],
            }
        ],
    }
    (tmp_path / "prom.yml").write_text(yaml.safe_dump(config))
    with (tmp_path / "prometheus.log").open("w") as log:
        proc = await asyncio.create_subprocess_exec(
            PROMETHEUS,
            f"--config.file={tmp_path / 'prom.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        last: object = None
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                assert proc.returncode is None, "prometheus exited; see prometheus.log"
                try:
                    async with session.get(f"http://127.0.0.1:{port}/api/v1/targets") as resp:
                        targets = (await resp.json())["data"]["activeTargets"]
                except (aiohttp.ClientError, KeyError, ValueError):
                    targets = []
                last = [(t["health"], t["lastError"]) for t in targets]
                if any(t["health"] == "up" for t in targets):
                    async with session.get(
                        f"http://127.0.0.1:{port}/api/v1/query", params={"query": "starpulse_nodes"}
                    ) as resp:
                        result = (await resp.json())["data"]["result"]
                    if result:
                        return
                await asyncio.sleep(0.5)
        raise AssertionError(f"prometheus never scraped the controller over TLS: {last}")
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 20)


def nss_home(home: Path, ca_cert: Path) -> None:
    """A HOME whose NSS database (Chromium's trust store on Linux) trusts the test CA."""
    assert CERTUTIL is not None
    db = home / ".pki" / "nssdb"
    db.mkdir(parents=True)
    subprocess.run(["certutil", "-N", "-d", f"sql:{db}", "--empty-password"], check=True, timeout=30)
    subprocess.run(
        ["certutil", "-A", "-d", f"sql:{db}", "-n", "starpulse-test-ca", "-t", "C,,", "-i", str(ca_cert)],
        check=True,
        timeout=30,
    )
    listed = subprocess.run(["certutil", "-L", "-d", f"sql:{db}"], check=True, capture_output=True, text=True)
    assert "starpulse-test-ca" in listed.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (apt-get install --no-install-recommends chromium)")
@pytest.mark.skipif(CERTUTIL is None, reason="no certutil (apt-get install --no-install-recommends libnss3-tools)")
async def test_chromium_trusts_the_ca_through_nss(rig: Rig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nss_home(tmp_path / "home", rig.ca.ca_cert)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # Chromium (a child process) reads $HOME/.pki/nssdb
    dom = await run_chromium(tmp_path / "p1", "--dump-dom", rig.url("/", "localhost"))
    assert 'id="auth-required"' in dom and "Bearer" in dom  # the page says how to authenticate
    assert 'id="fabric-panel"' not in dom
    dom = await run_chromium(
        tmp_path / "p2", "--virtual-time-budget=3000", "--dump-dom", rig.url(f"/?token={TOKEN}&live=0", "localhost")
    )
    assert 'id="fabric-panel"' in dom and 'id="auth-required"' not in dom  # the dashboard itself
    (tmp_path / "bare-home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "bare-home"))
    dom = await run_chromium(tmp_path / "p3", "--dump-dom", rig.url(f"/?token={TOKEN}&live=0", "localhost"))
    assert 'id="fabric-panel"' not in dom and 'id="auth-required"' not in dom  # untrusted: no page at all
