"""Alert delivery end to end over loopback: a receiver that is down and comes back (across a
controller restart), signed generic webhooks, and a real Alertmanager routing to a webhook.

Incidents are built directly; the Notifier and its SQLite outbox are the real ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sqlite3
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from controller.detect.model import Incident
from controller.outputs.notify import payloads
from controller.outputs.notify.config import BackoffConfig, NotifyConfig, ReceiverConfig
from controller.outputs.notify.notifier import Notifier
from controller.outputs.notify.outbox import Outbox
from controller.outputs.notify.signing import DELIVERY_HEADER, TIMESTAMP_HEADER, verify
from starpulse.core.clock import SYSTEM_CLOCK, Clock, FakeClock
from tests.helpers import free_port, wait_for

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
FAST = BackoffConfig(initial_s=0.1, max_s=0.4, multiplier=2.0, jitter=0.0)


@dataclass
class Hit:
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """A local webhook endpoint: records what it accepts; can answer errors first, or verify signatures."""

    port: int
    fail_first: int = 0  # answer this many requests with fail_status before accepting
    fail_status: int = 503
    secret: str | None = None  # when set, reject (401) requests that do not verify
    hits: list[Hit] = field(default_factory=list)  # accepted requests, in arrival order
    refused: list[Hit] = field(default_factory=list)  # answered with an error
    _runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        hit = Hit(dict(request.headers), await request.read())
        if len(self.refused) < self.fail_first:
            self.refused.append(hit)
            return web.Response(status=self.fail_status, text="not now")
        if self.secret is not None and not verify(self.secret, request.headers, hit.body, now=time.time()):
            self.refused.append(hit)
            return web.Response(status=401, text="bad signature")
        self.hits.append(hit)
        return web.Response(text="ok")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"


@contextlib.asynccontextmanager
async def receiving(receiver: Receiver) -> AsyncIterator[Receiver]:
    await receiver.start()
    try:
        yield receiver
    finally:
        await receiver.stop()


@dataclass
class Running:
    notifier: Notifier
    conn: sqlite3.Connection
    stop: asyncio.Event
    task: asyncio.Task[None]

    async def halt(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 10)
        self.conn.close()


def start_notifier(
    db: Path, *receivers: ReceiverConfig, clock: Clock = SYSTEM_CLOCK, poll_interval_s: float = 0.1
) -> Running:
    """A Notifier on its own connection to the controller DB file, as the controller would run it."""
    conn = sqlite3.connect(str(db), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    n = Notifier(NotifyConfig(receivers=list(receivers), poll_interval_s=poll_interval_s), Outbox(conn, clock), clock)
    stop = asyncio.Event()
    return Running(n, conn, stop, asyncio.create_task(n.run(stop, grace_s=1.0)))


def incident(**kw: Any) -> Incident:
    t = SYSTEM_CLOCK.time_ms()
    base: dict[str, Any] = {
        "id": "inc-000042",
        "kind": "link_fault",
        "root_cause": "node-003/nic-5<->leaf-b0-r5",
        "component_type": "link",
        "affected_nodes": ["node-003", "node-004"],
        "affected_jobs": ["train-7"],
        "severity": "critical",
        "action": "replace_cable",
        "evidence": [{"rule": "nic_link_flap", "component": "node-003/nic-5", "message": "flapping", "count": 9}],
        "opened_ms": t,
        "updated_ms": t,
    }
    base.update(kw)
    return Incident(**base)


def resolved(inc: Incident) -> Incident:
    t = SYSTEM_CLOCK.time_ms()
    return Incident(**{**inc.__dict__, "resolved_ms": t, "updated_ms": t})


async def settle(check_s: float = 0.6) -> None:
    """Give a wrongly duplicated retry the time to show up before counting."""
    await asyncio.sleep(check_s)


class TestReceiverOutage:
    async def test_down_receiver_across_restart_gets_each_notice_once_in_order(self, tmp_path: Path) -> None:
        """Receiver not listening; incident opens and resolves; controller restarts; receiver comes up."""
        db = tmp_path / "controller.db"
        rx = Receiver(free_port())
        cfg = ReceiverConfig(name="ops", type="alertmanager_webhook", url=rx.url, backoff=FAST, min_severity="info")

        first = start_notifier(db, cfg)
        inc = incident()
        first.notifier.on_incident("opened", inc)
        first.notifier.on_incident("updated", incident(affected_nodes=["node-003"]))  # same severity: no notice
        first.notifier.on_incident("resolved", resolved(inc))
        await wait_for(lambda: first.notifier.stats.retried["ops"] >= 3, 10, "failed attempts while down")
        assert first.notifier.outbox_depth() == 2
        assert first.notifier.stats.sent["ops"] == 0
        await first.halt()

        second = start_notifier(db, cfg)  # the restarted controller: same DB file, fresh objects
        try:
            assert second.notifier.outbox_depth() == 2
            # detection may re-publish on restart: still no duplicate
            second.notifier.on_incident("resolved", resolved(inc))
            async with receiving(rx):
                await wait_for(lambda: len(rx.hits) >= 2, 10, "both notices")
                await wait_for(lambda: second.notifier.outbox_depth() == 0, 5, "an empty outbox")
                await settle()
            assert [h.json["status"] for h in rx.hits] == ["firing", "resolved"]
            assert len({h.headers[DELIVERY_HEADER] for h in rx.hits}) == 2
            for h in rx.hits:
                body = h.json
                assert body["version"] == "4" and body["receiver"] == "ops"
                (alert,) = body["alerts"]
                assert alert["labels"]["incident_id"] == "inc-000042"
                assert alert["fingerprint"] == payloads.fingerprint(alert["labels"])
            assert rx.hits[0].json["alerts"][0]["fingerprint"] == rx.hits[1].json["alerts"][0]["fingerprint"]
            assert second.notifier.stats.sent["ops"] == 2 and second.notifier.stats.failed["ops"] == 0
        finally:
            await second.halt()

    async def test_503_then_recovery_and_a_permanent_400(self, tmp_path: Path) -> None:
        """Server errors are retried under one delivery id; a 400 is not retried."""
        db = tmp_path / "controller.db"
        flaky = Receiver(free_port(), fail_first=3, fail_status=503)
        broken = Receiver(free_port(), fail_first=1_000, fail_status=400)
        cfgs = [
            ReceiverConfig(name="flaky", type="alertmanager_webhook", url=flaky.url, backoff=FAST),
            ReceiverConfig(name="broken", type="alertmanager_webhook", url=broken.url, backoff=FAST),
        ]
        async with receiving(flaky), receiving(broken):
            run = start_notifier(db, *cfgs)
            try:
                run.notifier.on_incident("opened", incident())
                await wait_for(lambda: len(flaky.hits) == 1, 10, "delivery after three 503s")
                await wait_for(lambda: run.notifier.stats.failed["broken"] == 1, 5, "the 400 given up")
                await settle()
                assert len(flaky.refused) == 3 and len(flaky.hits) == 1
                ids = {h.headers[DELIVERY_HEADER] for h in [*flaky.refused, *flaky.hits]}
                assert len(ids) == 1  # stable across retries: the receiver can drop duplicates
                assert run.notifier.stats.retried["flaky"] == 3 and run.notifier.stats.sent["flaky"] == 1
                assert len(broken.refused) == 1 and broken.hits == []
                (item,) = run.notifier.outbox.items("broken")
                assert item.state == "failed" and item.last_error.startswith("HTTP 400")
            finally:
                await run.halt()


class TestBackoffOnTheControllersClock:
    async def test_a_retry_waits_for_its_backoff_on_the_injected_clock(self, tmp_path: Path) -> None:
        """Five minutes of backoff after a 503: no retry while the fake clock stands short of it, even
        as real time passes, and the retry goes out once the clock passes it, with no real waiting."""
        clock = FakeClock(SYSTEM_CLOCK.time_ms())
        five_min = BackoffConfig(initial_s=300, max_s=300, multiplier=2.0, jitter=0.0)
        flaky = Receiver(free_port(), fail_first=1, fail_status=503)
        cfg = ReceiverConfig(name="flaky", type="alertmanager_webhook", url=flaky.url, backoff=five_min)
        async with receiving(flaky):
            # An hour's poll interval: only the backoff's deadline, on the fake clock, wakes the loop.
            run = start_notifier(tmp_path / "controller.db", cfg, clock=clock, poll_interval_s=3600)
            try:
                run.notifier.on_incident("opened", incident())
                await wait_for(lambda: run.notifier.stats.retried["flaky"] == 1, 10, "the first attempt refused")
                assert run.notifier.outbox.next_due_ms() == clock.time_ms() + 300_000
                clock.advance(299.9)
                await settle()
                assert flaky.hits == [] and len(flaky.refused) == 1
                clock.advance(0.1)
                await wait_for(lambda: len(flaky.hits) == 1, 10, "the retry once the backoff passed")
                assert len(flaky.refused) == 1 and run.notifier.stats.sent["flaky"] == 1
            finally:
                await run.halt()


class TestSignedWebhook:
    async def test_receiver_verifies_every_delivery(self, tmp_path: Path) -> None:
        secret = "correct horse battery staple"
        rx = Receiver(free_port(), secret=secret, fail_first=1)
        good = ReceiverConfig(name="gen", type="webhook", url=rx.url, secret=secret, backoff=FAST)
        forged = ReceiverConfig(name="forged", type="webhook", url=rx.url, secret="guess", backoff=FAST, max_attempts=2)
        async with receiving(rx):
            run = start_notifier(tmp_path / "controller.db", good, forged)
            try:
                inc = incident(severity="fatal")
                run.notifier.on_incident("opened", inc)
                run.notifier.on_incident("resolved", resolved(inc))
                await wait_for(lambda: len(rx.hits) >= 2, 10, "two verified deliveries")
                await wait_for(lambda: run.notifier.stats.failed["forged"] >= 1, 10, "forged deliveries given up")
                await settle()
            finally:
                await run.halt()
        bodies = [h.json for h in rx.hits]
        assert [b["status"] for b in bodies] == ["firing", "resolved"]
        assert all(b["incident"]["id"] == "inc-000042" for b in bodies)
        assert [b["delivery_id"] for b in bodies] == [h.headers[DELIVERY_HEADER] for h in rx.hits]
        assert bodies[1]["incident"]["resolved_at"] is not None
        # the forged sender was refused (401, not retried), so only the good one got through
        assert run.notifier.stats.sent["forged"] == 0 and run.notifier.stats.sent["gen"] == 2
        # a captured delivery replayed later is refused
        h = rx.hits[0]
        signed_at = float(h.headers[TIMESTAMP_HEADER])
        assert verify(secret, h.headers, h.body, now=signed_at)
        assert not verify(secret, h.headers, h.body, now=signed_at + 3600)


AM_CONFIG = """
route:
  receiver: hook
  group_by: [incident_id]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: {url}
        send_resolved: true
