"""Two real controller replicas on a real etcd; the leader is SIGKILLed in the middle of a remediation.

Four simulated agents stream to the pair (each configured with both addresses, the
standby first, so they start by following the standby's leader hint). Node-001 gets an
Xid 79; the leader plans the drain, flushes the plan to etcd and calls the shared
scheduler hook, which the test holds at a gate. Then the leader's host "dies": the
controller and its in-flight hook are SIGKILLed. The standby takes the lease, restores
the state from etcd, replays the planned drain and finishes the eviction: one drain, one
requeue onto the spare, in the scheduler's own action log. Agents reconnect to it and
every event sequence number arrives exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.fabric import generate_fabric, save_fabric
from controller.ha.config import HAConfig
from controller.ha.etcd import connect
from tests.etcd_server import EtcdServer
from tests.ha import shared_scheduler
from tests.helpers import SimAgent, free_port, make_sim_agent, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

NODES = ["node-000", "node-001", "node-002", "node-003"]  # node-003: the fabric's spare
JOB = "train-1"
HOOK_ACTIONS = ("cordon", "drain", "resume", "requeue", "signal_job", "node_status", "job_nodes", "list_nodes")


def _config(tmp_path: Path, name: str, etcd: str, fabric: Path, sched: Path) -> tuple[Path, str]:
    listen = f"127.0.0.1:{free_port()}"
    hook = [sys.executable, str(Path(shared_scheduler.__file__)), str(sched)]
    data: dict[str, Any] = {
        "server": {
            "listen": listen,
            "http": f"127.0.0.1:{free_port()}",
            "db_path": str(tmp_path / f"{name}.db"),
            "controller_id": name,
            "grace_s": 1.0,
        },
        "ingest": {"heartbeat_timeout_s": 30, "sweep_interval_s": 0.2},
        "fabric": {"path": str(fabric), "jobs": {JOB: NODES[:3]}},
        "detection": {"correlation": {"settle_s": 0.3}},
        "heal": {
            "enabled": True,
            "checkpoint_timeout_s": 0,
            "retry_delay_s": 0.2,
            # one node of four may be out; the informational events must not trip the breaker
            "guards": {"max_fleet_share": 0.5, "breaker_trip_share": 1.0, "breaker_min_nodes": 5},
            "scheduler": {"type": "exec", "exec": {"hooks": {a: hook for a in HOOK_ACTIONS}, "timeout_s": 60}},
        },
        "ha": {"enabled": True, "etcd": [etcd], "lease_ttl_s": 5, "cluster": "e2e"},
        "log": {"level": "info", "format": "console"},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, listen


def _start(tmp_path: Path, name: str, config: Path) -> subprocess.Popen[bytes]:
    with (tmp_path / f"{name}.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "starpulse.app.cli", "controller", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )


# Lines that fill a controller's log on a simulated fleet and say nothing about a failover.
_NOISE = ("collector_probe", "ethtool_stats_missing")


def log_tails(tmp_path: Path, names: tuple[str, ...], lines: int = 80) -> str:
    """The last ``lines`` lines of each replica's log, the noise left out: printed when the test
    fails, so CI output shows what the controllers did (the breaker opened by informational
    incidents that held the last drain back was only in these files)."""
    out = []
    for name in names:
        path = tmp_path / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        kept = [line for line in text.splitlines() if not any(word in line for word in _NOISE)]
        out.append(f"----- {path.name}: last {min(lines, len(kept))} of {len(kept)} lines (noise left out) -----")
        out.extend(kept[-lines:])
    return "\n".join(out)


def test_log_tails_leave_out_the_noise_and_keep_the_end(tmp_path: Path) -> None:
    (tmp_path / "c0.log").write_text(
        "".join(f"line {i}\n" for i in range(5)) + "x collector_probe y\nethtool_stats_missing nic=0\nha_elected\n"
    )
    tails = log_tails(tmp_path, ("c0", "c1"), lines=3).splitlines()
    assert tails == [
        "----- c0.log: last 3 of 6 lines (noise left out) -----",
        "line 3",
        "line 4",
        "ha_elected",
        "----- c1.log: last 0 of 0 lines (noise left out) -----",
    ]


def _last_role_event(log: Path) -> str:
    """The replica's last word on its role in its log (the file spans its restarts)."""
    events = re.findall(r"\b(ha_leader_acting|ha_leadership_lost|ha_standby|ha_elected)\b", log.read_text())
    return events[-1] if events else ""


