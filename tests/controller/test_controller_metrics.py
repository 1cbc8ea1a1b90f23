"""The controller's Prometheus exposition: existing names kept, new series present, promtool-clean."""

from __future__ import annotations

from pathlib import Path

import aiohttp
from prometheus_client import generate_latest

from controller.metrics import ControllerMetrics
from controller.service import Controller, ControllerConfig
from starpulse.core.clock import SYSTEM_CLOCK
from starpulse.core.vocab import EVICTABLE_KINDS
from tests.helpers import free_port
from tests.support.metrics import controller_exposition, find, one, promtool_check, samples


class TestControllerSeries:
    def test_existing_names_still_exposed(self) -> None:
        text = controller_exposition()
        assert one(text, "starpulse_reports_received_total") == 3
        assert one(text, "starpulse_samples_received_total", kind="gpu") == 24
        assert one(text, "starpulse_nodes", state="unreachable") == 1
        assert one(text, "starpulse_incidents_open", kind="gpu_fault") == 1
        assert one(text, "starpulse_agent_streams") == 2
        assert one(text, "starpulse_command_queue_depth") == 1
        assert one(text, "starpulse_detection_latency_seconds_count") == 1
        assert one(text, "starpulse_detection_latency_seconds_bucket", le="3.0") == 1
        assert one(text, "starpulse_ingest_seconds_count") == 1

    def test_new_series(self) -> None:
        text = controller_exposition()
        assert one(text, "starpulse_evictions_total", kind="gpu_fault", reason="incident") == 1
        assert one(text, "starpulse_breaker_open", breaker="eviction") == 1
        assert one(text, "starpulse_alert_outbox_depth") == 4
        assert one(text, "starpulse_alert_notifications_total", receiver="webhook", outcome="sent") == 1

    def test_eviction_and_breaker_series_exist_before_any_action(self) -> None:
        """Zero-valued series from the start: rules and increase() work before self-healing exists."""
        text = generate_latest(ControllerMetrics().registry).decode()
        kinds = {s.labels["kind"] for s in find(text, "starpulse_evictions_total")}
        assert kinds == set(EVICTABLE_KINDS)
        assert all(s.value == 0 for s in find(text, "starpulse_evictions_total"))
        assert one(text, "starpulse_breaker_open", breaker="eviction") == 0
        assert one(text, "starpulse_alert_outbox_depth") == 0

    def test_promtool_check_metrics(self) -> None:
        promtool_check(controller_exposition())
        promtool_check(generate_latest(ControllerMetrics().registry).decode())


async def test_http_metrics_route_serves_new_series(tmp_path: Path) -> None:
    ctl = Controller(
        ControllerConfig(listen=f"127.0.0.1:{free_port()}", http="127.0.0.1:0", db_path=tmp_path / "c.db"),
        clock=SYSTEM_CLOCK,
    )
    await ctl.start()
    try:
        url = f"http://127.0.0.1:{ctl.http_port}/metrics"
        async with aiohttp.ClientSession() as session, session.get(url) as resp:
            assert resp.status == 200
            text = await resp.text()
    finally:
        await ctl.stop()
    names = {s.name for s in samples(text)}
    assert {"starpulse_breaker_open", "starpulse_evictions_total", "starpulse_reports_received_total"} <= names
    promtool_check(text)


def test_the_loop_histogram_exposes_what_prometheus_clients_histogram_does() -> None:
    """The per-report histograms (LoopHistogram: a bisect, no lock) read as before on /metrics:
    the same buckets (a value on a bound counted in it), sum and count; only ``_created`` is gone."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from controller.metrics import LoopHistogram

    bounds = (0.001, 0.01, 0.1, 1.0)
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Histogram("x_seconds", "help", buckets=bounds, registry=theirs)
    fast = LoopHistogram("x_seconds", "help", bounds, ours)
    for value in (0.0, 0.0005, 0.001, 0.002, 0.01, 0.5, 1.0, 7.0):
        reference.observe(value)
        fast.observe(value)
    expected = [line for line in generate_latest(theirs).decode().splitlines() if "_created" not in line]
    assert generate_latest(ours).decode().splitlines() == expected
