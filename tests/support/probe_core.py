"""The decision core as the probe-mesh tests drive it: a declared 2-rail fabric, probing on,
5 s windows, replanned at once, each node greeted with its rail NICs."""

from __future__ import annotations

from pathlib import Path

from controller.core import DecisionCore
from controller.detect.correlate import CorrelationConfig
from controller.detect.pipeline import DetectionConfig
from controller.fabric.model import Fabric
from controller.fabric.probeplan import ProbeConfig
from controller.metrics import ControllerMetrics
from controller.settings import ControllerConfig
from controller.store import Store
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb


def probe_core(tmp_path: Path, fabric: Fabric, clock: FakeClock) -> DecisionCore:
    probes = ProbeConfig(enabled=True, window_s=5, replan_min_s=0)
    config = ControllerConfig(
        db_path=tmp_path / "c.db",
        fabric=fabric,
        heartbeat_timeout_s=3600.0,
        detection=DetectionConfig(correlation=CorrelationConfig(settle_s=2.0), probes=probes),
    )
    return DecisionCore(config, clock, Store(config.db_path), ControllerMetrics(), fabric=fabric)


def hello(core: DecisionCore, node: str, rails: int = 2) -> None:
    nics = [ipb.NicInfo(rdma_device=f"mlx5_{r}", port=1, netdev=f"rail{r}", paired_gpu_index=r) for r in range(rails)]
    core.hello(spb.Hello(node_id=node, role=ipb.NODE_ROLE_COMPUTE, inventory=ipb.Inventory(nics=nics)))
