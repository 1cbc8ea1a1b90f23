"""A scheduler several controller processes share, for the HA end-to-end test and bench/failover.py.

Run as an exec-backend hook: ``python shared_scheduler.py STATE_DIR <action> <args...>``.
The cluster lives in STATE_DIR/state.json under an exclusive lock; every change appends one
line to STATE_DIR/actions.log, so a test can count drains and requeues across replicas.
Drains are idempotent (a node drained by us is not drained again), like Slurm's.

While STATE_DIR/gate exists, a drain waits before doing anything and writes its pid to
STATE_DIR/paused: the test's way to stop a remediation between "planned" and "done".
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

PREFIX = "starpulse:"


def init(state_dir: Path, nodes: list[str], jobs: dict[str, list[str]]) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    state = {"nodes": {n: {"drained": False, "reason": ""} for n in nodes}, "jobs": jobs}
    (state_dir / "state.json").write_text(json.dumps(state))
    (state_dir / "actions.log").write_text("")


def actions(state_dir: Path) -> list[str]:
    return [line for line in (state_dir / "actions.log").read_text().splitlines() if line]


def _status(state: dict[str, Any], node: str) -> dict[str, Any]:
    n = state["nodes"][node]
    jobs = [j for j, placed in state["jobs"].items() if node in placed]
    if n["drained"]:
        return {
            "node": node,
            "state": "draining" if jobs else "drained",
            "reason": n["reason"],
            "drained_by_us": n["reason"].startswith(PREFIX),
            "jobs": jobs,
        }
    return {"node": node, "state": "allocated" if jobs else "idle", "reason": "", "drained_by_us": None, "jobs": jobs}


def _act(state_dir: Path, state: dict[str, Any], action: str, args: list[str]) -> str:
    def log(line: str) -> None:
        with (state_dir / "actions.log").open("a") as f:
            f.write(line + "\n")

    if action in ("drain", "cordon"):
        node = state["nodes"][args[0]]
        if not node["drained"]:
            node.update(drained=True, reason=f"{PREFIX} {args[1]}")
            log(f"{action} {args[0]}")
        return ""
    if action == "resume":
        state["nodes"][args[0]].update(drained=False, reason="")
        log(f"resume {args[0]}")
        return ""
    if action == "node_status":
        return json.dumps(_status(state, args[0]))
    if action == "list_nodes":
        return json.dumps([_status(state, n) for n in sorted(state["nodes"])])
    if action == "job_nodes":
        return json.dumps(state["jobs"][args[0]])
    if action == "requeue":
        job = args[0]
        exclude = set(filter(None, os.environ.get("STARPULSE_EXCLUDE", "").split(",")))
        prefer = list(filter(None, os.environ.get("STARPULSE_PREFER", "").split(",")))
        busy = {n for placed in state["jobs"].values() for n in placed}
        keep = [n for n in state["jobs"][job] if n not in exclude]
        free = [
            n
            for n in [*prefer, *sorted(state["nodes"])]
            if n not in busy and n not in exclude and not state["nodes"][n]["drained"]
        ]
        size = len(state["jobs"][job])
        state["jobs"][job] = (keep + [n for n in dict.fromkeys(free) if n not in keep])[:size]
        log(f"requeue {job} {','.join(state['jobs'][job])}")
        return ""
    if action == "signal_job":
        log(f"signal {args[0]} {args[1]}")
        return ""
    raise SystemExit(f"unknown action {action}")


def main(argv: list[str]) -> int:
    state_dir, action, args = Path(argv[1]), argv[2], argv[3:]
    if action == "drain" and (state_dir / "gate").exists():
        # Atomically: the test reads the pid as soon as the file exists (an empty file was read
        # when this process was preempted between creating it and writing it).
        (state_dir / "paused.tmp").write_text(str(os.getpid()))
        os.replace(state_dir / "paused.tmp", state_dir / "paused")
        while (state_dir / "gate").exists():
            time.sleep(0.05)
    with (state_dir / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = json.loads((state_dir / "state.json").read_text())
        out = _act(state_dir, state, action, args)
        (state_dir / "state.json.tmp").write_text(json.dumps(state))
        os.replace(state_dir / "state.json.tmp", state_dir / "state.json")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
