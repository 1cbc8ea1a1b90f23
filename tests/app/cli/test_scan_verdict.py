"""`starpulse scan` through the CLI: the controller's rules judge this node, exit 0/1/2.

The recorded H100 tree (../shared/fixtures/sysfs, read in place through a link) is scanned
without a driver (`--backend none`); a derived copy with one port down and one at half rate
must flag exactly those two ports.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import shared_fixture
from tests.support.scan import STARPULSE, by_rule, scan

RAILS = [f"mlx5_{i}" for i in (0, 1, 4, 5, 6, 7, 8, 9)]
ALL_PORTS = [f"{d}/1" for d in [*RAILS, "mlx5_bond_0"]]
# The recording's own counters: excessive_buffer_overrun_errors and link_downed sit at their
# IBA maximum (15, 255) from the first read on, which the controller's rules read as "saturated
# since before the window": an info note to clear the counters, not a fault.
SATURATION_RULES = {"nic.phy_errors", "nic.flap"}
CLEAR_NOTE = "clear the port counters (perfquery -R / reset), it can no longer show new errors"


@pytest.fixture
def recorded_root(tmp_path: Path) -> Path:
    """A sysfs root whose class/infiniband is the recorded tree, read in place."""
    target = shared_fixture("sysfs/class-infiniband-h100")
    (tmp_path / "rec" / "class").mkdir(parents=True)
    (tmp_path / "rec" / "class" / "infiniband").symlink_to(target, target_is_directory=True)
    return tmp_path / "rec"


@pytest.fixture
def derived_root(tmp_path: Path) -> Path:
    """A copy of the recorded tree (in the test's temp folder) with mlx5_4 down and mlx5_5 at half rate."""
    target = shared_fixture("sysfs/class-infiniband-h100")
    ib = tmp_path / "derived" / "class" / "infiniband"
    shutil.copytree(target, ib)
    (ib / "mlx5_4/ports/1/state").write_text("1: DOWN\n")
    (ib / "mlx5_4/ports/1/phys_state").write_text("3: Disabled\n")
    (ib / "mlx5_5/ports/1/rate").write_text("200 Gb/sec (4X HDR)\n")
    return tmp_path / "derived"


def test_recorded_tree_without_a_driver(recorded_root: Path, tmp_path: Path) -> None:
    """Nine ports at their real rates, the right counters, the recording's saturated counters
    noted (info) and the node healthy: exit 0."""
    expect = tmp_path / "expect.yaml"
    expect.write_text("nics: [" + ", ".join(ALL_PORTS) + "]\n")
    t0 = time.monotonic()
    code, data, err = scan("--backend", "none", "--sysfs-root", str(recorded_root), "--expect", str(expect))
    wall = time.monotonic() - t0
    assert data, err
    nics = {f"{n['rdma_device']}/{n['port']}": n for n in data["inventory"]["nics"]}
    assert sorted(nics) == sorted(ALL_PORTS)
    assert {p: nics[p]["rate_gbps"] for p in ALL_PORTS} == {**{f"{d}/1": 400 for d in RAILS}, "mlx5_bond_0/1": 200}
    sample = {f"{n['rdma_device']}/{n['port']}": n for n in data["sample"]["nics"]}
    assert sample["mlx5_1/1"]["counters"]["port_rcv_errors"] == 14  # a number (docs/json.md), the recording's own value
    assert sample["mlx5_1/1"]["state"] == "ACTIVE"
    rules = by_rule(data)
    assert set(rules) == SATURATION_RULES, rules
    notes = data["verdict"]["conditions"]
    assert all((c["severity"], c["action"]) == ("info", "none") and CLEAR_NOTE in c["message"] for c in notes), notes
    # every port with a counter at 15 has the note; link_downed is at 255 on one port only
    assert len(rules["nic.phy_errors"]) == len(ALL_PORTS) and len(rules["nic.flap"]) == 1
    assert not data["verdict"]["missing"]
    assert code == 0 and data["verdict"]["status"] == "healthy", data["verdict"]
    assert wall < 30


def test_recorded_tree_table_shows_the_saturation_note(recorded_root: Path) -> None:
    """The people's table names each saturated counter and what to do, and says healthy."""
    out = subprocess.run(
        [*STARPULSE, "scan", "--backend", "none", "--window", "0.2", "--sysfs-root", str(recorded_root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = out.stdout.splitlines()
    notes = [line for line in lines if line.startswith("info ") and CLEAR_NOTE in line]
    assert any("counters/excessive_buffer_overrun_errors: counter saturated" in line for line in notes), out.stdout
    assert any("counters/link_downed: counter saturated (at its maximum, 255)" in line for line in notes)
    assert lines[-1] == "verdict: healthy" and out.returncode == 0, out.stdout + out.stderr


def test_derived_tree_flags_the_down_and_the_slow_port_only(derived_root: Path, recorded_root: Path) -> None:
    _code, base, _err = scan("--backend", "none", "--sysfs-root", str(recorded_root))
    code, data, err = scan("--backend", "none", "--sysfs-root", str(derived_root))
    assert data, err
    rules = by_rule(data)
    down = rules.get("nic.port_down", set())
    slow = rules.get("nic.rate_below_nominal", set())
    assert len(down) == 1 and len(slow) == 1, rules
    names = {(c["rule"], c["component"]): c["message"] for c in data["verdict"]["conditions"]}
    assert "200 Gb/s, expected 400 Gb/s" in names[("nic.rate_below_nominal", next(iter(slow)))]
    # every other condition is one the untouched recording has too
    extra = {(c["rule"], c["component"]) for c in data["verdict"]["conditions"]} - {
        (c["rule"], c["component"]) for c in base["verdict"]["conditions"]
    }
    assert {r for r, _ in extra} == {"nic.port_down", "nic.rate_below_nominal"}
    assert code == 1


def test_missing_nic_against_the_expected_inventory(recorded_root: Path, tmp_path: Path) -> None:
    expect = tmp_path / "expect.yaml"
    expect.write_text("nics: [mlx5_0/1, mlx5_2/1]\n")
    code, data, _err = scan("--backend", "none", "--sysfs-root", str(recorded_root), "--expect", str(expect))
    assert data["verdict"]["missing"] == ["nic mlx5_2/1"] and code == 1
    # the controller's own rule says it, not a comparison of scan's
    missing = [c for c in data["verdict"]["conditions"] if c["rule"] == "nic.missing"]
    assert len(missing) == 1 and "(mlx5_2/1): in the inventory but not in the report" in missing[0]["message"]
    assert missing[0]["severity"] == "critical"


def test_expected_nic_on_a_machine_without_an_rdma_tree_is_missing(tmp_path: Path) -> None:
    """No /sys/class/infiniband at all: an expected port is missing, not 'could not check'."""
    expect = tmp_path / "expect.yaml"
    expect.write_text("nics: [mlx5_0/1]\n")
    code, data, err = scan("--backend", "none", "--sysfs-root", str(tmp_path), "--expect", str(expect))
    assert data, err
    assert data["verdict"]["missing"] == ["nic mlx5_0/1"] and code == 1


def test_sim_backend_honours_sysfs_root_and_finds_a_missing_gpu(recorded_root: Path, tmp_path: Path) -> None:
    """Simulated GPUs, the recorded NIC tree; 9 GPUs expected where 8 answer is gpu.missing."""
    expect = tmp_path / "expect.yaml"
    expect.write_text("gpus: 9\n")
    code, data, err = scan("--backend", "sim", "--sysfs-root", str(recorded_root), "--expect", str(expect))
    assert data, err
    assert len(data["inventory"]["gpus"]) == 8
    assert {n["rdma_device"] for n in data["inventory"]["nics"]} == {*RAILS, "mlx5_bond_0"}
    assert "gpu.missing" in by_rule(data) and code == 1


def test_healthy_sim_node_is_0_and_a_pending_row_remap_is_1() -> None:
    code, data, _ = scan("--backend", "sim")
    assert code == 0 and data["verdict"]["status"] == "healthy"
    code, data, _ = scan("--backend", "sim", "--sim-fault", "gpu_ecc_dbe:2")
    assert code == 1 and "gpu.remap_pending" in by_rule(data)


@pytest.mark.parametrize(
    ("fault", "says"),
    [
        ("gpu_lost:99", "gpu-99"),
        ("gpu_xid:2", "xid: is required"),
        ("nic_cable_loss:1", "nic_cable_loss acts on the probes' data plane, not on one node: put it in a scenario"),
        ("switch_down", "switch_down acts on a cluster, not on one node"),
    ],
)
def test_sim_fault_the_node_cannot_take_is_one_line(fault: str, says: str) -> None:
    """A part the node lacks, a kind whose parameter has no default, or a kind of the fabric (the probe
    mesh's data plane, a switch): one line, exit 2, no traceback."""
    out = subprocess.run(
        [*STARPULSE, "scan", "--backend", "sim", "--sim-fault", fault], capture_output=True, text=True, check=False
    )
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and says in lines[0], out.stderr


def test_kernel_log_faults_judged_by_the_rules(tmp_path: Path) -> None:
    """A restart_app Xid alone leaves the node in service; a reset Xid takes it out."""
    log = tmp_path / "dmesg.txt"
    log.write_text("[  1.0] NVRM: Xid (PCI:0000:18:00): 13, pid=77, name=python3, Graphics Exception\n")
    code, data, _ = scan("--backend", "none", "--sysfs-root", str(tmp_path), "--kmsg", str(log))
    assert "gpu.xid.restart_app" in by_rule(data) and code == 0
    log.write_text("[  1.0] NVRM: Xid (PCI:0000:18:00): 119, pid=77, name=python3, Timeout after 6s of waiting\n")
    code, data, _ = scan("--backend", "none", "--sysfs-root", str(tmp_path), "--kmsg", str(log))
    assert "gpu.xid.reset_gpu" in by_rule(data) and code == 1


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--expect", "{missing}"), "cannot read"),
        (("--expect", "{bad}"), "unknown key 'gpu'"),
        (("--kmsg", "{missing}"), "--kmsg"),
        (("--sysfs-root", "{missing}"), "--sysfs-root"),
        (("--sim-fault", "gpu_lost"), "--sim-fault needs --backend sim"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpu: 8\n")
    real = [a.format(missing=tmp_path / "nope", bad=bad) for a in args]
    out = subprocess.run([*STARPULSE, "scan", "--backend", "none", *real], capture_output=True, text=True, check=False)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and says in lines[0], out.stderr
    assert "Traceback" not in out.stderr


# -- --prolog / --epilog fail open -------------------------------------------------------------
# (the drain itself, with real Slurm: tests/e2e/test_slurm_prolog.py)


def prolog(*args: str, env_node: str | None = "gpu07") -> subprocess.CompletedProcess[str]:
    import os

    env = {k: v for k, v in os.environ.items() if k != "SLURMD_NODENAME"}
    if env_node:
        env["SLURMD_NODENAME"] = env_node
    env["PATH"] = "/nonexistent"  # no scontrol: any attempt to drain would fail loudly
    return subprocess.run([*STARPULSE, "scan", *args], capture_output=True, text=True, env=env, check=False)


def test_prolog_that_times_out_never_drains() -> None:
    out = prolog("--prolog", "--backend", "sim", "--timeout", "0.05")
    assert out.returncode == 0 and "fail open" in out.stderr and "drained" not in out.stderr


def test_prolog_that_cannot_check_never_drains(tmp_path: Path) -> None:
    # --timeout 120: the verdict is under test, not the 10 s budget (a loaded test machine can pass it)
    out = prolog("--prolog", "--backend", "none", "--expect", str(tmp_path / "nope.yaml"), "--timeout", "120")
    assert out.returncode == 0 and "could not check" in out.stderr and "not draining" in out.stderr


def test_prolog_without_slurm_environment_fails_open() -> None:
    out = prolog("--epilog", "--backend", "sim", env_node=None)
    assert out.returncode == 0 and "SLURMD_NODENAME" in out.stderr


def test_prolog_on_a_healthy_node_lets_the_job_run() -> None:
    out = prolog("--prolog", "--backend", "sim", "--timeout", "120")  # the verdict, not the budget
    assert out.returncode == 0 and out.stderr == ""


def test_fleet_share_is_the_healers_rule() -> None:
    """The prolog asks the same function the healer's guard does."""
    from controller.heal.guards import fleet_share_refusal

    assert fleet_share_refusal("n1", set(), 4, 0.05) is None  # at least one node always allowed
    assert "fleet share" in (fleet_share_refusal("n2", {"n1"}, 4, 0.05) or "")
    assert fleet_share_refusal("n1", {"n1"}, 4, 0.05) is None  # already out: not a new one


def test_scan_reads_dev_kmsg_without_waiting(tmp_path: Path) -> None:
    """/dev/kmsg is read up to its last record and never waited on (a prolog has 10 s)."""
    import os

    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("/dev/kmsg is not readable here")
    t0 = time.monotonic()
    code, data, err = scan("--backend", "none", "--sysfs-root", str(tmp_path), "--kmsg", "/dev/kmsg", timeout=20)
    assert data, err
    assert code in (0, 1) and time.monotonic() - t0 < 15
