"""The dashboard's per-node page, jobs view and snapshot page, against a controller without agents.

Nodes are registered with Hello messages and given a hand-made latest report; a job is
registered in the controller's own JobRegistry; every assertion is about the web layer.
"""

from __future__ import annotations

import json
import re
from typing import Any

from controller.outputs.web.page import SNAPSHOT_SLOT, embed
from controller.service import Controller
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb
from tests.support import web as shared
from tests.support.web import Client, get_json, register

# The web API tests' fixtures: the fabric (8 nodes + 1 spare), a controller on it, a client.
fabric = shared.fabric
ctl = shared.ctl
client = shared.client

SNAPSHOT = re.compile(r'<script id="snapshot" type="application/json">(.*?)</script>', re.S)


def report() -> tpb.Report:
    gpus = [
        tpb.GpuSample(index=i, temperature_c=60 + i, power_w=300 + i, ecc_dbe_volatile=1 if i == 3 else 0)
        for i in range(8)
    ]
    gpus[3].nvlinks.extend([tpb.NvLinkSample(link=0, up=True), tpb.NvLinkSample(link=1, up=False)])
    gpus[7].ClearField("temperature_c")  # not every GPU reports every field: absent means unsupported
    nic = tpb.NicSample(rdma_device="mlx5_0", port=1, netdev="ib0", state="ACTIVE", rate_gbps=400)
    nic.netdev_stats["rx_bytes"] = 1234
    return tpb.Report(seq=1, timestamp_ms=1000, gpus=gpus, nics=[nic])


def with_report(ctl: Controller, name: str) -> None:
    inv = ipb.Inventory(gpus=[ipb.GpuInfo(index=i, model="NVIDIA H100 80GB HBM3") for i in range(8)])
    ctl.registry.register(spb.Hello(node_id=name, role=ipb.NODE_ROLE_COMPUTE, inventory=inv, buffer_epoch="e1"))
    rec = ctl.registry.nodes[name]
    rec.latest_report = report()


async def test_node_page_has_readings_lifecycle_and_vendor(ctl: Controller, client: Client) -> None:
    with_report(ctl, "node-001")
    body = await get_json(client, "/api/node/node-001")
    assert body["name"] == "node-001" and body["state"] == "online" and body["lifecycle"] == "in_service"
    assert len(body["gpus"]) == 8
    g0, g3, g7 = body["gpus"][0], body["gpus"][3], body["gpus"][7]
    assert (g0["vendor"], g0["model"], g0["temperature_c"], g0["power_w"]) == (
        "nvidia",
        "NVIDIA H100 80GB HBM3",
        60,
        300,
    )
    assert g3["ecc_dbe_volatile"] == 1 and (g3["nvlink_up"], g3["nvlink_total"], g3["nvlink_down"]) == (1, 2, [1])
    assert g7["temperature_c"] is None  # absent, not 0
    assert body["nics"] == [
        {
            "device": "mlx5_0/1",
            "netdev": "ib0",
            "link_layer": "",
            "state": "ACTIVE",
            "phys_state": "",
            "rate_gbps": 400.0,
            "rx_bytes": 1234,
            "tx_bytes": None,
        }
    ]


async def test_node_page_for_a_spare_never_seen_and_for_no_such_node(ctl: Controller, client: Client) -> None:
    spare = next(n for n in ctl.detection.fabric.nodes() if ctl.detection.fabric.is_spare(n))  # type: ignore[union-attr]
    body = await get_json(client, f"/api/node/{spare}")
    assert (body["state"], body["spare"], body["gpus"], body["last_seen_ms"]) == ("unknown", True, [], None)
    missing = await get_json(client, "/api/node/nosuch", status=404)
    assert "nosuch" in missing["error"]
    register(ctl, "leaf-b0-r0", role=ipb.NODE_ROLE_SWITCH, gpus=0)
    await get_json(client, "/api/node/leaf-b0-r0", status=404)  # a switch has no node page
    await get_json(client, "/api/node/nosuch/history", status=404)


async def test_history_endpoint_follows_samples(ctl: Controller, client: Client) -> None:
    from controller.outputs.web.api import STATE_KEY

    with_report(ctl, "node-002")
    state = client.server.app[STATE_KEY]
    empty = await get_json(client, "/api/node/node-002/history")
    assert empty["t_ms"] == [] or len(empty["t_ms"]) == 1  # the sampler may have run once at start
    for t in (10_000, 25_000):
        state.history.sample(ctl.registry.nodes.values(), t)
    body = await get_json(client, "/api/node/node-002/history")
    assert body["t_ms"][-2:] == [10_000, 25_000]
    assert body["series"]["temperature_c"][-1] == 66  # the hottest GPU that reported
    assert body["series"]["power_w"][-1] == sum(300 + i for i in range(8))
    assert body["series"]["ecc_dbe"][-1] == 1


async def test_jobs_view(ctl: Controller, client: Client) -> None:
    ctl.jobs.register_job("train-a", ["node-000", "node-001"], checkpoint_dir="/ckpt/a", world_size=16)
    body = await get_json(client, "/api/jobs")
    assert body["available"] is True
    (job,) = body["jobs"]
    assert (job["job"], job["nodes"], job["world_size"], job["restarts"], job["downtime_s"]) == (
        "train-a",
        ["node-000", "node-001"],
        16,
        0,
        0.0,
    )
    assert job["step"] == 0 and job["last_checkpoint_ms"] is None


def snapshot_of(html: str) -> Any:
    m = SNAPSHOT.search(html)
    assert m, "no snapshot slot in the page"
    return json.loads(m.group(1)) if m.group(1) else None


async def test_snapshot_page_carries_what_the_page_would_fetch(ctl: Controller, client: Client) -> None:
    with_report(ctl, "node-001")
    live = await client.get("/")
    assert snapshot_of(await live.text()) is None  # the live page fetches
    resp = await client.get("/?live=0")
    assert resp.status == 200 and resp.content_type == "text/html"
    data = snapshot_of(await resp.text())
    assert set(data) == {"fabric", "incidents", "summary", "nodes"}
    assert data["fabric"] == await get_json(client, "/api/fabric")
    assert data["nodes"] == await get_json(client, "/api/nodes")
    assert data["incidents"]["incidents"] == (await get_json(client, "/api/incidents?all=1&limit=200"))["incidents"]
    assert data["summary"]["nodes"] == (await get_json(client, "/api/summary"))["nodes"]


def test_embed_cannot_close_the_script_early() -> None:
    page = f"<html>{SNAPSHOT_SLOT}</html>"
    out = embed(page, {"name": "</script><script>alert(1)</script>"})
    assert out.count("</script>") == 1
    assert json.loads(SNAPSHOT.search(out).group(1)) == {"name": "</script><script>alert(1)</script>"}  # type: ignore[union-attr]
