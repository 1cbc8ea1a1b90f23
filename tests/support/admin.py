"""A controller with its Admin service on loopback and a client to it, and reading a refusal."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from controller.fabric import generate_fabric
from controller.heal.guards import GuardConfig
from controller.heal.scheduler.sim import SimScheduler
from controller.service import Controller, ControllerConfig, HealSettings
from starpulse.core.clock import SYSTEM_CLOCK


async def start_rig(
    tmp_path: Path, heal: bool, mode: str = "enforce"
) -> tuple[Controller, SimScheduler, grpc.aio.Channel]:
    fabric = generate_fabric(5, 2, 2, 4, 2, spares=1)  # node-000..node-005; node-005 is the spare
    sim = SimScheduler(fabric.nodes())
    config = ControllerConfig(
        listen="127.0.0.1:0",
        http="127.0.0.1:0",
        db_path=tmp_path / "c.db",
        fabric=fabric,
        jobs={"train-1": ["node-000", "node-001"]},
        heal=HealSettings(scheduler=sim, guards=GuardConfig(mode=mode)) if heal else None,  # type: ignore[arg-type]
        grace_s=0.5,
    )
    controller = Controller(config, clock=SYSTEM_CLOCK)
    await controller.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{controller.grpc_port}", options=[("grpc.enable_http_proxy", 0)])
    return controller, sim, channel


async def refused(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    return info.value