async def _settled_leader(
    tmp_path: Path,
    procs: dict[str, subprocess.Popen[bytes]],
    configs: dict[str, tuple[Path, str]],
    leader: Callable[[], Awaitable[str]],
) -> str:
    """The leader's address once the election has settled: named in etcd, acting, the other replica up.

    On a loaded machine the first leader's takeover (building the controller, which holds its
    event loop) can outlast the lease (5 s here, the product default; 2 s failed in a loaded CI
    run). It then stops acting and exits, as designed, and the service manager starts it again
    as a standby: so does this, before the test picks its leader.
    """
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "no leader settled"
        for name, proc in procs.items():
            if proc.poll() is not None:  # lost the lease (exit 3): restarted as systemd would
                procs[name] = _start(tmp_path, name, configs[name][0])
        current = await leader()
        name = next((n for n, (_, listen) in configs.items() if listen == current), None)
        if (
            name is not None
            and all(p.poll() is None for p in procs.values())
            and _last_role_event(tmp_path / f"{name}.log") == "ha_leader_acting"
        ):
            return current
        await asyncio.sleep(0.1)


def _stored_seqs(db: Path) -> dict[str, list[int]]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT node_id, seq FROM events ORDER BY node_id, seq").fetchall()
    out: dict[str, list[int]] = {}
    for node, seq in rows:
        out.setdefault(node, []).append(seq)
    return out


def _heal_state(db: Path, node: str) -> str | None:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        row = conn.execute("SELECT state FROM heal_nodes WHERE node = ?", (node,)).fetchone()
    return row[0] if row else None


INFO_XIDS = (43, 63, 92, 121)  # the catalog's IGNORE bucket: informational, alert-only at most


def _emit(agents: list[SimAgent], n: int, base: int) -> int:
    """n informational Xid lines per agent on GPU 7, cycling Xids so storm suppression (5 per key) keeps them."""
    for i in range(base, base + n):
        for a in agents:
            a.sim.kmsg.xid(a.sim.gpu_kmsg_pci(7), INFO_XIDS[i % len(INFO_XIDS)], "ha test")
    return base + n


