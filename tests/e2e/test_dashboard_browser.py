"""The dashboard in a real browser, with interaction (Selenium + Debian's chromium-driver).

A controller with a small generated fabric (8 nodes, 2 blocks of 4, 4 rails, 2 spines) and a
SimCluster of node and switch agents, or a 2,048-node declared fabric with no agents. Every
wait is on a DOM condition with a timeout (tests/e2e/browser.py); screenshots are kept in
``$STARPULSE_ARTIFACTS`` or, when that is unset, under the test's ``tmp_path/artifacts``.
"""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp
import pytest

from controller.detect.model import Incident
from controller.fabric.generate import generate_fabric
from starpulse.app.scenario.spec import FaultSpec
from tests.e2e.browser import WINDOW, Rig, fabric_only_rig, open_browser, requires_browser, run_chromium, sim_rig
from tests.e2e.png import read_png
from tests.helpers import wait_for

pytestmark = [pytest.mark.slow, requires_browser]

LEAF = "leaf-b0-r1"
# The page's own colours (style.css): page, panel, block backdrop. A blank panel has only these.
BACKGROUNDS = [(0x0D, 0x11, 0x17), (0x15, 0x1B, 0x23), (0x11, 0x18, 0x20), (0x27, 0x30, 0x3B)]
BLOCK_RECTS = """
return Array.from(document.querySelectorAll('#fabric-svg rect.block-bg')).map((r) => {
  const b = r.getBoundingClientRect();
  return [Math.round(b.left), Math.round(b.top), Math.round(b.right), Math.round(b.bottom)];
});
"""


def leaf_incident_id(rig: Rig) -> str | None:
    for inc in rig.controller.detection.correlator.incidents(active_only=True):
        if inc.kind == "switch_fault" and inc.root_cause == LEAF:
            return inc.id
    return None


async def test_live_view_updates_and_a_faulty_leaf_leads_to_its_incident(tmp_path: Path) -> None:
    async with sim_rig(tmp_path) as rig, open_browser(tmp_path) as b:
        await b.get(rig.base + "/")
        await b.ready()
        await b.until("return document.getElementById('live').dataset.mode === 'live';", "the event stream")
        await b.js("window.__sameDocument = 'yes';")  # gone if the page reloads
        assert await b.js(f"return document.getElementById('sw-{LEAF}').classList.contains('fault');") is False

        rig.cluster.inject(FaultSpec(at_s=0, kind="switch_down", target=LEAF))  # type: ignore[union-attr]
        await wait_for(lambda: leaf_incident_id(rig) is not None, timeout=45, what=f"open switch_fault on {LEAF}")
        incident = leaf_incident_id(rig)
        await b.until(
            f"const g = document.getElementById('sw-{LEAF}'); return g && g.classList.contains('fault');",
            "the leaf drawn as the fault, without a reload",
            within_s=30,
        )
        assert await b.js("return window.__sameDocument;") == "yes", "the page reloaded"
        assert await b.js(f"return !!document.getElementById('incident-{incident}');")
        await b.screenshot("live-leaf-fault")

        # Click the faulty leaf: the page lands on its incident, highlighted.
        await b.js("window.scrollTo(0, 0);")
        await b.click("css selector", f"#sw-{LEAF} a")
        await b.until(f"return location.hash === '#incident-{incident}';", "the incident's anchor")
        await b.until(
            f"return document.getElementById('incident-{incident}').classList.contains('hl');",
            "the incident highlighted",
        )
        kind = await b.js(f"return document.getElementById('incident-{incident}').dataset.kind;")
        assert kind == "switch_fault"
        await b.screenshot("clicked-leaf-incident")
        # The events feed shows what the nodes behind the leaf reported, each linked to its node page.
        await b.until("return document.querySelectorAll('#events li').length > 0;", "the events feed")
        href = await b.js("return document.querySelector('#events li a.node-link').getAttribute('href');")
        assert href.startswith("#node/"), href


