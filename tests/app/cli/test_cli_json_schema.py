"""Every ``--json`` command prints one JSON document carrying its versioned ``schema`` (docs/json.md).

The commands are found by walking the CLI's parser, so a new ``--json`` command without a
case here fails the test; each runs as a process against a real controller (a simulated
scheduler over a small fabric, one open incident), or locally (scan, scenario run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from controller.detect.model import Incident
from controller.fabric import generate_fabric
from controller.heal.guards import GuardConfig
from controller.heal.policy import Decision
from controller.heal.scheduler.sim import SimScheduler
from controller.service import Controller, ControllerConfig, HealSettings
from starpulse.app import cli
from starpulse.app.cli.common import JSON_SCHEMA_PREFIX
from starpulse.core.clock import SYSTEM_CLOCK
from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[3]


def json_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[str]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += json_commands(sub, (*path, name))
    if any("--json" in a.option_strings for a in parser._actions):
        found.append(" ".join(path))
    return found


def cases(grpc: str, incident: str, scenario: Path) -> dict[str, tuple[list[str], str]]:
    """command -> (argv, the schema kind it must carry)."""
    c = ["--controller", grpc]
    return {
        "scan": (["scan", "--backend", "sim", "--node", "node-000"], "scan"),
        "nodes": (["nodes", *c], "nodes"),
        "events": (["events", *c], "events"),
        "incidents": (["incidents", *c], "incidents"),
        "spares": (["spares", *c], "spares"),
        "jobs": (["jobs", *c], "jobs"),
        "report": (["report", *c], "fleet-report"),
        "incident show": (["incident", "show", incident, *c], "incident"),
        "incident ack": (["incident", "ack", incident, "--reason", "seen", *c], "incident-action"),
        "incident resolve": (["incident", "resolve", incident, "--reason", "checked", *c], "incident-action"),
        "approvals": (["approvals", *c], "approvals"),
        "cordon": (["cordon", "node-001", "--reason", "test", *c], "node-action"),
        "uncordon": (["uncordon", "node-001", "--reason", "test", *c], "node-action"),
        "drain": (["drain", "node-002", "--reason", "test", *c], "node-action"),
        "approve": (["approve", incident, *c], "approve"),
        "breaker status": (["breaker", "status", *c], "breaker"),
        "breaker reset": (["breaker", "reset", "--reason", "test", *c], "breaker-reset"),
        "topology show": (["topology", "show", *c], "topology"),
        "scenario run": (["scenario", "run", str(scenario)], "scenario-verdict"),
        "simulate": (["simulate", "--nodes", "2", "--spares", "0", "--days", "0.1"], "simulation"),
        "accelerators show": (["accelerators", "show", "--state-dir", str(ROOT)], "accelerators"),
    }


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[tuple[Controller, str]]:
    fabric = generate_fabric(4, 2, 2, 4, 2, spares=1)
    ctl = Controller(
        ControllerConfig(
            listen=f"127.0.0.1:{free_port()}",
            http="127.0.0.1:0",
            db_path=tmp_path / "c.db",
            fabric=fabric,
            heal=HealSettings(SimScheduler(list(fabric.nodes())), guards=GuardConfig(mode="manual")),
        ),
        clock=SYSTEM_CLOCK,
    )
    await ctl.start()
    incident = ctl.detection.incidents.open(
        Incident(
            id="", kind="gpu_fault", root_cause="node-000/gpu-3", component_type="gpu",
            affected_nodes=["node-000"], affected_jobs=[], severity="critical", action="drain",
            evidence=[], opened_ms=int(time.time() * 1000),
        )
    )  # fmt: skip
    assert ctl.healer is not None  # in manual mode an eviction waits for a person: one to approve
    ctl.healer.guards.request_approval(incident, "node-000", Decision("drain", True, "gpu_fault", node="node-000"))
    try:
        yield ctl, incident.id
    finally:
        await ctl.stop()


# Every case in one process, one after another through the CLI's own ``main``: one interpreter
# start and one import of the CLI instead of one per command (23 of them, ~5 s each at a load of 9).
RUNNER = """
import contextlib, io, json, sys
from starpulse.app import cli
done = []
for argv in json.load(sys.stdin):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main([*argv, "--json"])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
    done.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
json.dump(done, sys.__stdout__)
"""


def run_all(argvs: list[list[str]]) -> list[dict[str, Any]]:
    """Each argv's exit code, stdout and stderr, run with ``--json`` in one process."""
    out = subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    done: list[dict[str, Any]] = json.loads(out.stdout)
    return done


# The smallest scenario that runs: only its verdict's schema is checked here. The suite's smallest
# (8 nodes, 6 switches, 14 s) ran 82 s at a load of 12; this one, 15 s.
TINY_SCENARIO = """\
name: json-schema
fabric: {nodes: 2, gpus_per_node: 1, rails: 1, nodes_per_block: 2, spines: 1}
interval_s: 0.5
duration_s: 2
"""


@pytest.mark.slow
async def test_every_json_command_carries_its_schema(controller: tuple[Controller, str], tmp_path: Path) -> None:
    ctl, incident = controller
    scenario = tmp_path / "json-schema.yaml"
    scenario.write_text(TINY_SCENARIO)
    table = cases(f"127.0.0.1:{ctl.grpc_port}", incident, scenario)
    assert sorted(json_commands(cli.build_parser())) == sorted(table)  # a new --json command needs a case
    failures = []
    results = await asyncio.to_thread(run_all, [argv for argv, _ in table.values()])
    for (name, (_, kind)), out in zip(table.items(), results, strict=True):
        if out["code"] not in (0, 1):  # 1: scan/scenario verdicts that are not healthy still print JSON
            failures.append(f"{name}: exit {out['code']}: {out['stderr'].strip()[-300:]}")
            continue
        doc = json.loads(out["stdout"])
        if doc.get("schema") != JSON_SCHEMA_PREFIX + kind:
            failures.append(f"{name}: schema {doc.get('schema')!r}, want {JSON_SCHEMA_PREFIX + kind!r}")
    assert failures == []
