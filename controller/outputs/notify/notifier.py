"""Turns incident changes into notifications and delivers them from the outbox.

``on_incident`` (the IncidentListener protocol) only writes to SQLite: it runs inside the
detection tick and must never wait on a receiver. ``run`` is the one task that talks HTTP.

What each change queues, per routed receiver (see docs/alerts.md):

- ``opened``: a firing notice. An incident that reopens after resolving starts a new
  *episode*, so its firing notice is new rather than a duplicate of the first one.
- ``updated``: a new firing notice only when the severity changed (severity is a label, so
  the alert's identity changes; the notice carries the old alert as resolved, as
  Alertmanager itself would). For ``alertmanager_api`` receivers every update is pushed,
  so Alertmanager shows the latest annotations. An incident not yet sent to a receiver
  whose severity climbs past its ``min_severity`` is sent as if opened.
- ``resolved``: a resolved notice, with the labels last sent (so it closes what the
  receiver has), when the receiver was told the incident is firing and ``send_resolved``
  is on (always for ``alertmanager_api``: Alertmanager needs the end).

Delivery: 2xx is done; 429, 5xx, timeouts and connection errors are retried with
exponential backoff and jitter (``Retry-After`` honoured), up to ``max_attempts`` (0: no
limit); any other status gives up at once (the request itself is wrong, a retry would
be too). ``alertmanager_api`` receivers also get every active alert re-pushed every
``resend_interval_s``, from the outbox's state table, so that survives restarts too.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
import structlog

from controller.detect.model import Incident
from controller.outputs.notify import payloads
from controller.outputs.notify.config import NotifyConfig, ReceiverConfig
from controller.outputs.notify.outbox import ActiveAlert, Outbox, OutboxItem, delivery_id
from controller.outputs.notify.signing import signed_headers
from controller.stages import StageTracker
from starpulse.core.clock import Clock

log = structlog.get_logger(__name__)

MetricsHook = Callable[[str, str, int], None]  # (event, receiver, n); events: the NotifierStats fields
API_CHUNK = 500  # alerts per re-send POST


@dataclass
class NotifierStats:
    """Counters per receiver, for the controller's metrics.

    sent: notices delivered (2xx); retried: attempts that failed and will be retried;
    failed: notices given up for good; resent / resend_failed: API v2 re-sends of active alerts.
    """

    sent: Counter[str] = field(default_factory=Counter)
    retried: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    resent: Counter[str] = field(default_factory=Counter)
    resend_failed: Counter[str] = field(default_factory=Counter)


@dataclass
class _Outcome:
    ok: bool
    retry: bool
    detail: str
    http_status: int | None = None
    retry_after_s: float | None = None


class Notifier:
    """IncidentListener that queues notices in the outbox, and the task that delivers them."""

    def __init__(
        self,
        config: NotifyConfig,
        outbox: Outbox,
        clock: Clock,
        metrics_hook: MetricsHook | None = None,
        rng: random.Random | None = None,
        stages: StageTracker | None = None,
    ) -> None:
        """``stages``: the per-stage latency trace (outbox and delivered marks)."""
        self.config = config
        self.outbox = outbox
        self.metrics_hook = metrics_hook
        # Due times, backoff, re-send cadence, signatures and the loop's waits (the outbox's clock too).
        self.clock = clock
        self._clock_ms = self.clock.time_ms
        self.stats = NotifierStats()
        self._rng = rng or random.Random()
        self._wake = asyncio.Event()
        self._inflight: dict[int, asyncio.Task[None]] = {}
        self._resending: dict[str, asyncio.Task[None]] = {}
        self._last_resend: dict[str, float] = {}  # receiver -> monotonic time of the last re-send
        self._last_purge = 0.0
        self.stages = stages

    # -- IncidentListener ------------------------------------------------------------------

    def on_incident(self, change: str, incident: Incident) -> None:
        """Queue what each receiver should hear about this change; never blocks on the network."""
        queued = 0
        for r in self.config.receivers:
            try:
                with self.outbox.transaction():
                    queued += self._route(r, change, incident)
            except Exception:
                log.exception("notify_enqueue_failed", receiver=r.name, incident=incident.id, change=change)
        if queued:
            self._wake.set()
            if change == "opened" and self.stages is not None:
                self.stages.queued(incident.id)

    def outbox_depth(self) -> int:
        """Notices waiting for delivery (the queue-depth gauge)."""
        return self.outbox.pending_count()

    def _route(self, r: ReceiverConfig, change: str, inc: Incident) -> int:
        st = self.outbox.state(r.name, inc.id)
        firing = st is not None and st.state == "firing"
        if change == "resolved":
            if st is None or not firing:
                return 0  # never told it was firing (filtered out, or already resolved)
            return self._resolve(r, inc, st)
        if change not in ("opened", "updated"):
            log.warning("notify_unknown_change", change=change, incident=inc.id)
            return 0
        if not inc.active:
            return 0
        if not firing:
            if not r.routes(inc):
                return 0
            episode = 1 if st is None else st.episode + 1
            return self._fire(r, inc, episode, 0, previous=None)
        assert st is not None
        if inc.severity != st.severity:
            return self._fire(r, inc, st.episode, st.revision + 1, previous=st)
        if r.type == "alertmanager_api" and change == "updated":
            return self._fire(r, inc, st.episode, st.revision, previous=None, update_ms=inc.updated_ms)
        return 0

    def _fire(
        self,
        r: ReceiverConfig,
        inc: Incident,
        episode: int,
        revision: int,
        previous: ActiveAlert | None,
        update_ms: int | None = None,
    ) -> int:
        dedup = f"{inc.id}#{episode}.{revision}" + (f"@{update_ms}" if update_ms is not None else "")
        ext = self.config.external_url
        now = self._clock_ms()
        body: Any
        if r.type == "alertmanager_api":
            alert = payloads.api_alert(inc, "firing", ext)
            body = [alert]
            if previous is not None:  # the old label set ends now
                body.append({**json.loads(previous.payload), "endsAt": payloads.rfc3339(now)})
        elif r.type == "alertmanager_webhook":
            alert = payloads.webhook_alert(inc, "firing", ext)
            alerts = [alert]
            if previous is not None:
                old = json.loads(previous.payload)
                alerts.append({**old, "status": "resolved", "endsAt": payloads.rfc3339(now)})
            body = payloads.alertmanager_webhook_payload(r.name, alerts, "firing", ext)
        else:
            alert = payloads.webhook_alert(inc, "firing", ext)
            body = payloads.generic_payload(
                inc,
                "firing",
                delivery_id(r.name, dedup, "firing"),
                ext,
                previous_severity=previous.severity if previous is not None else None,
            )
        item = self.outbox.enqueue(r.name, dedup, "firing", json.dumps(body, sort_keys=True), group=inc.id)
        self.outbox.set_state(r.name, inc.id, episode, revision, "firing", inc.severity, json.dumps(alert))
        if item is not None:
            log.info("notify_queued", receiver=r.name, incident=inc.id, status="firing", dedup_key=dedup)
        return 1 if item is not None else 0

    def _resolve(self, r: ReceiverConfig, inc: Incident, st: ActiveAlert) -> int:
        ext = self.config.external_url
        last = json.loads(st.payload)
        send = r.send_resolved or r.type == "alertmanager_api"
        item: int | None = None
        dedup = f"{inc.id}#{st.episode}"
        if send:
            body: Any
            if r.type == "alertmanager_api":
                alert = payloads.api_alert(inc, "resolved", ext)
                alert["labels"] = last["labels"]  # close exactly the alert Alertmanager holds
                body = [alert]
            elif r.type == "alertmanager_webhook":
                alert = payloads.webhook_alert(inc, "resolved", ext)
                alert["labels"] = last["labels"]
                alert["fingerprint"] = payloads.fingerprint(last["labels"])
                body = payloads.alertmanager_webhook_payload(r.name, [alert], "resolved", ext)
            else:
                body = payloads.generic_payload(inc, "resolved", delivery_id(r.name, dedup, "resolved"), ext)
            item = self.outbox.enqueue(r.name, dedup, "resolved", json.dumps(body, sort_keys=True), group=inc.id)
        self.outbox.set_state(r.name, inc.id, st.episode, st.revision, "resolved", st.severity, st.payload)
        if item is not None:
            log.info("notify_queued", receiver=r.name, incident=inc.id, status="resolved", dedup_key=dedup)
        return 1 if item is not None else 0

    # -- delivery --------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, grace_s: float = 5.0) -> None:
        """Deliver due notices and re-push active API alerts until ``stop`` is set."""
        log.info("notifier_started", receivers=[r.name for r in self.config.receivers], pending=self.outbox_depth())
        stop_waiter = asyncio.ensure_future(stop.wait())
        try:
            async with aiohttp.ClientSession() as session:
                while not stop.is_set():
                    self._wake.clear()
                    try:
                        self._pass(session)
                    except Exception:
                        log.exception("notifier_pass_failed")
                    wake = asyncio.ensure_future(self._wake.wait())
                    timer = asyncio.ensure_future(self.clock.sleep(self._sleep_s()))
                    await asyncio.wait({wake, stop_waiter, timer}, return_when=asyncio.FIRST_COMPLETED)
                    wake.cancel()
                    timer.cancel()
                await self._drain(grace_s)
        finally:
            stop_waiter.cancel()
            log.info("notifier_stopped", pending=self.outbox_depth())

    def _pass(self, session: aiohttp.ClientSession) -> None:
        free = self.config.concurrency - len(self._inflight)
        if free > 0:
            for item in self.outbox.due(self._clock_ms(), limit=self.config.batch_size + len(self._inflight)):
                if item.id in self._inflight:
                    continue
                task = asyncio.create_task(self._deliver(session, item))
                self._inflight[item.id] = task
                task.add_done_callback(functools.partial(self._done, item.id))
                free -= 1
                if free <= 0:
                    break
        mono = self.clock.monotonic()
        for r in self.config.receivers:
            if r.type != "alertmanager_api" or r.name in self._resending:
                continue
            if mono - self._last_resend.get(r.name, float("-inf")) >= r.resend_interval_s:
                self._last_resend[r.name] = mono
                task = asyncio.create_task(self._resend(session, r))
                self._resending[r.name] = task
                task.add_done_callback(functools.partial(self._resend_done, r.name))
        if mono - self._last_purge >= 3600:
            self._last_purge = mono
            n = self.outbox.purge(self._clock_ms() - int(self.config.retention_s * 1000))
            if n:
                log.info("notify_outbox_purged", rows=n)

    def _done(self, item_id: int, _task: asyncio.Task[None]) -> None:
        self._inflight.pop(item_id, None)
        self._wake.set()

    def _resend_done(self, receiver: str, _task: asyncio.Task[None]) -> None:
        self._resending.pop(receiver, None)

    def _sleep_s(self) -> float:
        sleep = self.config.poll_interval_s
        nxt = self.outbox.next_due_ms()
        if nxt is not None:
            wait = (nxt - self._clock_ms()) / 1000
            if wait > 0:
                sleep = min(sleep, wait)
            elif not self._inflight:  # due but not started (a failed pass): retry soon, do not spin
                sleep = min(sleep, 0.05)
        mono = self.clock.monotonic()
        for r in self.config.receivers:
            if r.type == "alertmanager_api":
                sleep = min(sleep, max(0.0, self._last_resend.get(r.name, mono) + r.resend_interval_s - mono))
        # items in flight stay "pending" (so look due); their completion wakes the loop instead
        return sleep

    async def _drain(self, grace_s: float) -> None:
        tasks = [*self._inflight.values(), *self._resending.values()]
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=grace_s)
        for t in late:  # an interrupted notice stays pending: sent again after restart
            t.cancel()
        for t in late:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    async def _deliver(self, session: aiohttp.ClientSession, item: OutboxItem) -> None:
        try:
            await self._attempt(session, item)
        except asyncio.CancelledError:
            raise
        except Exception:  # the item stays pending and is tried again on a later pass
            log.exception("notify_attempt_crashed", receiver=item.receiver, incident=item.group, id=item.id)

    async def _attempt(self, session: aiohttp.ClientSession, item: OutboxItem) -> None:
        r = self.config.receiver(item.receiver)
        attempt = item.attempts + 1
        if r is None:
            self.outbox.mark_failed(item.id, "receiver no longer configured", None)
            self._count("failed", item.receiver)
            log.warning("notify_dropped", receiver=item.receiver, incident=item.group, reason="receiver not configured")
            return
        payload = item.payload
        if r.type == "alertmanager_api":  # firing alerts get a fresh endsAt at each attempt
            alerts = payloads.stamp_api_alerts(json.loads(payload), self._clock_ms(), r.resend_interval_s)
            payload = json.dumps(alerts, sort_keys=True)
        outcome = await self._post(session, r, payload.encode(), item.delivery_id)
        fields = {
            "receiver": r.name,
            "incident": item.group,
            "status": item.status,
            "attempt": attempt,
            "delivery_id": item.delivery_id,
            "http_status": outcome.http_status,
        }
        if outcome.ok:
            self.outbox.mark_delivered(item.id)
            if self.stages is not None and item.status == "firing":
                self.stages.delivered(item.group)
            self._count("sent", r.name)
            log.info("notify_delivered", outcome="delivered", **fields)
            return
        give_up = not outcome.retry or (r.max_attempts > 0 and attempt >= r.max_attempts)
        if give_up:
            self.outbox.mark_failed(item.id, outcome.detail, None)
            self._count("failed", r.name)
            log.error("notify_failed", outcome="gave_up", error=outcome.detail, **fields)
            return
        delay = self._backoff_s(r, attempt, outcome.retry_after_s)
        self.outbox.mark_failed(item.id, outcome.detail, self._clock_ms() + int(delay * 1000))
        self._count("retried", r.name)
        log.warning("notify_retry", outcome="retry", error=outcome.detail, retry_in_s=round(delay, 2), **fields)

    def _backoff_s(self, r: ReceiverConfig, attempt: int, retry_after_s: float | None) -> float:
        b = r.backoff
        delay = min(b.max_s, b.initial_s * b.multiplier ** max(0, attempt - 1))
        delay *= 1 + self._rng.uniform(-b.jitter, b.jitter)
        if retry_after_s is not None:
            delay = max(delay, min(retry_after_s, b.max_s))
        return max(0.0, delay)

    async def _post(self, session: aiohttp.ClientSession, r: ReceiverConfig, body: bytes, delivery: str) -> _Outcome:
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "starpulse-controller",
            **r.headers,
            **signed_headers(r.key, int(self.clock.time()), body, delivery),
        }
        try:
            async with session.post(
                r.post_url, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=r.timeout_s)
            ) as resp:
                text = (await resp.text(errors="replace"))[:200]
                code = resp.status
                retry_after = _retry_after_s(resp.headers.get("Retry-After"), self.clock.time())
        except TimeoutError:
            return _Outcome(False, True, f"timeout after {r.timeout_s}s")
        except (aiohttp.ClientError, OSError) as e:
            return _Outcome(False, True, f"{type(e).__name__}: {e}")
        if 200 <= code < 300:
            return _Outcome(True, False, "", code)
        retry = code == 429 or code >= 500
        return _Outcome(False, retry, f"HTTP {code}: {text}", code, retry_after)

    async def _resend(self, session: aiohttp.ClientSession, r: ReceiverConfig) -> None:
        """Re-push every alert this Alertmanager was told is firing (it resolves those not re-sent)."""
        active = self.outbox.active(r.name)
        if not active:
            return
        alerts = payloads.stamp_api_alerts(
            [json.loads(a.payload) for a in active], self._clock_ms(), r.resend_interval_s
        )
        for i in range(0, len(alerts), API_CHUNK):
            chunk = alerts[i : i + API_CHUNK]
            body = json.dumps(chunk, sort_keys=True).encode()
            outcome = await self._post(session, r, body, f"resend-{int(self.clock.time())}-{i}")
            if outcome.ok:
                self._count("resent", r.name, len(chunk))
                log.debug("notify_resent", receiver=r.name, alerts=len(chunk), outcome="delivered")
            else:
                self._count("resend_failed", r.name, len(chunk))
                log.warning("notify_resend_failed", receiver=r.name, alerts=len(chunk), error=outcome.detail)
                return

    def _count(self, event: str, receiver: str, n: int = 1) -> None:
        counter: Counter[str] = getattr(self.stats, event)
        counter[receiver] += n
        if self.metrics_hook is not None:
            try:
                self.metrics_hook(event, receiver, n)
            except Exception:
                log.exception("notify_metrics_hook_failed", event=event)


def _retry_after_s(value: str | None, now_s: float) -> float | None:
    """Retry-After as seconds (delta-seconds, or an HTTP date less ``now_s``); None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - now_s)
    except (TypeError, ValueError):
        return None