@pytest.mark.timeout(300)  # twenty Chromium starts on a shared machine
async def test_snapshot_never_blank_and_search_opens_a_node_page(tmp_path: Path) -> None:
    async with sim_rig(tmp_path) as rig, open_browser(tmp_path) as b:
        async with aiohttp.ClientSession() as http, http.get(rig.base + "/api/fabric") as resp:
            blocks = len((await resp.json())["blocks"])
        assert blocks == 2
        # Where the blocks are drawn (the same page at the same width lays out the same).
        await b.get(rig.base + "/?live=0")
        await b.ready()
        rects = await b.js(BLOCK_RECTS)
        assert len(rects) == blocks, f"{len(rects)} of {blocks} fabric blocks drawn"
        # Twenty snapshots taken the way a report is: Chromium's own --screenshot, which
        # cannot wait for anything the page does (the mode that used to come out blank).
        for i in range(20):
            shot = b.artifacts / f"snapshot-{i:02d}.png"
            await run_chromium(
                tmp_path / f"chrome-shot-{i}",
                "--virtual-time-budget=5000",
                f"--window-size={WINDOW[0]},{WINDOW[1]}",
                f"--screenshot={shot}",
                rig.base + "/?live=0",
            )
            image = read_png(shot.read_bytes())
            for rect in rects:
                drawn = image.count_unlike(tuple(rect), BACKGROUNDS)
                assert drawn > 500, f"snapshot {i}: fabric block at {rect} is blank ({drawn} non-background pixels)"
        await b.screenshot("snapshot")

        # The jobs view lists the controller's jobs (the job registry's own record).
        rig.controller.jobs.register_job("llm", ["node-000", "node-001"], checkpoint_dir="/ckpt/llm", world_size=16)
        await b.get(rig.base + "/")
        await b.ready()
        row = await b.js("return [...document.getElementById('job-llm').cells].map((c) => c.textContent);")
        assert row == ["llm", "running", "0", "none yet", "0", "0", "2 nodes"], row

        # Search a node, open its page: readings from its agent's latest report.
        box = await b.call(lambda: b.driver.find_element("id", "node-search"))
        await b.call(box.send_keys, "node-005\n")
        await b.until("return location.hash === '#node/node-005';", "the node page's address")
        await b.until("return document.body.dataset.nodeReady === 'node-005';", "the node page")
        assert await b.js("return document.getElementById('main-view').hidden;") is True
        assert await b.js("return document.getElementById('node-title').textContent;") == "node-005"
        gpus = await b.js("return document.querySelectorAll('#node-gpus tbody tr').length;")
        nics = await b.js("return document.querySelectorAll('#node-nics tbody tr').length;")
        report = rig.controller.registry.nodes["node-005"].latest_report
        assert report is not None
        assert (gpus, nics) == (8, len(report.nics)) and nics >= 4  # every GPU, every port (4 rails and more)
        temps = await b.js(
            "return [...document.querySelectorAll('#node-gpus tbody td:nth-child(3)')].map((td) => td.textContent);"
        )
        assert all(t.isdigit() for t in temps), temps  # a temperature per GPU, read from the report
        charts = await b.js("return document.querySelectorAll('#node-history figure.spark').length;")
        assert charts == 4  # hottest GPU, power, utilisation, DBE: the controller's own recent samples
        facts = await b.js("return document.getElementById('node-facts').textContent;")
        assert "in service" in facts and "nvidia" in facts
        await b.screenshot("node-page")
        # Back to the cluster without a reload.
        await b.click("css selector", "#node-view a.back")
        await b.until("return !document.getElementById('main-view').hidden;", "the cluster view")