"""


@contextlib.asynccontextmanager
async def alertmanager(tmp_path: Path, webhook_url: str) -> AsyncIterator[str]:
    assert ALERTMANAGER is not None
    port = free_port()
    cfg = tmp_path / "am.yml"
    cfg.write_text(AM_CONFIG.format(url=webhook_url))
    log = (tmp_path / "am.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        ALERTMANAGER,
        f"--config.file={cfg}",
        f"--storage.path={tmp_path / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as s:
            deadline = time.monotonic() + 15
            while True:
                with contextlib.suppress(aiohttp.ClientError):
                    async with s.get(f"{base}/-/ready") as r:
                        if r.status == 200:
                            break
                if proc.returncode is not None or time.monotonic() > deadline:
                    raise AssertionError(f"alertmanager did not start: {(tmp_path / 'am.log').read_text()[-2000:]}")
                await asyncio.sleep(0.05)
        yield base
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        log.close()


@pytest.mark.slow
@pytest.mark.skipif(
    ALERTMANAGER is None,
    reason="prometheus-alertmanager binary not installed (apt-get install prometheus-alertmanager)",
)
class TestRealAlertmanager:
    async def test_push_api_v2_and_receive_alertmanagers_webhook(self, tmp_path: Path) -> None:
        rx = Receiver(free_port())
        async with receiving(rx), alertmanager(tmp_path, rx.url) as am:
            api = ReceiverConfig(name="am", type="alertmanager_api", url=am, resend_interval_s=1.0, backoff=FAST)
            run = start_notifier(tmp_path / "controller.db", api)
            try:
                inc = incident()
                run.notifier.on_incident("opened", inc)
                await wait_for(lambda: any(h.json["status"] == "firing" for h in rx.hits), 20, "AM's firing webhook")
                firing = next(h.json for h in rx.hits if h.json["status"] == "firing")
                assert firing["version"] == "4" and firing["receiver"] == "hook"
                assert firing["groupLabels"] == {"incident_id": "inc-000042"}
                (alert,) = firing["alerts"]
                assert alert["labels"] == payloads.alert_labels(inc)
                assert alert["fingerprint"] == payloads.fingerprint(alert["labels"])  # our hash is Alertmanager's
                assert alert["annotations"]["summary"].startswith("critical link_fault")
                assert alert["annotations"]["affected_nodes"] == "node-003, node-004"
                # the active alert is re-pushed every resend interval
                await wait_for(lambda: run.notifier.stats.resent["am"] >= 2, 10, "API v2 re-sends")

                run.notifier.on_incident("resolved", resolved(inc))
                await wait_for(lambda: any(h.json["status"] == "resolved" for h in rx.hits), 20, "AM's resolved")
                done = next(h.json for h in rx.hits if h.json["status"] == "resolved")
                assert done["alerts"][0]["fingerprint"] == alert["fingerprint"]
                assert done["alerts"][0]["endsAt"] != payloads.ZERO_TIME
                assert run.notifier.outbox.active("am") == []
                statuses = [h.json["status"] for h in rx.hits]
                assert statuses.index("firing") < statuses.index("resolved")
                assert run.notifier.stats.failed["am"] == 0
            finally:
                await run.halt()
