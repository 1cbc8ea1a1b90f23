"""The dashboard's JSON endpoints against a controller with a generated fabric and hand-made conditions.

No agents: nodes are registered with Hello messages and incidents come from conditions fed
straight to the correlator (settle 0), so every assertion is about the web layer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from controller.detect.model import Condition
from controller.fabric import Fabric
from controller.ingest.registry import UNREACHABLE
from controller.outputs.web import STATIC_DIR
from controller.outputs.web.api import STATE_KEY, element_of, mark_components
from controller.service import Controller
from starpulse.core.clock import SYSTEM_CLOCK, FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from tests.support import web as shared
from tests.support.web import Client, cond, feed, get_json, gpu_xid, make_controller, nic_down, register, serve

# Pytest fixtures shared with the web views tests: the fabric (8 nodes + 1 spare), a controller on it, a client.
fabric = shared.fabric
ctl = shared.ctl
client = shared.client


def resolve(ctl: Controller, *conditions: Condition) -> None:
    t = SYSTEM_CLOCK.time_ms()
    feed(ctl, *(replace(c, resolved_ms=t, last_seen_ms=t) for c in conditions), kind="resolved")
    ctl.detection.tick()


def leaf_of(body: Mapping[str, Any], name: str) -> dict[str, Any]:
    return next(lf for b in body["blocks"] for lf in b["leaves"] if lf["name"] == name)


def node_of(body: Mapping[str, Any], name: str) -> dict[str, Any]:
    return next(n for b in body["blocks"] for n in b["nodes"] if n["name"] == name)


# -- /api/fabric ---------------------------------------------------------------------------


async def test_fabric_layout_without_incidents(ctl: Controller, client: Client) -> None:
    for i in range(4):
        register(ctl, f"node-00{i}")
    ctl.registry.nodes["node-001"].state = UNREACHABLE
    body = await get_json(client, "/api/fabric")
    assert body["fabric"] is True and body["rails"] == [0, 1, 2, 3] and body["links"] == [] and body["nodes"] == []
    assert [s["name"] for s in body["spines"]] == ["spine-0", "spine-1"]
    assert body["spines"][0] == {
        "name": "spine-0",
        "index": 0,
        "state": None,  # no switch agent
        "status": "ok",
        "root_cause_of": [],
        "affected_by": [],
        "parts": [],
    }
    assert [b["block"] for b in body["blocks"]] == [0, 1, 2]
    b0 = body["blocks"][0]
    assert [(lf["name"], lf["rail"], lf["spines"]) for lf in b0["leaves"]] == [
        (f"leaf-b0-r{r}", r, [0, 1]) for r in range(4)
    ]
    assert [n["name"] for n in b0["nodes"]] == ["node-000", "node-001", "node-002", "node-003"]
    assert [n["state"] for n in b0["nodes"]] == ["online", "unreachable", "online", "online"]
    assert node_of(body, "node-000")["last_seen_ms"] > 0
    unseen = node_of(body, "node-005")
    assert (unseen["state"], unseen["last_seen_ms"], unseen["status"]) == ("unknown", None, "ok")
    assert node_of(body, "node-008")["spare"] is True and not node_of(body, "node-007")["spare"]
    assert body["summary"]["node"] == 9 and body["summary"]["spine"] == 2


async def test_leaf_fault_marks_leaf_as_root_and_nodes_as_affected(ctl: Controller, client: Client) -> None:
    feed(ctl, nic_down("node-000", 3), nic_down("node-001", 3), nic_down("node-002", 3))
    (inc,) = ctl.detection.correlator.incidents()
    assert (inc.kind, inc.root_cause) == ("switch_fault", "leaf-b0-r3")
    body = await get_json(client, "/api/fabric")
    leaf = leaf_of(body, "leaf-b0-r3")
    assert (leaf["status"], leaf["root_cause_of"], leaf["affected_by"]) == (inc.severity, [inc.id], [])
    for name in inc.affected_nodes:
        node = node_of(body, name)
        assert node["affected_by"] == [inc.id] and node["root_cause_of"] == [] and node["status"] == inc.severity
    assert leaf_of(body, "leaf-b0-r2")["status"] == "ok"
    assert leaf_of(body, "leaf-b1-r3")["status"] == "ok"
    assert node_of(body, "node-004")["status"] == "ok"


async def test_gpu_and_link_faults(ctl: Controller, fabric: Fabric, client: Client) -> None:
    port = fabric.port_of("node-005/nic-2")
    feed(
        ctl,
        gpu_xid("node-006", 2),
        nic_down("node-005", 2),
        cond(f"leaf-b1-r2:{port}", "switch_port_down", "switch_port", "switch", None),
    )
    by_kind = {i.kind: i for i in ctl.detection.correlator.incidents()}
    gpu, link = by_kind["gpu_fault"], by_kind["link_fault"]
    body = await get_json(client, "/api/fabric")
    node6 = node_of(body, "node-006")
    assert node6["root_cause_of"] == [gpu.id] and node6["parts"] == ["node-006/gpu-2"] and node6["status"] == "fatal"
    assert body["links"] == [
        {
            "name": "node-005/nic-2<->leaf-b1-r2",
            "a": "node-005",
            "b": "leaf-b1-r2",
            "status": link.severity,
            "incident": link.id,
            "kind": "link_fault",
        }
    ]
    # A cable's ends are touched, not blamed.
    node5, leaf = node_of(body, "node-005"), leaf_of(body, "leaf-b1-r2")
    assert node5["root_cause_of"] == [] and node5["affected_by"] == [link.id] and node5["parts"] == ["node-005/nic-2"]
    assert leaf["root_cause_of"] == [] and leaf["affected_by"] == [link.id]


async def test_fabric_without_declared_fabric_lists_nodes(tmp_path: Path) -> None:
    ctl = make_controller(tmp_path, None, SYSTEM_CLOCK)
    register(ctl, "gpu-b")
    register(ctl, "gpu-a")
    register(ctl, "tor-1", role=ipb.NODE_ROLE_SWITCH)
    feed(ctl, gpu_xid("gpu-a", 1))
    client = await serve(ctl)
    try:
        body = await get_json(client, "/api/fabric")
        assert (body["fabric"], body["summary"], body["spines"], body["blocks"], body["rails"]) == (
            False,
            None,
            [],
            [],
            [],
        )
        assert [n["name"] for n in body["nodes"]] == ["gpu-a", "gpu-b"]
        assert body["nodes"][0]["status"] == "fatal" and body["nodes"][0]["parts"] == ["gpu-a/gpu-1"]
        summary = await get_json(client, "/api/summary")
        assert summary["nodes"] == {"total": 2, "online": 2, "unreachable": 0}
        assert summary["switches"] == {"online": 1} and summary["fabric"] is None
    finally:
        await client.close()
        ctl.store.close()


def test_element_of_and_marks() -> None:
    assert element_of("node-003/gpu-5") == "node-003"
    assert element_of("leaf-b0-r3:Ethernet8") == "leaf-b0-r3"
    assert element_of("spine-1") == "spine-1"
    marks, links = mark_components([])
    assert marks == {} and links == []


# -- /api/incidents ------------------------------------------------------------------------


async def test_incidents_open_by_default_all_with_resolved(ctl: Controller, client: Client) -> None:
    first = gpu_xid("node-000", 1)
    feed(ctl, first)
    await asyncio.sleep(0.002)  # distinct opened_ms: newest first is by time
    feed(ctl, gpu_xid("node-004", 2))
    resolve(ctl, first)
    body = await get_json(client, "/api/incidents")
    assert body["all"] is False and body["limit"] == 200
    (row,) = body["incidents"]
    assert set(row) == {
        "id",
        "kind",
        "root_cause",
        "component_type",
        "affected_nodes",
        "affected_jobs",
        "severity",
        "action",
        "open",
        "opened_ms",
        "updated_ms",
        "resolved_ms",
        "evidence",
    }
    assert (row["kind"], row["root_cause"], row["open"], row["resolved_ms"]) == (
        "gpu_fault",
        "node-004/gpu-2",
        True,
        None,
    )
    assert row["affected_nodes"] == ["node-004"] and row["evidence"][0]["component"] == "node-004/gpu-2"

    body = await get_json(client, "/api/incidents?all=1")
    assert [r["root_cause"] for r in body["incidents"]] == ["node-004/gpu-2", "node-000/gpu-1"]
    resolved = body["incidents"][1]
    assert resolved["open"] is False and resolved["resolved_ms"] >= resolved["opened_ms"]
    assert len((await get_json(client, "/api/incidents?all=true&limit=1"))["incidents"]) == 1
    assert len((await get_json(client, "/api/incidents?all=0"))["incidents"]) == 1


@pytest.mark.parametrize(
    ("query", "needle"),
    [
        ("all=maybe", "all must be 1 or 0"),
        ("limit=abc", "limit must be an integer"),
        ("limit=0", "between 1 and 10000"),
        ("limit=10001", "between 1 and 10000"),
        ("open=1", "unknown query parameter"),
    ],
)
async def test_incidents_bad_params(client: Client, query: str, needle: str) -> None:
    body = await get_json(client, f"/api/incidents?{query}", status=400)
    assert needle in body["error"]


async def test_other_endpoints_reject_unknown_params(client: Client) -> None:
    for path in ("/api/fabric?x=1", "/api/summary?verbose=1", "/api/stream?since=3"):
        body = await get_json(client, path, status=400)
        assert "unknown query parameter" in body["error"]


# -- /api/summary --------------------------------------------------------------------------


async def test_summary_counts_and_default_breaker(ctl: Controller, client: Client) -> None:
    for i in range(3):
        register(ctl, f"node-00{i}")
    register(ctl, "leaf-b0-r0", role=ipb.NODE_ROLE_SWITCH)
    ctl.registry.nodes["node-002"].state = UNREACHABLE
    feed(ctl, gpu_xid("node-000", 1), nic_down("node-000", 1), nic_down("node-001", 1))
    body = await get_json(client, "/api/summary")
    assert body["nodes"] == {"total": 9, "online": 2, "unreachable": 1, "unknown": 6}
    assert body["switches"] == {"online": 1}
    assert body["incidents"]["open"] == 2
    assert body["incidents"]["by_kind"] == {"gpu_fault": 1, "switch_fault": 1}
    assert sum(body["incidents"]["by_severity"].values()) == 2
    assert body["breaker"] == {"state": "closed", "available": False}
    assert body["fabric"]["leaf"] == 12 and isinstance(body["version"], int) and body["now_ms"] > 0


async def test_breaker_provider_plugs_in(ctl: Controller) -> None:
    calls: list[int] = []

    def breaker() -> dict[str, Any]:
        calls.append(1)
        return {"state": "open", "reason": "3 evictions in 10 min"}

    client = await serve(ctl, breaker=breaker)
    try:
        body = await get_json(client, "/api/summary")
        assert body["breaker"] == {"available": True, "state": "open", "reason": "3 evictions in 10 min"}

        def broken() -> dict[str, Any]:
            raise RuntimeError("boom")

        client.app[STATE_KEY].breaker = broken  # a provider can be swapped in after start
        body = await get_json(client, "/api/summary")
        assert body["breaker"]["available"] is False and body["breaker"]["state"] == "unknown"
    finally:
        await client.close()


# -- /api/stream ---------------------------------------------------------------------------


async def read_event(resp: aiohttp.ClientResponse, within_s: float = 5.0) -> tuple[str, dict[str, Any]]:
    """The next SSE event (comments and retry lines skipped)."""
    event, data = "message", ""

    async def read() -> tuple[str, dict[str, Any]]:
        nonlocal event, data
        while True:
            raw = await resp.content.readline()
            assert raw, "stream ended"
            line = raw.decode().rstrip("\n")
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data += line[5:].strip()
            elif line == "" and data:
                return event, json.loads(data)

    return await asyncio.wait_for(read(), within_s)


async def test_stream_pushes_changes(ctl: Controller, client: Client) -> None:
    register(ctl, "node-000")
    resp = await client.get("/api/stream")
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    kind, first = await read_event(resp)
    assert kind == "changed" and isinstance(first["version"], int)

    register(ctl, "node-001")  # a node appears
    kind, second = await read_event(resp)
    assert kind == "changed" and second["version"] > first["version"]

    feed(ctl, gpu_xid("node-001", 0))  # an incident opens
    _, third = await read_event(resp)
    assert third["version"] > second["version"]

    ctl.registry.nodes["node-000"].last_seen_ms += 5000  # a report alone is not a change
    with pytest.raises(TimeoutError):
        await read_event(resp, within_s=0.4)
    resp.close()


async def test_open_stream_does_not_hold_up_shutdown(ctl: Controller) -> None:
    """Closing the server ends an open stream at once instead of waiting for it.

    A stream that held shutdown would hold it for its keepalive and then aiohttp's 60 s
    shutdown timeout; the bound below only turns such a hang into a failure.
    """
    client = await serve(ctl, poll_s=0.05)
    resp = await client.get("/api/stream")
    await read_event(resp)
    await asyncio.wait_for(client.close(), timeout=30)
    resp.close()


# -- page and assets -----------------------------------------------------------------------


async def test_page_and_assets_are_served(client: Client) -> None:
    resp = await client.get("/")
    assert resp.status == 200 and resp.content_type == "text/html"
    html = await resp.text()
    assert 'src="/static/app.js"' in html and 'href="/static/style.css"' in html
    assert 'src="/static/views.js"' in html
    for path, ctype in (
        ("/static/app.js", "javascript"),
        ("/static/views.js", "javascript"),
        ("/static/style.css", "text/css"),
    ):
        r = await client.get(path)
        assert r.status == 200 and ctype in r.content_type, path
    # Existing routes stay.
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/api/nodes")).status == 200


def test_assets_reference_nothing_outside_the_controller() -> None:
    """No CDN, no web fonts: management networks have no internet."""
    allowed = {"http://www.w3.org/2000/svg"}
    for name in ("index.html", "app.js", "views.js", "style.css"):
        text = (STATIC_DIR / name).read_text()
        for scheme in ("http://", "https://", "//cdn", "@import", "@font-face"):
            start = 0
            while (i := text.find(scheme, start)) >= 0:
                url = text[i : i + 40]
                assert any(url.startswith(a) for a in allowed), f"{name}: external reference {url!r}"
                start = i + 1


def test_change_signature_moves_with_presence_not_with_reports(tmp_path: Path) -> None:
    """The dashboard's once-a-second change check: a node going unreachable or coming back changes it."""
    from controller.outputs.web.api import DashboardState

    clock = FakeClock(SYSTEM_CLOCK.time_ms())
    ctl = make_controller(tmp_path, None, clock)
    register(ctl, "node-000")
    state = DashboardState(ctl.registry, ctl.queries)
    first = state.signature()
    node = ctl.registry.nodes["node-000"]
    ctl.registry.touch(node)  # an ordinary report: nothing on the page changes
    assert state.signature() == first
    clock.advance(60)
    assert ctl.registry.sweep() == [node]
    gone = state.signature()
    assert gone != first
    ctl.registry.touch(node)
    assert state.signature() not in (first, gone)
    register(ctl, "node-001")  # a new node shows up
    assert len({first, gone, state.signature()}) == 3
