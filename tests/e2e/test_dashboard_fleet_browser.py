"""The dashboard's fleet reliability panel in a real browser (Selenium + chromium-driver).

The page loads ``/api/fleet`` by itself (a fresh controller: no history, said so); then the
same drawing code is given a known three-day series and the plots must show it: one bar per
cause and day, stacked in proportion, a point per day with a figure (none where the figure is
null), one line per job.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.fabric.generate import generate_fabric
from tests.e2e.browser import fabric_only_rig, open_browser, requires_browser

pytestmark = [pytest.mark.slow, requires_browser]

SERIES = {
    "days": 3,
    "causes": ["gpu", "nic", "hang"],
    "report": {
        "faults": {"total": 4, "per_1000_gpu_days": 12.5},
        "mttr": {"fault_to_node_back_in_pool": {"mean_s": 5400.0}},
        "ettr": {"fleet": 0.95},
        "evictions": {"total": 3, "wrongful": 1},
    },
    "series": [
        {"from_ms": 0, "to_ms": 1, "gpu_days": 32, "faults": 3, "by_cause": {"gpu": 62.5, "nic": 31.25, "hang": 0},
         "mttr_pool_h": 1.0, "mttr_job_h": 0.5, "ettr": {"llm": 0.9, "eval": 1.0}},
        {"from_ms": 1, "to_ms": 2, "gpu_days": 32, "faults": 0, "by_cause": {"gpu": 0, "nic": 0, "hang": 0},
         "mttr_pool_h": None, "mttr_job_h": None, "ettr": {"llm": 1.0, "eval": 1.0}},
        {"from_ms": 2, "to_ms": 3, "gpu_days": 32, "faults": 1, "by_cause": {"gpu": 31.25, "nic": 0, "hang": 0},
         "mttr_pool_h": 2.0, "mttr_job_h": 1.0, "ettr": {"llm": 0.95, "eval": 0.99}},
    ],
}  # fmt: skip

BARS = """
return Array.from(document.querySelectorAll('#fleet-causes rect.fleet-bar')).map((r) => {
  const b = r.getBoundingClientRect();
  return [r.dataset.cause, Number(r.dataset.bucket), b.height];
});
"""


async def test_the_fleet_panel_draws_rates_mttr_and_ettr(tmp_path: Path) -> None:
    fabric = generate_fabric(nodes=4, gpus_per_node=8, rails=2, nodes_per_block=4, spines=1, spares=1)
    async with fabric_only_rig(tmp_path, fabric) as rig, open_browser(tmp_path) as b:
        await b.get(rig.base + "/")
        await b.ready()
        await b.until("return document.getElementById('fleet-panel').dataset.loaded === '1';", "the fleet panel")
        assert await b.js("return document.getElementById('fleet-empty').hidden;") is False  # no history yet
        assert "0 faults" in await b.js("return document.getElementById('fleet-headline').textContent;")

        await b.js(f"window.starpulse.fleet.render({json.dumps(SERIES)});")
        assert await b.js("return document.getElementById('fleet-empty').hidden;") is True
        bars = await b.js(BARS)
        assert sorted((c, i) for c, i, _ in bars) == [("gpu", 0), ("gpu", 2), ("nic", 0)]  # no bar for a zero
        height = {(c, i): h for c, i, h in bars}
        assert height[("gpu", 0)] == pytest.approx(2 * height[("nic", 0)], rel=0.05)
        assert height[("gpu", 0)] == pytest.approx(2 * height[("gpu", 2)], rel=0.05)
        mttr = await b.js("return Array.from(document.querySelectorAll('#fleet-mttr circle')).map((c) => "
                          "[c.dataset.series, Number(c.dataset.bucket)]);")  # fmt: skip
        assert sorted(mttr) == [["job resumed", 0], ["job resumed", 2], ["to pool", 0], ["to pool", 2]]  # none on day 1
        lines = await b.js("return document.querySelectorAll('#fleet-ettr polyline').length;")
        assert lines == 2  # one per job
        legend = await b.js("return document.getElementById('fleet-causes-legend').textContent;")
        assert "gpu" in legend and "nic" in legend and "hang" not in legend
        headline = await b.js("return document.getElementById('fleet-headline').textContent;")
        assert "4 faults, 12.500 per 1,000 GPU-days" in headline and "1.50 h" in headline and "95.0 %" in headline
        await b.js("document.getElementById('fleet-panel').scrollIntoView();")
        await b.screenshot("fleet-panel")
