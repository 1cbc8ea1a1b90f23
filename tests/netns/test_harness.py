"""The namespace harness cleans up after itself, sweeps dead runs, and never leaves its subnet."""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path

import pytest

from tests.netns import harness
from tests.netns.harness import Lab, list_namespaces, require_lab, run, sweep_stale

pytestmark = pytest.mark.netns


def test_addresses_outside_the_lab_subnet_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"10\.0\.0\.0/8"):
        Lab(tmp_path, subnet=ipaddress.ip_network("192.168.7.0/24"))
    lab = Lab(tmp_path)
    with pytest.raises(ValueError, match="outside the lab subnet"):
        lab.check_address("10.9.9.9")
    assert str(lab.check_address("10.213.0.7")) == "10.213.0.7"


@pytest.mark.parametrize("ci", ["", "true"])
def test_missing_prerequisites_skip_locally_and_fail_in_ci(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    monkeypatch.setattr(harness, "missing_prerequisites", lambda: ["not root"])
    monkeypatch.setenv("CI", ci)
    outcome = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(outcome, match="not root"):
        require_lab()


def test_close_removes_namespaces_links_and_processes(tmp_path: Path) -> None:
    require_lab()
    lab = Lab(tmp_path)
    with lab:
        lab.add_host("a")
        lab.add_host("b")
        lab.link("a", "eth-a", "b", "eth-b")
        lab.address("a", "eth-a", "10.213.0.1")
        lab.address("b", "eth-b", "10.213.0.2")
        proc = lab.spawn("a", "sleeper", ["sleep", "600"])
        assert "10.213.0.2" in lab.ip("b", "-4", "addr", "show", "eth-b").stdout
        assert lab.operstate("a", "eth-a") in ("UP", "UNKNOWN")
        lab.set_link("b", "eth-b", False)  # the cable is cut from the far end
        assert lab.operstate("a", "eth-a") in ("DOWN", "LOWERLAYERDOWN")
        assert sorted(n.removeprefix(lab.prefix) for n in lab.leftovers()) == ["a", "b"]
    assert proc.popen.poll() is not None
    assert lab.leftovers() == []
    # the veths lived only in the lab's namespaces: nothing of them in the root namespace
    assert "eth-a" not in run(["ip", "-o", "link"]).stdout


def test_cleanup_happens_when_the_test_body_fails(tmp_path: Path) -> None:
    require_lab()
    lab = Lab(tmp_path)
    with pytest.raises(RuntimeError, match="boom"), lab:
        lab.add_host("x")
        lab.spawn("x", "sleeper", ["sleep", "600"])
        raise RuntimeError("boom")
    assert lab.leftovers() == [] and lab.procs == []


def test_sweep_removes_only_namespaces_of_dead_runs(tmp_path: Path) -> None:
    require_lab()
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"spn{dead.pid}x0badc0-node-000"
    lab = Lab(tmp_path)  # a live run: this process
    stale_dir, live_dir = tmp_path / f"spn{dead.pid}x0badc0-sock", tmp_path / f"{lab.prefix}sock"
    stale_dir.mkdir()
    live_dir.mkdir()
    try:
        run(["ip", "netns", "add", stale])
        lab.add_host("live")
        swept = sweep_stale(str(tmp_path))
        assert stale in swept and str(stale_dir) in swept
        names = list_namespaces()
        assert stale not in names and lab.ns("live") in names
        assert not stale_dir.exists() and live_dir.exists()
    finally:
        run(["ip", "netns", "delete", stale], check=False)
        lab.close()
