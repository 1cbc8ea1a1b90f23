"""The admin commands as a person runs them: `starpulse controller --scheduler sim` and the CLI, as processes.

cordon/drain/uncordon carry the person's name; bob cannot return alice's node without
--force; the breaker (opened before the controller started) stays open until a named
person resets it; spares, jobs and approve answer; errors are one line with exit 2.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.fabric import generate_fabric, save_fabric
from controller.heal.guards import CircuitBreaker
from controller.store import Store
from starpulse.core.clock import SYSTEM_CLOCK
from tests.helpers import free_port

STARPULSE = [sys.executable, "-m", "starpulse.app.cli"]


def _env(user: str = "alice") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy")}
    env["NO_PROXY"] = "127.0.0.1,localhost"
    env["USER"] = user
    return env


def run(*args: str, user: str = "alice") -> subprocess.CompletedProcess[str]:
    return subprocess.run([*STARPULSE, *args], capture_output=True, text=True, timeout=60, check=False, env=_env(user))


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[str]:
    """A controller with a simulated scheduler over a 4+1-node fabric; its breaker was left open."""
    fabric_path = tmp_path / "fabric.json"
    save_fabric(generate_fabric(4, 2, 2, 4, 2, spares=1), fabric_path)
    db = tmp_path / "c.db"
    store = Store(db)
    CircuitBreaker(store.connection, SYSTEM_CLOCK).trip("4 of 5 nodes faulty (before restart)")
    store.close()
    address = f"127.0.0.1:{free_port()}"
    with (tmp_path / "controller.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                *STARPULSE,
                "controller",
                "--listen",
                address,
                "--http",
                "127.0.0.1:0",
                "--db",
                str(db),
                "--fabric",
                str(fabric_path),
                "--scheduler",
                "sim",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_env(),
        )
    try:
        deadline = time.monotonic() + 30
        while run("breaker", "status", "--controller", address).returncode != 0:
            assert proc.poll() is None, (tmp_path / "controller.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "controller did not come up"
            time.sleep(0.3)
        yield address
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail("controller did not stop on SIGTERM")


def one_line_error(out: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


class TestAdminCli:
    def test_node_actions_name_the_person(self, controller: str) -> None:
        c = ("--controller", controller)
        out = run("cordon", "node-000", "--reason", "bad fan", "--actor", "alice", *c)
        assert out.returncode == 0 and "cordoned" in out.stdout, out.stderr
        out = run("drain", "node-000", "--reason", "move the job off", "--json", *c)  # actor: $USER=alice
        data = json.loads(out.stdout)
        assert data["state"] == "draining" and data["drained_by"] == "alice"
        one_line_error(
            run("uncordon", "node-000", "--reason", "looks fine", "--actor", "bob", *c),
            "FAILED_PRECONDITION",
            "drained by alice",
            "--force",
        )
        out = run("uncordon", "node-000", "--reason", "alice is away", "--actor", "bob", "--force", "--json", *c)
        data = json.loads(out.stdout)
        assert data["state"] == "in_service" and "forced" in data["message"]
        out = run("cordon", "node-001", "--reason", "testing", *c, user="carol")
        assert "held by carol" in out.stdout
        one_line_error(run("cordon", "node-001", "--reason", "x", *c, user="starpulse"), "--actor")
        one_line_error(run("cordon", "../etc", "--reason", "x", *c), "INVALID_ARGUMENT")
        one_line_error(run("drain", "node-002", "--reason", " ", *c), "INVALID_ARGUMENT", "reason")

    def test_breaker_stays_open_until_a_person_resets_it(self, controller: str) -> None:
        c = ("--controller", controller)
        out = run("breaker", "status", *c)
        assert "OPEN" in out.stdout and "4 of 5 nodes faulty" in out.stdout
        one_line_error(run("breaker", "reset", "--actor", "starpulse", *c), "INVALID_ARGUMENT")
        one_line_error(run("breaker", "reset", *c, user="starpulse"), "--actor")
        assert json.loads(run("breaker", "status", "--json", *c).stdout)["open"] is True
        out = run("breaker", "reset", "--actor", "bob", "--reason", "driver rolled back", *c)
        assert out.returncode == 0 and "breaker closed by bob" in out.stdout, out.stderr
        data = json.loads(run("breaker", "status", "--json", *c).stdout)
        assert data["open"] is False and data["closed_by"] == "bob" and data["mode"] == "enforce"

    def test_spares_jobs_and_approve(self, controller: str) -> None:
        c = ("--controller", controller)
        spares = json.loads(run("spares", "--json", *c).stdout)["spares"]
        assert [s["spare"] for s in spares] == ["node-004"] and spares[0]["source"] == "fabric"
        assert "node-004" in run("spares", *c).stdout
        assert json.loads(run("jobs", "--json", *c).stdout) == {"schema": "starpulse.v1/jobs", "jobs": []}
        assert run("jobs", *c).stdout.strip() == "no jobs"
        one_line_error(run("approve", "inc-000001", *c), "NOT_FOUND")

    def test_scheduler_sim_needs_a_fabric(self, tmp_path: Path) -> None:
        out = run("controller", "--scheduler", "sim", "--db", str(tmp_path / "c.db"), "--listen", "127.0.0.1:0")
        one_line_error(out, "--fabric")
