"""The dashboard in headless Chromium: a leaf fault in a simulated cluster shows up on the fabric picture.

A controller with a small generated fabric (8 nodes, 2 blocks of 4, 4 rails, 2 spines) and
a SimCluster of node and switch agents; ``switch_down`` on leaf-b0-r1 becomes one open
``switch_fault`` incident, then Chromium loads ``/`` and the rendered DOM must mark that
leaf as the fault, linked to the incident. The screenshot is kept in test-artifacts/.

The page is loaded as ``/?live=0`` (render once, no event stream): Chromium's
``--virtual-time-budget`` does not advance while a fetch is pending, and an open
EventSource is a fetch that never ends. The stream itself is tested over HTTP in
tests/controller/test_web_api.py.

Needs the Debian package ``chromium`` (skipped with a reason when no binary exists).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from controller.detect.correlate import CorrelationConfig
from controller.detect.model import Incident
from controller.detect.pipeline import DetectionConfig
from controller.service import Controller, ControllerConfig
from starpulse.app.scenario.cluster import SimCluster
from starpulse.app.scenario.spec import FaultSpec, parse_scenario
from tests.helpers import free_port, wait_for

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
LEAF = "leaf-b0-r1"
CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium_binary() -> str | None:
    override = os.environ.get("STARPULSE_CHROMIUM")
    if override:
        return override if shutil.which(override) else None
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


CHROMIUM = chromium_binary()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="no chromium binary (apt-get install -y --no-install-recommends chromium)",
    ),
]


async def run_chromium(profile: Path, *args: str, within_s: float = 60.0) -> str:
    """Run headless Chromium without blocking the loop the controller serves on; returns stdout."""
    assert CHROMIUM is not None
    proc = await asyncio.create_subprocess_exec(
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), within_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise AssertionError(f"chromium {args[-2:]} timed out after {within_s}s") from None
    assert proc.returncode == 0, f"chromium exited {proc.returncode}: {err.decode(errors='replace')[-2000:]}"
    return out.decode(errors="replace")


@dataclass
class Rig:
    controller: Controller
    cluster: SimCluster

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.controller.http_port}"

    def leaf_incident(self) -> Incident | None:
        for inc in self.controller.detection.correlator.incidents(active_only=True):
            if inc.kind == "switch_fault" and inc.root_cause == LEAF:
                return inc
        return None


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    scenario = parse_scenario(
        {
            "name": "dashboard",
            "fabric": {"nodes": 8, "gpus_per_node": 8, "rails": 4, "nodes_per_block": 4, "spines": 2},
            "interval_s": 1.0,
            "duration_s": 60,
        }
    )
    controller = Controller(
        ControllerConfig(
            listen=f"127.0.0.1:{free_port()}",
            http="127.0.0.1:0",
            db_path=tmp_path / "controller.db",
            fabric=scenario.build_fabric(),
            heartbeat_timeout_s=6,
            sweep_interval_s=0.25,
            detection=DetectionConfig(correlation=CorrelationConfig(settle_s=2)),
        )
    )
    await controller.start()
    cluster = SimCluster(scenario, tmp_path, f"127.0.0.1:{controller.grpc_port}")
    await cluster.start()
    try:
        await wait_for(
            lambda: all(
                (rec := controller.registry.nodes.get(n)) is not None and rec.latest_report is not None
                for n in cluster.agents
            ),
            timeout=40,
            what="every agent registered and reported",
        )
        yield Rig(controller, cluster)
    finally:
        await cluster.stop()
        await controller.stop()


def element_tag(dom: str, element_id: str) -> str:
    """The opening tag of the element with this id (the DOM is Chromium's serialization)."""
    m = re.search(rf'<[a-z]+\b[^>]*\bid="{re.escape(element_id)}"[^>]*>', dom)
    assert m, f"no element with id {element_id!r} in the rendered page"
    return m.group(0)


def attr(tag: str, name: str) -> str | None:
    m = re.search(rf'\b{re.escape(name)}="([^"]*)"', tag)
    return m.group(1) if m else None


async def test_leaf_fault_is_drawn_and_linked(rig: Rig, tmp_path: Path) -> None:
    rig.cluster.inject(FaultSpec(at_s=0, kind="switch_down", target=LEAF))
    await wait_for(lambda: rig.leaf_incident() is not None, timeout=45, what=f"open switch_fault on {LEAF}")
    incident = rig.leaf_incident()
    assert incident is not None

    # The API agrees before the browser looks.
    async with aiohttp.ClientSession() as http, http.get(rig.base + "/api/fabric") as resp:
        fabric = await resp.json()
    leaf = next(lf for b in fabric["blocks"] for lf in b["leaves"] if lf["name"] == LEAF)
    assert incident.id in leaf["root_cause_of"] and leaf["status"] in ("critical", "fatal", "warning")

    dom = await run_chromium(tmp_path / "chrome-dom", "--virtual-time-budget=5000", "--dump-dom", rig.base + "/?live=0")
    tag = element_tag(dom, f"sw-{LEAF}")
    classes = (attr(tag, "class") or "").split()
    assert {"switch", "leaf", "fault"} <= set(classes), tag
    assert attr(tag, "data-incident") == incident.id, tag
    # The leaf links to its incident in the timeline, which is on the page.
    leaf_markup = dom[dom.index(tag) : dom.index("</g>", dom.index(tag))]
    assert f'href="#incident-{incident.id}"' in leaf_markup
    assert f'id="incident-{incident.id}"' in dom
    # Healthy leaves are not marked; the other block's leaves are untouched.
    assert "fault" not in (attr(element_tag(dom, "sw-leaf-b1-r1"), "class") or "").split()
    assert "fault" not in (attr(element_tag(dom, "sw-leaf-b0-r2"), "class") or "").split()
    # Nodes behind the leaf are drawn as affected, not as the culprit.
    node_tag = element_tag(dom, "nd-node-000")
    assert "affected" in (attr(node_tag, "class") or "").split() and "fault" not in (attr(node_tag, "class") or "")

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dashboard-leaf-fault.png"
    shot.unlink(missing_ok=True)
    await run_chromium(
        tmp_path / "chrome-shot",
        "--virtual-time-budget=5000",
        "--window-size=1400,900",
        f"--screenshot={shot}",
        rig.base + "/?live=0",
    )
    assert shot.exists(), "no screenshot written"
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000, f"screenshot suspiciously small ({len(data)} bytes)"
