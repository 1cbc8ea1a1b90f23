"""Controller failover on etcd: leader SIGKILLed -> new leader acting, and what a durable state write costs.

    .venv/bin/python -m bench.failover [--runs 5] [--ttl 5] [--writes 300]

Part 1 (failover). A real etcd (Debian's etcd-server) on free ports and two controller
processes (`starpulse controller --etcd ... --ha-lease-ttl TTL`). Each run SIGKILLs the
leader and measures, from the kill:
- *elected*: the leader key in etcd names the other replica (polled every 10 ms);
- *acting*: the new leader answers an agent's Hello with a Welcome on Telemetry.Connect
  (polled every 20 ms), i.e. it has restored the state and serves.
The killed replica is then restarted and waits as a standby for the next run.

Part 2 (write latency), in this process: the same remediation-state write (one node's
transition, a RemediationStore row plus its history row) on SQLite alone, and on SQLite
followed by the fenced flush to etcd that makes it durable across failover; likewise one
event batch (1 event + the node's ack position). Medians over --writes writes each.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import free_port, median, percentile, quiet_logging, table, write_result
from starpulse.core.clock import SYSTEM_CLOCK


class Etcd:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.endpoint = f"127.0.0.1:{free_port()}"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Etcd:
        binary = shutil.which("etcd")
        if binary is None:
            raise SystemExit("bench.failover needs etcd (Debian: apt-get install etcd-server)")
        client, peer = f"http://{self.endpoint}", f"http://127.0.0.1:{free_port()}"
        log = (self.workdir / "etcd.log").open("wb")
        self.proc = subprocess.Popen(
            [
                binary,
                "--name",
                "b",
                "--data-dir",
                str(self.workdir / "etcd"),
                "--listen-client-urls",
                client,
                "--advertise-client-urls",
                client,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                f"b={peer}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while b"ready to serve client requests" not in (self.workdir / "etcd.log").read_bytes():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit("etcd did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=20)


def start_replica(workdir: Path, name: str, listen: str, etcd: str, ttl: int) -> subprocess.Popen[bytes]:
    with (workdir / f"{name}.log").open("ab") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "starpulse.app.cli",
                "controller",
                "--listen",
                listen,
                "--http",
                "127.0.0.1:0",
                "--db",
                str(workdir / f"{name}.db"),
                "--etcd",
                etcd,
                "--ha-lease-ttl",
                str(ttl),
                "--ha-cluster",
                "bench",
                "--log-level",
                "warning",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )


async def welcomed(address: str) -> bool:
    """True when address answers a Hello with a Welcome (the leader acting), False on any refusal."""
    import grpc

    from starpulse.v1 import inventory_pb2 as ipb
    from starpulse.v1 import service_pb2 as spb
    from starpulse.v1 import service_pb2_grpc as sgrpc

    async with grpc.aio.insecure_channel(address) as channel:
        call = sgrpc.TelemetryStub(channel).Connect()
        try:
            await call.write(
                spb.AgentMessage(
                    hello=spb.Hello(
                        node_id="bench-probe", role=ipb.NODE_ROLE_COMPUTE, buffer_epoch="bench", agent_version="bench"
                    )
                )
            )
            first = await asyncio.wait_for(call.read(), 1.0)
            return first is not grpc.aio.EOF and first.HasField("welcome")
        except (grpc.aio.AioRpcError, TimeoutError, asyncio.InvalidStateError):
            return False
        finally:
            call.cancel()


async def failover_runs(workdir: Path, etcd: str, runs: int, ttl: int) -> list[dict[str, float]]:
    from controller.ha.config import HAConfig
    from controller.ha.etcd import connect

    ha = HAConfig(etcd=[etcd], cluster="bench")
    client = await connect(ha)
    names = ("r0", "r1")
    listen = {n: f"127.0.0.1:{free_port()}" for n in names}
    procs = {n: start_replica(workdir, n, listen[n], etcd, ttl) for n in names}
    out: list[dict[str, float]] = []

    async def leader() -> str:
        kv = await client.get(ha.key("leader"))
        return kv.value.decode() if kv is not None else ""

    async def until(cond: Any, timeout: float, what: str, every: float) -> None:  # noqa: ASYNC109
        deadline = time.monotonic() + timeout
        while not await cond():
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out waiting for {what}")
            await asyncio.sleep(every)

    try:
        await until(lambda: _acting(listen, leader), 60, "a first leader", 0.1)
        for i in range(runs):
            old_addr = await leader()
            old = next(n for n in names if listen[n] == old_addr)
            new = next(n for n in names if n != old)
            await until(lambda addr=listen[new]: _standby_up(addr), 60, "the standby", 0.1)
            await asyncio.sleep(ttl / 3 * ((i % 3) / 3))  # kill at different points of the keep-alive cycle
            t_kill = time.monotonic()
            procs[old].kill()
            t_elected = 0.0
            while True:
                now_leader = await leader()
                if now_leader == listen[new] and not t_elected:
                    t_elected = time.monotonic()
                if t_elected and await welcomed(listen[new]):
                    t_acting = time.monotonic()
                    break
                if time.monotonic() - t_kill > 10 * ttl + 30:
                    raise SystemExit("no new leader")
                await asyncio.sleep(0.01 if not t_elected else 0.02)
            procs[old].wait(timeout=10)
            out.append({"elected_s": t_elected - t_kill, "acting_s": t_acting - t_kill})
            print(f"  run {i + 1}: elected {t_elected - t_kill:.2f} s, acting {t_acting - t_kill:.2f} s", flush=True)
            procs[old] = start_replica(workdir, old, listen[old], etcd, ttl)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        await client.close()
    return out


async def _acting(listen: dict[str, str], leader: Any) -> bool:
    addr = await leader()
    return bool(addr) and await welcomed(addr)


async def _standby_up(address: str) -> bool:
    """A standby refuses the Hello (FAILED_PRECONDITION) rather than failing to connect."""
    import grpc

    from starpulse.v1 import service_pb2 as spb
    from starpulse.v1 import service_pb2_grpc as sgrpc

    async with grpc.aio.insecure_channel(address) as channel:
        call = sgrpc.TelemetryStub(channel).Connect()
        try:
            await call.write(spb.AgentMessage(hello=spb.Hello(node_id="bench-probe")))
            await asyncio.wait_for(call.read(), 1.0)
        except grpc.aio.AioRpcError as err:
            return err.code() == grpc.StatusCode.FAILED_PRECONDITION
        except (TimeoutError, asyncio.InvalidStateError):
            return False
        finally:
            call.cancel()
        return False


async def write_latency(workdir: Path, etcd: str, writes: int) -> dict[str, float]:
    from controller.ha.config import HAConfig
    from controller.ha.election import Elector
    from controller.ha.etcd import connect
    from controller.ha.mirror import StateMirror
    from controller.heal.states import NodeHealState, RemediationStore
    from controller.store import Store, StoredNode
    from starpulse.v1 import inventory_pb2 as ipb
    from starpulse.v1 import telemetry_pb2 as tpb

    ha = HAConfig(etcd=[etcd], cluster="bench-writes")
    client = await connect(ha)
    elector = Elector(client, ha.key("leader"), "bench:1", 5)
    assert await elector.campaign(asyncio.Event())
    figures: dict[str, float] = {}
    try:
        for mode in ("sqlite", "etcd"):
            store = Store(workdir / f"writes-{mode}.db")
            heal = RemediationStore(store.connection, SYSTEM_CLOCK)
            mirror = StateMirror(store.connection, client, ha, elector) if mode == "etcd" else None
            store.upsert_node(
                StoredNode("node-0", ipb.NODE_ROLE_COMPUTE, "online", 1, 1, "", "", ipb.Inventory(), "e", 0)
            )
            if mirror is not None:
                await mirror.flush()
            state_t, event_t = [], []
            for i in range(writes):
                t0 = time.perf_counter()
                heal.transition(f"node-{i:05d}", NodeHealState.SUSPECT, "bench", f"inc-{i}")
                if mirror is not None:
                    await mirror.flush()
                state_t.append(time.perf_counter() - t0)
                ev = tpb.Event(
                    seq=i + 1,
                    timestamp_ms=i,
                    kind=tpb.EVENT_KIND_XID,
                    severity=tpb.SEVERITY_WARNING,
                    component="gpu-0",
                    xid=43,
                    message="bench",
                )
                t0 = time.perf_counter()
                store.insert_events("node-0", "e", [ev], received_ms=i, acked_event_seq=i + 1)
                if mirror is not None:
                    await mirror.flush()
                event_t.append(time.perf_counter() - t0)
            figures[f"state_write_{mode}_median_ms"] = median(state_t) * 1000
            figures[f"state_write_{mode}_p90_ms"] = percentile(state_t, 90) * 1000
            figures[f"event_write_{mode}_median_ms"] = median(event_t) * 1000
            store.close()
        figures["state_write_added_median_ms"] = (
            figures["state_write_etcd_median_ms"] - figures["state_write_sqlite_median_ms"]
        )
        figures["event_write_added_median_ms"] = (
            figures["event_write_etcd_median_ms"] - figures["event_write_sqlite_median_ms"]
        )
    finally:
        await elector.resign()
        await client.close()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="leader kills (default 5)")
    parser.add_argument("--ttl", type=int, default=5, help="leader lease TTL in seconds (default 5, the default)")
    parser.add_argument("--writes", type=int, default=300, help="writes per mode in part 2 (default 300)")
    args = parser.parse_args(argv)
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # before grpc loads: no GOAWAY info lines from the kills
    quiet_logging()
    with tempfile.TemporaryDirectory(prefix="sp-failover-") as tmp, Etcd(Path(tmp)) as etcd:
        workdir = Path(tmp)
        print(f"failover: {args.runs} leader kills, lease TTL {args.ttl} s, 2 replicas", flush=True)
        runs = asyncio.run(failover_runs(workdir, etcd.endpoint, args.runs, args.ttl))
        writes = asyncio.run(write_latency(workdir, etcd.endpoint, args.writes))
    acting = [r["acting_s"] for r in runs]
    elected = [r["elected_s"] for r in runs]
    figures = {
        "failover_acting_median_s": median(acting),
        "failover_acting_p90_s": percentile(acting, 90),
        "failover_acting_max_s": max(acting),
        "failover_elected_median_s": median(elected),
        **writes,
    }
    print(table(f"controller failover (lease TTL {args.ttl} s) and durable-write cost", list(figures.items())))
    path = write_result("failover", vars(args), figures, runs=runs)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
