"""The demo trains in every install: its rank script ships in the package (issue 28 item 5).

An installed wheel had no ``examples/``, so its demo printed "no training process reported a
step". The rank script is ``starpulse.app.train`` now; ``examples/train.py`` runs the same one.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from starpulse.app.demo_training import RANK_MODULE, rank_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_wheel_carries_the_rank_script(tmp_path: Path) -> None:
    """``pip wheel`` of the project (no dependencies): the demo's rank module is inside."""
    src = tmp_path / "src"  # a copy: the build writes build/ and *.egg-info beside the sources
    skip = (
        ".git",
        ".venv",
        "build",
        "*.egg-info",
        "__pycache__",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
        "tests",
    )
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*skip))
    dist = tmp_path / "dist"
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "-w", str(dist), "--no-deps", "--no-build-isolation", "-q"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = dist.glob("starpulse-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    module = RANK_MODULE.replace(".", "/") + ".py"
    assert module in names, sorted(n for n in names if n.startswith("starpulse/app/"))
    assert not any(n.startswith("examples/") for n in names)  # the demo needs nothing outside the package


def test_the_packaged_rank_trains_checkpoints_and_resumes(tmp_path: Path) -> None:
    """``python -m starpulse.app.train``, as the demo starts each rank: steps, a checkpoint, and
    a second run resumes from it (no agent socket: the job library works without one)."""
    ck = tmp_path / "ck"
    cmd = [sys.executable, "-m", RANK_MODULE, "--job", "j", "--steps", "3", "--step-time", "0.01",
           "--checkpoint-dir", str(ck), "--checkpoint-every", "2", "--socket", str(tmp_path / "none.sock")]  # fmt: skip
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, env=rank_env(), cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    lines = first.stdout.splitlines()
    assert lines[1] == "fresh start" and "step 3" in lines and lines[-1] == "done step 3", lines
    again = subprocess.run(
        [*cmd[:6], "5", *cmd[7:]], capture_output=True, text=True, timeout=60, check=False, env=rank_env(), cwd=tmp_path
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resumed from step 3" in again.stdout.splitlines() and again.stdout.splitlines()[-1] == "done step 5"
