"""Progress on stderr: drawn on a terminal (a pty here), nothing extra when piped."""

from __future__ import annotations

import asyncio
import io
import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

from starpulse.app.cli.progress import status, timed


def _drain(fd: int) -> bytes:
    chunks = []
    while select.select([fd], [], [], 0.2)[0]:
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


def test_topology_generate_at_scale_shows_progress_on_a_terminal_only(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "starpulse.app.cli", "topology", "generate", "--nodes", "2048"]
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120"}
    piped = subprocess.run(
        [*argv, "--out", str(tmp_path / "a.json")], capture_output=True, text=True, timeout=120, env=env, check=True
    )
    assert piped.stderr == ""  # piped: nothing extra
    main, child = pty.openpty()
    with subprocess.Popen(
        [*argv, "--out", str(tmp_path / "b.json")], stdout=subprocess.PIPE, stderr=child, env=env
    ) as proc:
        os.close(child)
        out, _ = proc.communicate(timeout=120)
        drawn = _drain(main).decode(errors="replace")
    os.close(main)
    assert proc.returncode == 0
    assert "generating a fabric of 2048 nodes" in drawn  # on the terminal, while it worked
    assert out.decode() == piped.stdout.replace("a.json", "b.json")  # stdout is the same either way
    assert json.loads((tmp_path / "b.json").read_text()) == json.loads((tmp_path / "a.json").read_text())


def test_timed_draws_a_bar_on_a_terminal_and_nothing_on_a_pipe() -> None:
    main, child = pty.openpty()
    with os.fdopen(child, "w") as terminal:
        result = asyncio.run(timed(asyncio.sleep(0.6, result=7), "scenario x: 1 fault(s)", 1.0, terminal))
    drawn = _drain(main).decode(errors="replace")
    os.close(main)
    assert result == 7 and "scenario x: 1 fault(s)" in drawn and "/1 s" in drawn
    piped = io.StringIO()
    assert asyncio.run(timed(asyncio.sleep(0.1, result=8), "y", 1.0, piped)) == 8
    with status("z", piped):
        pass
    assert piped.getvalue() == ""
