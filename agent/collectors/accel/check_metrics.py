"""The series of the accelerator check (``accel.check``): whether this cycle read the chips.

Labels: ``node``, ``backend`` (nvml, amd, ascend, a plugin's) and ``tool`` (NVML, amdsmi, npu-smi).
"""

from __future__ import annotations

from agent.collectors.exposition import Families
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb


def export(f: Families, node: str, report: tpb.Report, inventory: ipb.Inventory) -> None:
    """Judged (1/0), found and expected, when ``report`` carries a check (not a switch's)."""
    if not report.HasField("accelerator_check"):
        return
    check = report.accelerator_check
    labels, values = ("node", "backend", "tool"), [node, check.backend, check.tool]
    f.gauge(
        "starpulse_agent_accelerators_judged",
        "1 when the accelerator backend read every expected chip this cycle; 0: not judged (tool missing, "
        "failing or unparseable; fewer chips than expected)",
        labels,
        values,
        1 if check.judged else 0,
    )
    f.gauge(
        "starpulse_agent_accelerators_found",
        "Accelerators the backend's tool answered for.",
        labels,
        values,
        check.found,
    )
    if check.HasField("expected"):
        f.gauge(
            "starpulse_agent_accelerators_expected",
            "Accelerators this node is expected to have (settings, or learned at first sight).",
            labels,
            values,
            check.expected,
        )
