"""The whole loop without healing: a GPU fault injected at a simulated node's NVML is
detected by the controller, becomes an incident, and a signed webhook receives it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from controller.detect.pipeline import DetectionConfig
from controller.fabric import Fabric, generate_fabric
from controller.outputs.notify import parse_notify_config
from controller.service import Controller, ControllerConfig
from controller.stages import STAGES
from starpulse.core.clock import SYSTEM_CLOCK
from tests.e2e.test_alerting import Receiver, receiving
from tests.helpers import free_port, make_sim_agent, wait_for


def two_nodes_and_a_webhook(
    tmp_path: Path, sweep_interval_s: float, detection: DetectionConfig | None = None
) -> tuple[Controller, Receiver, Fabric, int]:
    """A controller (not started) for a two-node fabric, notifying one signed webhook; and its gRPC port."""
    fabric = generate_fabric(nodes=2, gpus_per_node=8, rails=8, nodes_per_block=2, spines=1)
    receiver = Receiver(port=free_port(), secret="s3cret")
    notify = parse_notify_config(
        {"receivers": [{"name": "ops", "type": "webhook", "url": receiver.url, "secret": "s3cret"}]}
    )
    port = free_port()
    ctl = Controller(
        ControllerConfig(
            listen=f"127.0.0.1:{port}",
            http="127.0.0.1:0",
            db_path=tmp_path / "c.db",
            fabric=fabric,
            allowed_nodes=[*fabric.nodes(), *fabric.switches()],
            sweep_interval_s=sweep_interval_s,
            notify=notify,
            detection=detection or DetectionConfig(),
        ),
        clock=SYSTEM_CLOCK,
    )
    return ctl, receiver, fabric, port


@contextlib.asynccontextmanager
async def xid79_delivered(
    tmp_path: Path, sweep_interval_s: float, settle_s: float | None, within_s: float
) -> AsyncIterator[tuple[Controller, Receiver]]:
    """Two simulated nodes and a signed webhook: Xid 79 on node-001/gpu-2, yielded once the notice arrived."""
    ctl, receiver, fabric, port = two_nodes_and_a_webhook(tmp_path, sweep_interval_s)
    if settle_s is not None:
        ctl.detection.correlator.config.settle_s = settle_s
    async with receiving(receiver):
        await ctl.start()
        agents = [make_sim_agent(n, tmp_path, [f"127.0.0.1:{port}"], seed=i) for i, n in enumerate(fabric.nodes())]
        try:
            for a in agents:
                a.start()
            await wait_for(lambda: len(ctl.registry.nodes) == 2, what="registration")
            agents[1].sim.inject("gpu_xid", "gpu-2", xid=79)
            await wait_for(lambda: len(receiver.hits) >= 1, within_s, "the webhook notice")
            yield ctl, receiver
        finally:
            for a in agents:
                await a.halt()
            await ctl.stop()


class TestFaultToAlert:
    async def test_injected_xid_reaches_a_signed_webhook_as_one_incident(self, tmp_path: Path) -> None:
        """Xid 79 on node-001/gpu-2 -> gpu_fault incident -> one signed 'firing' notice naming the GPU."""
        async with xid79_delivered(tmp_path, sweep_interval_s=0.2, settle_s=0.5, within_s=30) as (ctl, receiver):
            body = receiver.hits[0].json
            text = str(body)
            assert "node-001/gpu-2" in text and "gpu_fault" in text and "firing" in text
            incidents = ctl.detection.incidents.list_incidents(active_only=True)
            assert [(i.kind, i.root_cause) for i in incidents] == [("gpu_fault", "node-001/gpu-2")]
            assert receiver.refused == []  # the signature verified

    async def test_an_xid_is_traced_stage_by_stage_and_opens_without_waiting_for_settle(self, tmp_path: Path) -> None:
        """Production grouping (settle_s 15 s, the cap; a 60 s sweep, so no tick helps): the webhook
        comes well inside settle_s; every stage from buffered to delivered is on /metrics once,
        adding up to the trace."""
        async with xid79_delivered(tmp_path, sweep_interval_s=60.0, settle_s=None, within_s=10) as (ctl, _):
            assert ctl.detection.correlator.config.settle_s == 15.0
            await wait_for(lambda: len(ctl.stages.done) >= 1, 5, "the finished trace")
            (trace,) = ctl.stages.done
            assert trace.node == "node-001" and trace.kind == "xid"
            assert list(trace.marks) == list(STAGES)  # every stage stamped, agent and controller
            sample = ctl.metrics.registry.get_sample_value
            label = "starpulse_event_stage_seconds"
            counts = [sample(f"{label}_count", {"stage": s}) for s in STAGES[1:]]
            assert counts == [1.0] * (len(STAGES) - 1)
            summed = sum(sample(f"{label}_sum", {"stage": s}) or 0.0 for s in STAGES[1:])
            assert abs(summed - trace.total_s()) < 1e-6
