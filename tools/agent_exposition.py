"""Print the agent's Prometheus exposition for simulated nodes, to diff before and after a change.

Four real collection cycles on the simulator (an NVIDIA compute node with its NICs and host,
a SONiC switch with a port down, a storm and weak optics, an AMD node and an Ascend node),
each translated by the agent's metrics collector; the values that change run to run
(collector durations, the report's timestamp, the host's load) are masked, so two trees'
outputs compare byte for byte:

    PYTHONPATH=. python tools/agent_exposition.py > after.txt   (needs the test dependencies)
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

_VARYING = re.compile(
    r"^((?:starpulse_agent_collector_duration_seconds|starpulse_agent_last_report_timestamp_seconds"
    r"|starpulse_host_[a-z0-9_]+)\{[^}]*\}) .*$",
    re.MULTILINE,
)


def expositions(workdir: Path) -> list[str]:
    from agent.factory import build_collectors
    from agent.runtime import CollectorSet
    from agent.sim.node import SimNode
    from tests.support.metrics import agent_expositions, exposition

    out = agent_expositions(workdir)
    for vendor in ("amd", "ascend"):
        sim = SimNode(f"node-{vendor}", workdir / vendor, gpus=2, nics=1, vendor=vendor)
        plan = build_collectors("sim", None, sim=sim, kmsg_path=None, lldp=False, ethtool=False)
        collectors = CollectorSet(plan.collectors)
        collectors.probe()
        inventory = collectors.describe()
        for hook in plan.inventory_hooks:
            hook(inventory)
        report = collectors.collect(seq=1).report
        collectors.close()
        out.append(exposition(f"node-{vendor}", inventory, report, None))
    return out


def main() -> int:
    import structlog

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # the logs stay off the diff
    with tempfile.TemporaryDirectory() as d:
        texts = expositions(Path(d))
    sys.stdout.write("\n".join(_VARYING.sub(r"\1 X", t) for t in texts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