class TestFailover:
    async def test_leader_killed_mid_remediation_new_leader_finishes_it_exactly_once(self, tmp_path: Path) -> None:
        """SIGKILL the leader between planning and performing a drain: one drain, one requeue, no event lost."""
        sched = tmp_path / "sched"
        shared_scheduler.init(sched, NODES, {JOB: NODES[:3]})
        fabric_path = tmp_path / "fabric.json"
        fabric = generate_fabric(nodes=3, gpus_per_node=8, rails=8, nodes_per_block=4, spines=1, spares=1)
        assert fabric.nodes() == NODES and fabric.spares() == ["node-003"]
        save_fabric(fabric, fabric_path)
        procs: dict[str, subprocess.Popen[bytes]] = {}
        agents: list[SimAgent] = []
        client = None
        with EtcdServer(tmp_path / "etcd") as etcd:
            try:
                configs = {n: _config(tmp_path, n, etcd.endpoint, fabric_path, sched) for n in ("c0", "c1")}
                address = {n: listen for n, (_, listen) in configs.items()}
                for n, (cfg, _) in configs.items():
                    procs[n] = _start(tmp_path, n, cfg)
                ha = HAConfig(etcd=[etcd.endpoint], cluster="e2e")
                client = await connect(ha)
                leader_key = ha.key("leader")

                async def leader() -> str:
                    kv = await client.get(leader_key)
                    return kv.value.decode() if kv is not None else ""

                first = await _settled_leader(tmp_path, procs, configs, leader)
                old = next(n for n in address if address[n] == first)
                new = next(n for n in address if n != old)
                # The standby's address first: agents start by following its leader hint.
                targets = [address[new], address[old]]
                agents = [
                    make_sim_agent(n, tmp_path / "agents", targets, interval_s=0.3, seed=i) for i, n in enumerate(NODES)
                ]
                for a in agents:
                    a.start()
                await wait_for(lambda: all(a.agent.link.connected.is_set() for a in agents), 40, "agents connected")
                assert all(a.agent.link.reconnect.target == first for a in agents)

                base = _emit(agents, 8, 0)
                (sched / "gate").write_text("hold the drain")
                node1 = agents[1]
                node1.sim.inject("gpu_xid", "gpu-2", xid=79)
                await wait_for((sched / "paused").exists, 40, "the leader's drain to reach the scheduler")
                hook_pid = int((sched / "paused").read_text())

                # The leader's host dies: the controller and the hook it started, mid-action.
                t_kill = time.monotonic()
                procs[old].kill()
                os.kill(hook_pid, signal.SIGKILL)
                procs[old].wait(timeout=10)
                assert shared_scheduler.actions(sched) == [], "the drain must still be pending at the kill"
                base = _emit(agents, 6, base)  # events keep coming during the failover
                (sched / "gate").unlink()

                deadline = time.monotonic() + 30
                while await leader() != address[new]:
                    assert time.monotonic() < deadline, "the standby never took over"
                    await asyncio.sleep(0.05)
                t_new = time.monotonic()

                def evicted() -> bool:
                    return _heal_state(tmp_path / f"{new}.db", "node-001") in ("evicted", "repairing")

                await wait_for(evicted, 40, "the new leader to finish the eviction")
                base = _emit(agents, 6, base)
                for a in agents:  # every line read from the (simulated) kernel log, then acked
                    await wait_for(lambda a=a: a.agent.events_emitted >= base, 30, "all findings buffered")
                    await wait_for(
                        lambda a=a: (
                            a.agent.link.acked_event_seq == a.agent.buffer.next_seq - 1 and a.agent.buffer.depth() == 0
                        ),
                        40,
                        f"{a.agent.config.node_id}: all events acked by the new leader",
                    )
                log = shared_scheduler.actions(sched)
                assert log.count("drain node-001") == 1, log
                requeues = [line for line in log if line.startswith(f"requeue {JOB}")]
                assert requeues == [f"requeue {JOB} node-000,node-002,node-003"], log
                assert not [line for line in log if line.startswith(("drain", "cordon")) and "node-001" not in line]

                stored = _stored_seqs(tmp_path / f"{new}.db")
                for a in agents:
                    node = a.agent.config.node_id
                    acked, last = a.agent.link.acked_event_seq, a.agent.buffer.next_seq - 1
                    seqs = stored.get(node, [])
                    missing = sorted(set(range(1, acked + 1)) - set(seqs))  # acked means stored
                    extra = sorted(s for s in set(seqs) if seqs.count(s) > 1 or not 1 <= s <= last)
                    assert (missing, extra) == ([], []), f"{node}: lost {missing}, duplicated/unknown {extra}"
                assert all(a.agent.link.reconnect.target == address[new] for a in agents)
                print(f"\nfailover: leader killed -> new leader elected {t_new - t_kill:.2f} s (lease TTL 5 s)")
            except BaseException:  # a failed wait or assert (or pytest-timeout's): show what the replicas did
                print(log_tails(tmp_path, ("c0", "c1")))
                raise
            finally:
                for a in agents:
                    await a.halt()
                if client is not None:
                    await client.close()
                for p in procs.values():
                    if p.poll() is None:
                        p.send_signal(signal.SIGTERM)
                for p in procs.values():
                    try:
                        p.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
