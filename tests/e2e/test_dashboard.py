"""The dashboard in headless Chromium: a leaf fault in a simulated cluster shows up on the fabric picture.

A controller with a small generated fabric (8 nodes, 2 blocks of 4, 4 rails, 2 spines) and
a SimCluster of node and switch agents; ``switch_down`` on leaf-b0-r1 becomes one open
``switch_fault`` incident, then Chromium loads ``/`` and the rendered DOM must mark that
leaf as the fault, linked to the incident. The screenshot is kept in test-artifacts/.

The page is loaded as ``/?live=0`` (render once, no event stream): Chromium's
``--virtual-time-budget`` does not advance while a fetch is pending, and an open
EventSource is a fetch that never ends. The stream itself is tested over HTTP in
tests/controller/outputs/web/test_web_api.py.

Needs the Debian package ``chromium`` (skipped with a reason when no binary exists).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from controller.detect.model import Incident
from starpulse.app.scenario.spec import FaultSpec
from tests.e2e.browser import CHROMIUM, Rig, run_chromium, sim_rig
from tests.helpers import wait_for

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
LEAF = "leaf-b0-r1"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="no chromium binary (apt-get install -y --no-install-recommends chromium)",
    ),
]


def leaf_incident(rig: Rig) -> Incident | None:
    for inc in rig.controller.detection.correlator.incidents(active_only=True):
        if inc.kind == "switch_fault" and inc.root_cause == LEAF:
            return inc
    return None


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with sim_rig(tmp_path) as r:
        yield r


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
    await wait_for(lambda: leaf_incident(rig) is not None, timeout=45, what=f"open switch_fault on {LEAF}")
    incident = leaf_incident(rig)
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
