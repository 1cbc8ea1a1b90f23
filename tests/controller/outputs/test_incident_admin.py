"""``incident show/ack/resolve`` and ``approvals``: the gRPC side against an in-process controller
with a simulated scheduler, and the commands as a person runs them."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import grpc

from controller.detect.model import Incident
from starpulse.core.clock import SYSTEM_CLOCK
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc
from tests.support.admin import refused
from tests.support.admin import start_rig as _start


def gpu_incident(iid: str = "inc-000042", node: str = "node-002") -> Incident:
    return Incident(iid, "gpu_fault", f"{node}/gpu-1", "gpu", [node], [], "critical", "reset_gpu",
                    [{"rule": "gpu.xid.fatal", "component": f"{node}/gpu-1", "message": "Xid 79"}],
                    int(time.time() * 1000))  # fmt: skip


async def cli(port: int, *args: str, user: str = "alice") -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy")}
    env["USER"] = user
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "starpulse.app.cli", *args, "--controller", f"127.0.0.1:{port}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_show_ack_resolve(tmp_path: Path) -> None:
    controller, _, channel = await _start(tmp_path, heal=True)
    try:
        assert controller.healer is not None
        incident = gpu_incident()
        controller.detection.incidents.save(incident)
        await controller.healer.handle(incident)
        query, admin = sgrpc.QueryStub(channel), sgrpc.AdminStub(channel)
        detail = await query.GetIncident(spb.IncidentRequest(id="inc-000042"))
        whats = [(t["what"], t["node"]) for t in json.loads(detail.timeline_json)]
        assert ("draining -> evicted", "node-002") in whats and ("action drain", "node-002") in whats
        err = await refused(query.GetIncident(spb.IncidentRequest(id="inc-404")))
        assert err.code() == grpc.StatusCode.NOT_FOUND

        rc, out, err_text = await cli(controller.grpc_port, "incident", "ack", "inc-000042", "--reason", "on it")
        assert rc == 0 and "acknowledged by alice" in out, err_text
        rc, out, err_text = await cli(controller.grpc_port, "incident", "show", "inc-000042")
        assert rc == 0, err_text
        assert "gpu_fault critical  root cause node-002/gpu-1" in out and "acknowledged by alice" in out
        assert "gpu.xid.fatal on node-002/gpu-1: Xid 79" in out and "node-002 draining -> evicted [starpulse]" in out

        err = await refused(admin.ResolveIncident(spb.IncidentActionRequest(id="inc-000042", actor="starpulse",
                                                                             reason="x")))  # fmt: skip
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        rc, out, err_text = await cli(controller.grpc_port, "incident", "resolve", "inc-000042")
        assert rc == 2 and "--reason" in err_text  # argparse: the reason is required
        rc, out, err_text = await cli(controller.grpc_port, "incident", "show", "inc-000042", "--json")
        assert rc == 0 and json.loads(out)["acked_by"] == "alice"
    finally:
        await channel.close()
        await controller.stop()


async def test_approvals_list_what_waits_for_a_person(tmp_path: Path) -> None:
    controller, _, channel = await _start(tmp_path, heal=True, mode="manual")
    try:
        assert controller.healer is not None
        incident = gpu_incident()
        controller.detection.incidents.save(incident)
        await controller.healer.handle(incident)
        rc, out, err = await cli(controller.grpc_port, "approvals")
        assert rc == 0, err
        line = next(x for x in out.splitlines() if x.startswith("inc-000042"))
        assert "node-002" in line and "reset_gpu" in line
        assert "starpulse approve INCIDENT" in out
    finally:
        await channel.close()
        await controller.stop()


async def test_a_person_resolves_an_open_incident_and_the_listeners_hear_why(tmp_path: Path) -> None:
    from controller.detect.correlate import CorrelationConfig
    from controller.detect.pipeline import DetectionConfig
    from controller.service import Controller, ControllerConfig
    from tests.support.web import feed, gpu_xid

    config = ControllerConfig(
        listen="127.0.0.1:0",
        http="127.0.0.1:0",
        db_path=tmp_path / "c.db",
        detection=DetectionConfig(correlation=CorrelationConfig(settle_s=0, resolve_hold_s=3600)),
    )
    controller = Controller(config, clock=SYSTEM_CLOCK)
    await controller.start()
    heard: list[tuple[str, str]] = []

    class Listener:
        def on_incident(self, change: str, incident: Incident) -> None:
            heard.append((change, incident.id))

    controller.detection.listeners.append(Listener())
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{controller.grpc_port}", options=[("grpc.enable_http_proxy", 0)])
    try:
        feed(controller, gpu_xid("node-001", 2))
        (inc,) = controller.detection.correlator.incidents()
        admin = sgrpc.AdminStub(channel)
        detail = await admin.ResolveIncident(
            spb.IncidentActionRequest(id=inc.id, actor="alice", reason="board swapped, verified by hand")
        )
        assert detail.incident.resolved_ms > 0 and "resolved by alice" in detail.message
        assert ("resolved", inc.id) in heard
        history = controller.detection.incidents.history(inc.id)
        assert history[-1]["change"] == "resolved" and history[-1]["detail"]["by"] == "alice"
        err = await refused(admin.ResolveIncident(spb.IncidentActionRequest(id=inc.id, actor="alice", reason="x")))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "already resolved" in (err.details() or "")
    finally:
        await channel.close()
        await controller.stop()