async def test_large_fabric_incidents_first_collapsed_blocks_search_and_spares(tmp_path: Path) -> None:
    fabric = generate_fabric(2040, gpus_per_node=8, rails=8, nodes_per_block=64, spines=8, spares=8)
    assert len(fabric.nodes()) == 2048
    spare = next(n for n in fabric.nodes() if fabric.is_spare(n))
    spare_block = next(b for b in fabric.blocks() if spare in fabric.nodes_in_block(b))
    regular = next(n for n in fabric.nodes_in_block(spare_block) if not fabric.is_spare(n))
    async with fabric_only_rig(tmp_path, fabric) as rig, open_browser(tmp_path) as b:
        await b.get(rig.base + "/")
        await b.ready(within_s=60)
        incidents_top = await b.js("return document.getElementById('incidents-panel').getBoundingClientRect().top;")
        fabric_top = await b.js("return document.getElementById('fabric-panel').getBoundingClientRect().top;")
        height = await b.js("return window.innerHeight;")
        assert incidents_top < fabric_top and incidents_top < height, (incidents_top, fabric_top, height)
        # Every block needs no look: all collapsed to one labelled chip each, no 2,048-square grid.
        chips = await b.js("return document.querySelectorAll('#block-chips button[data-block]').length;")
        assert chips == 32
        assert await b.js("return document.querySelectorAll('#fabric-svg g.node').length;") == 0
        await b.screenshot("fabric-2048-collapsed")

        # Open the spares' block: its 64 nodes are drawn, with labels at that size.
        await b.click("id", f"block-chip-{spare_block}")
        await b.until(f"return !!document.getElementById('nd-{spare}');", "the spares' block drawn")
        assert await b.js("return document.querySelectorAll('#fabric-svg g.node').length;") == 64
        expanded = await b.js(
            f"return document.getElementById('block-chip-{spare_block}').getAttribute('aria-expanded');"
        )
        assert expanded == "true"
        # A spare that never reported is drawn as a spare (lifecycle colour), not as "never seen".
        cls = await b.js(f"return document.getElementById('nd-{spare}').getAttribute('class');")
        assert "life-spare" in cls.split() and "unknown" not in cls.split(), cls
        other = await b.js(f"return document.getElementById('nd-{regular}').getAttribute('class');")
        assert "unknown" in other.split() and "life-spare" not in other.split(), other
        await b.screenshot("fabric-2048-spares")
        await b.click("id", "blocks-expand-all")
        await b.until("return document.querySelectorAll('#fabric-svg g.node').length === 2048;", "every block drawn")

        box = await b.call(lambda: b.driver.find_element("id", "node-search"))
        await b.call(box.send_keys, "1777\n")
        await b.until("return document.body.dataset.nodeReady === 'node-1777';", "node-1777's page")
        meta = await b.js("return document.getElementById('node-meta').textContent;")
        assert meta.startswith("never seen"), meta
        await b.screenshot("node-never-seen")


HANG_STACKS = {
    "reason": "7 rank(s) wait in one place; not there: rank 3 on node-001",
    "at_ms": 1,
    # Stored waiters first here on purpose: the page itself puts the outliers first.
    "groups": [
        {"role": "waiters", "ranks": [0, 1, 2, 4, 5, 6, 7], "nodes": ["node-000", "node-001", "node-002", "node-003"],
         "frames": ["wait_for_peers (train_ranks.py)", "main (train_ranks.py)"]},
        {"role": "outlier", "ranks": [3], "nodes": ["node-001"],
         "frames": ["stuck_in_data_loader (train_ranks.py)", "main (train_ranks.py)"]},
    ],
    "outliers": [{"rank": 3, "node": "node-001", "pid": 1234}],
}  # fmt: skip


async def test_a_hang_incident_shows_its_stacks_grouped_outliers_first(tmp_path: Path) -> None:
    """The job_hang incident on the page: its ranks' stacks grouped, the odd rank's group first
    and marked, each group's ranks, nodes and innermost frames; the waiters after it."""
    fabric = generate_fabric(4, gpus_per_node=2, rails=2, nodes_per_block=4, spines=1)
    async with fabric_only_rig(tmp_path, fabric) as rig, open_browser(tmp_path) as b:
        evidence = [{"rule": "job_hang", "component": "job:llm", "message": "no step for 21 s",
                     "evidence": {"job": "llm", "stacks": HANG_STACKS}}]  # fmt: skip
        inc = rig.controller.detection.incidents.open(
            Incident(
                id="", kind="job_hang", root_cause="job:llm", component_type="job",
                affected_nodes=["node-001"], affected_jobs=["llm"], severity="critical", action="restart_app",
                evidence=evidence, opened_ms=int(time.time() * 1000),
            )
        )  # fmt: skip
        await b.get(rig.base + "/")
        await b.ready()
        groups = f"#incident-{inc.id} .stacks li.stack-group"
        await b.until(f"return document.querySelectorAll('{groups}').length === 2;", "the hang's stack groups")
        roles = await b.js(f"return Array.from(document.querySelectorAll('{groups}')).map((g) => g.dataset.role);")
        assert roles == ["outlier", "waiters"]
        first = await b.js(f"return document.querySelector('{groups}').textContent;")
        assert "ranks 3 on node-001" in first and "stuck_in_data_loader (train_ranks.py)" in first
        reason = await b.js(f"return document.querySelector('#incident-{inc.id} .stacks-reason').textContent;")
        assert "not there: rank 3 on node-001" in reason
        await b.screenshot("hang-stacks")
