"""Issue 32 item 6: HTTP hygiene on a real controller's HTTP port, with raw requests.

Probes, as someone who can reach the dashboard port would try them:

- ``GET ////evil.example/x?token=...``, ``GET /\\evil.example/x?token=...`` and ``GET //evil.example``
  with a good token: the sign-in redirect must stay on this origin (a single leading slash);
- a query line of 9,000 bytes that carries ``?token=``, an ``Authorization: Bearer`` header of
  9,000 bytes, a ``starpulse_token`` cookie with a control character, a header with a bad
  Content-Length: aiohttp refuses each before any middleware runs and logs it itself; no
  token, configured or presented, may appear in any log record;
- a wrong ``?token=`` (refused, logged without the token).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controller.outputs.http_logs import redact
from controller.service import Controller, ControllerConfig
from starpulse.core.auth import HttpAuthConfig
from starpulse.core.clock import SYSTEM_CLOCK
from tests.helpers import free_port, wait_for

TOKEN = "good-token-0123456789-abcdefghij"
WRONG = "wrong-token-zyxwvutsrq-987654321"


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[Controller]:
    ctl = Controller(
        ControllerConfig(
            listen=f"127.0.0.1:{free_port()}",
            http="127.0.0.1:0",
            db_path=tmp_path / "c.db",
            http_auth=HttpAuthConfig(require_auth=True, tokens=[TOKEN]),
        ),
        clock=SYSTEM_CLOCK,
    )
    await ctl.start()
    yield ctl
    await ctl.stop()


async def _raw(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(65536), 10)
    writer.close()
    return answer


def _location(answer: bytes) -> str:
    head = answer.split(b"\r\n\r\n", 1)[0].decode()
    assert head.startswith("HTTP/1.1 303"), head
    [value] = [line.split(":", 1)[1].strip() for line in head.split("\r\n") if line.lower().startswith("location:")]
    return value


@pytest.mark.parametrize(
    "target",
    ["////evil.example/x?token=T&keep=1", "/\\evil.example/x?token=T", "//evil.example?token=T", "/incidents?token=T"],
)
async def test_sign_in_redirect_stays_on_this_origin(controller: Controller, target: str) -> None:
    request = f"GET {target.replace('T', TOKEN, 1)} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    location = _location(await _raw(controller.http_port, request.encode()))
    assert location.startswith("/") and not location.startswith("//") and not location.startswith("/\\")
    assert TOKEN not in location
    if "keep=1" in target:
        assert location.endswith("?keep=1")


async def test_no_credential_reaches_a_log(controller: Controller, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    port = controller.http_port
    probes = [
        b"GET /?token=" + TOKEN.encode() + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /api/nodes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() + b"b" * 9000 + b"\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nCookie: starpulse_token=" + TOKEN.encode() + b"\x01\r\n\r\n",
        b"GET /?token=" + TOKEN.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: zz\r\n\r\n",
        b"GET /?token=" + WRONG.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    ]
    for probe in probes:
        answer = await _raw(port, probe)
        assert answer.startswith((b"HTTP/1.0 400", b"HTTP/1.1 400", b"HTTP/1.1 403")), answer[:80]

    def logged_now() -> str:
        return "\n".join(f"{r.getMessage()} {r.exc_text or ''} {r.exc_info and r.exc_info[1]}" for r in caplog.records)

    # aiohttp logs a bad request from the connection's own task: wait for the line, not a fixed time.
    await wait_for(lambda: "Error handling request" in logged_now(), what="aiohttp to log the bad requests")
    logged = logged_now()
    assert "Error handling request" in logged  # aiohttp did log the bad requests...
    for secret in (TOKEN, TOKEN[:12], WRONG):
        assert secret not in logged  # ...without the credentials
    assert "<redacted>" in logged


def test_redact_names_and_configured_secrets() -> None:
    line = "b'/?token=abc123456789&x=1' Authorization: Bearer s3cr3t-value Cookie: starpulse_token=zz; other=1"
    out = redact(line)
    assert "abc123456789" not in out and "s3cr3t-value" not in out and "zz;" not in out
    assert "x=1" in out
    # A configured token cut short by a parser's quote is still found by its beginning.
    assert "good-token-01" not in redact("bytearray(b'/x/good-token-0123...')", [TOKEN])
