"""Fault -> incident -> delivered webhook, starpulse side by side with Prometheus + Alertmanager.

starpulse: a controller with its production defaults (only addresses, database, fabric and
one Alertmanager-format webhook receiver set), six simulated compute nodes and their leaf
and spine switch agents, at report intervals 1 s and 5 s. Per row a fixed number of trials,
each a fresh target: Xid 79 (a record appended to the node's kernel log), DBE, GPU lost, a
NIC port down and a leaf down. Per trial: seconds from the fault to the incident naming the
right component, and to the webhook that carries it; for event-borne faults the per-stage
breakdown from the controller's trace (controller.stages) plus the agent's read of the log,
whose shares add up to the end-to-end time. A leaf down also counts NIC incidents opened
(churn) and incidents blaming a node.

Prometheus: the same simulated node's agent serving /metrics, scraped by Prometheus with an
alert rule on the DBE counter, Alertmanager sending the webhook; tuned (scrape and
evaluation 1 s, ``for: 0s``, ``group_wait: 0s``) and the common defaults (15 s / 15 s /
``group_wait: 30s``). Both Debian packages; skipped with a note when absent.

    python -m bench.latency [--quick] [--trials N] [--cap-s S] [--no-prometheus] [--kinds KIND ...]

``--quick``: one trial per row, interval 1 s only, Prometheus tuned only: a smoke run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from agent.factory import build_agent
from agent.runtime import AgentConfig
from agent.sim.node import SimNode
from bench.common import free_port, percentile, quiet_logging, table, write_result
from controller.detect.model import Incident
from controller.fabric import Fabric, generate_fabric
from controller.outputs.notify import parse_notify_config
from controller.service import Controller, ControllerConfig
from controller.stages import STAGES
from starpulse.app.scenario.cluster import SimCluster
from starpulse.app.scenario.spec import FaultSpec
from starpulse.core.clock import SYSTEM_CLOCK
from starpulse.core.vocab import EVICTABLE_KINDS

NODES = 6
TRIAL_TIMEOUT_S = 60.0


@dataclass
class Trial:
    incident_s: float | None = None
    webhook_s: float | None = None
    stages_ms: dict[str, float] = field(default_factory=dict)
    nic_incidents: int = 0
    node_blamed: int = 0


class Webhooks:
    """An HTTP receiver that keeps (arrival wall time, body text) of every POST."""

    def __init__(self) -> None:
        self.hits: list[tuple[float, str]] = []
        self.port = free_port()

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[Webhooks]:
        async def take(request: web.Request) -> web.Response:
            self.hits.append((time.time(), await request.text()))
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_post("/{tail:.*}", take)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        try:
            yield self
        finally:
            await runner.cleanup()

    def first_after(self, t0: float, needle: str) -> float | None:
        return next((t for t, body in self.hits if t >= t0 and needle in body), None)


class Opened:
    """Incident listener: wall time of every opened incident."""

    def __init__(self) -> None:
        self.opened: list[tuple[float, Incident]] = []

    def on_incident(self, change: str, incident: Incident) -> None:
        if change == "opened":
            self.opened.append((time.time(), incident))


# -- starpulse ---------------------------------------------------------------------------------

# kind -> (what it targets in trial i, the root cause that must open, how to inject)
Injector = Callable[[SimCluster, str], None]


def _kmsg_xid79(cluster: SimCluster, target: str) -> None:
    node, _, gpu = target.partition("/")
    sim = cluster.sims[node]
    sim.kmsg.xid(sim.gpu_kmsg_pci(int(gpu.removeprefix("gpu-"))), 79, "GPU has fallen off the bus.")


def _fault(kind: str, **params: Any) -> Injector:
    return lambda cluster, target: cluster.inject(FaultSpec(at_s=0, kind=kind, target=target, params=params))


def _gpu_target(i: int) -> str:
    return f"node-{i % NODES:03d}/gpu-{i // NODES}"


def _nic_target(i: int) -> str:
    return f"node-{i % NODES:03d}/nic-{i % 4}"


def _leaf_target(i: int) -> str:
    return f"leaf-b0-r{i}"


KINDS: dict[str, tuple[Callable[[int], str], Injector, int]] = {
    # name: (target of trial i, injector, most trials one cluster can take)
    "xid79": (_gpu_target, _kmsg_xid79, 12),
    "dbe": (_gpu_target, _fault("gpu_ecc_dbe"), 12),
    "gpu_lost": (_gpu_target, _fault("gpu_lost"), 12),
    "nic_down": (_nic_target, _fault("nic_down"), NODES),
    "leaf_down": (_leaf_target, _fault("switch_down"), 2),  # a third leaf of one node is a node fault
}


def bench_fabric() -> Fabric:
    return generate_fabric(nodes=NODES, gpus_per_node=8, rails=4, nodes_per_block=NODES, spines=2)


async def starpulse_row(kind: str, interval_s: float, trials: int, deadline: float) -> list[Trial]:
    """One cluster, ``trials`` faults of one kind one after another, each on a fresh target."""
    target_of, inject, most = KINDS[kind]
    fabric = bench_fabric()
    hooks = Webhooks()
    opened = Opened()
    out: list[Trial] = []
    with tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp:
        notify = parse_notify_config(
            {"receivers": [{"name": "am", "type": "alertmanager_webhook", "url": f"http://127.0.0.1:{hooks.port}/"}]}
        )
        ctl = Controller(
            ControllerConfig(
                listen="127.0.0.1:0",
                http="127.0.0.1:0",
                db_path=Path(tmp) / "c.db",
                fabric=fabric,
                notify=notify,
            ),
            clock=SYSTEM_CLOCK,
        )
        ctl.detection.listeners.append(opened)
        async with hooks.serving():
            await ctl.start()
            cluster = SimCluster(fabric, tmp, f"127.0.0.1:{ctl.grpc_port}", interval_s)
            try:
                await cluster.start()
                expected = len(fabric.nodes()) + len(fabric.switches())
                # Polling the registry, which has no event for "everyone reported".
                while sum(1 for n in ctl.registry.nodes.values() if n.latest_report is not None) < expected:  # noqa: ASYNC110
                    await asyncio.sleep(0.1)
                await asyncio.sleep(3 * interval_s)  # counters' baseline, the cadence measured
                for i in range(min(trials, most)):
                    if time.monotonic() > deadline:
                        break
                    out.append(await _trial(ctl, cluster, hooks, opened, kind, target_of(i), inject))
                    await asyncio.sleep(interval_s + 0.5)  # the next fault is another fault
            finally:
                await cluster.stop()
                await ctl.stop()
    return out


async def _trial(
    ctl: Controller, cluster: SimCluster, hooks: Webhooks, opened: Opened, kind: str, target: str, inject: Injector
) -> Trial:
    trial = Trial()
    seen = len(opened.opened)
    stages = getattr(ctl, "stages", None)  # None: a build before controller.stages (the "before" figures)
    done = len(stages.done) if stages is not None else 0
    t0 = time.time()
    inject(cluster, target)
    match = target if kind != "leaf_down" else f'"{target}"'
    limit = time.monotonic() + TRIAL_TIMEOUT_S
    incident: Incident | None = None
    while time.monotonic() < limit:
        await asyncio.sleep(0.005)
        if incident is None:
            for at, inc in opened.opened[seen:]:
                if inc.root_cause == target or (kind == "nic_down" and target in inc.root_cause):
                    incident, trial.incident_s = inc, at - t0
        if incident is not None:
            hit = hooks.first_after(t0, incident.id) or hooks.first_after(t0, match)
            if hit is not None:
                trial.webhook_s = hit - t0
                break
    if kind == "leaf_down":
        await asyncio.sleep(1.0)  # let anything that would churn open
        news = [inc for _, inc in opened.opened[seen:]]
        trial.nic_incidents = sum(1 for inc in news if inc.kind == "nic_fault")
        trial.node_blamed = sum(1 for inc in news if inc.kind in EVICTABLE_KINDS)
    for tr in list(stages.done)[done:] if stages is not None else []:
        if incident is not None and tr.incident == incident.id:
            read = tr.marks.get("read")
            trial.stages_ms = {"written": (read - t0) * 1000 if read else float("nan")}
            trial.stages_ms.update({s: v * 1000 for s, v in tr.shares().items() if s != STAGES[0]})
    return trial


# -- Prometheus + Alertmanager ----------------------------------------------------------------


@dataclass(frozen=True)
class PromTuning:
    name: str
    scrape_s: int
    eval_s: int
    group_wait_s: int


TUNED = PromTuning("prometheus tuned (1s/1s/for 0s/group_wait 0s)", 1, 1, 0)
DEFAULTS = PromTuning("prometheus defaults (15s/15s/group_wait 30s)", 15, 15, 30)


async def prometheus_row(tuning: PromTuning, trials: int, deadline: float) -> list[Trial] | str:
    """A simulated node's agent at 1 s, its DBE counter alerting through Prometheus and Alertmanager."""
    prom, am = shutil.which("prometheus"), shutil.which("prometheus-alertmanager")
    if prom is None or am is None:
        return "skipped: apt-get install --no-install-recommends prometheus prometheus-alertmanager"
    hooks = Webhooks()
    out: list[Trial] = []
    with tempfile.TemporaryDirectory(prefix="bench-prom-") as tmp:
        d = Path(tmp)
        sim = SimNode("node-000", d / "hw", seed=0)
        agent = build_agent(
            AgentConfig(
                node_id="node-000",
                controllers=[f"127.0.0.1:{free_port()}"],  # nobody: only /metrics matters here
                interval_s=1.0,
                buffer_path=str(d / "buffer.db"),
                metrics_listen="127.0.0.1:0",
            ),
            "sim",
            sim=sim,
        )
        stop = asyncio.Event()
        agent_task = asyncio.create_task(agent.run(stop))
        procs: list[subprocess.Popen[bytes]] = []
        async with hooks.serving():
            try:
                while agent.metrics_port == 0:  # noqa: ASYNC110 - set by the agent's start, no event for it
                    await asyncio.sleep(0.05)
                prom_port, am_port = free_port(), free_port()
                _write_configs(d, tuning, agent.metrics_port, am_port, hooks.port)
                procs.append(
                    _spawn(
                        [
                            am,
                            "--config.file",
                            str(d / "am.yml"),
                            "--storage.path",
                            str(d / "am"),
                            "--web.listen-address",
                            f"127.0.0.1:{am_port}",
                            "--cluster.listen-address=",
                        ],
                        d,
                    )
                )
                procs.append(_spawn([prom, "--config.file", str(d / "prom.yml"), "--storage.tsdb.path", str(d / "p"),
                                     "--web.listen-address", f"127.0.0.1:{prom_port}",
                                     "--rules.alert.resend-delay=1s"], d))  # fmt: skip
                await asyncio.sleep(max(2 * tuning.scrape_s, 6))  # the first scrapes (a baseline of 0)
                for i in range(min(trials, 8)):
                    if time.monotonic() > deadline:
                        break
                    t0 = time.time()
                    sim.nvml.inject_ecc_dbe(i)
                    limit = time.monotonic() + 3 * (tuning.scrape_s + tuning.eval_s + tuning.group_wait_s) + 30
                    trial = Trial()
                    while time.monotonic() < limit and trial.webhook_s is None:
                        await asyncio.sleep(0.005)
                        hit = hooks.first_after(t0, f'"gpu":"{i}"')
                        if hit is not None:
                            trial.webhook_s = trial.incident_s = hit - t0
                    out.append(trial)
            finally:
                for p in procs:
                    p.terminate()
                for p in procs:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(timeout=10)
                stop.set()
                await agent_task
    return out


def _spawn(argv: list[str], d: Path) -> subprocess.Popen[bytes]:
    log = (d / f"{Path(argv[0]).name}.log").open("wb")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)


def _write_configs(d: Path, t: PromTuning, agent_port: int, am_port: int, hook_port: int) -> None:
    rules = {
        "groups": [
            {
                "name": "gpu",
                "interval": f"{t.eval_s}s",
                "rules": [{"alert": "GpuDbe", "expr": "starpulse_gpu_ecc_dbe_volatile_total > 0", "for": "0s"}],
            }
        ]
    }
    (d / "rules.yml").write_text(yaml.safe_dump(rules))
    prom = {
        "global": {"scrape_interval": f"{t.scrape_s}s", "evaluation_interval": f"{t.eval_s}s"},
        "rule_files": [str(d / "rules.yml")],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
        "scrape_configs": [{"job_name": "agent", "static_configs": [{"targets": [f"127.0.0.1:{agent_port}"]}]}],
    }
    (d / "prom.yml").write_text(yaml.safe_dump(prom))
    am = {
        "route": {
            "receiver": "hook",
            "group_by": ["..."],  # every alert its own group: no batching between trials
            "group_wait": f"{t.group_wait_s}s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [{"name": "hook", "webhook_configs": [{"url": f"http://127.0.0.1:{hook_port}/"}]}],
    }
    (d / "am.yml").write_text(yaml.safe_dump(am))


# -- report ------------------------------------------------------------------------------------


def _p(values: list[float], q: float) -> float:
    return percentile(values, q) if values else float("nan")


def summarize(trials: list[Trial]) -> dict[str, Any]:
    inc = [t.incident_s for t in trials if t.incident_s is not None]
    hook = [t.webhook_s for t in trials if t.webhook_s is not None]
    stages: dict[str, float] = {}
    traced = [t.stages_ms for t in trials if t.stages_ms]
    for name in ("written", *STAGES[1:]):
        vals = [s[name] for s in traced if name in s]
        if vals:
            stages[name] = _p(vals, 50)
    return {
        "trials": len(trials),
        "missed": sum(1 for t in trials if t.webhook_s is None),
        "incident_p50_s": _p(inc, 50),
        "incident_p99_s": _p(inc, 99),
        "webhook_p50_s": _p(hook, 50),
        "webhook_p99_s": _p(hook, 99),
        "stages_p50_ms": stages,
        "nic_incidents_opened": sum(t.nic_incidents for t in trials),
        "incidents_blaming_a_node": sum(t.node_blamed for t in trials),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    deadline = time.monotonic() + args.cap_s
    intervals = (1.0,) if args.quick else (1.0, 5.0)
    rows: dict[str, Any] = {}
    for interval in intervals:
        for kind in args.kinds or KINDS:
            trials = 1 if args.quick else args.trials
            rows[f"starpulse {kind} @{interval:g}s"] = summarize(await starpulse_row(kind, interval, trials, deadline))
    if not args.no_prometheus:
        for tuning in (TUNED,) if args.quick else (TUNED, DEFAULTS):
            result = await prometheus_row(tuning, 1 if args.quick else args.trials, deadline)
            rows[tuning.name] = result if isinstance(result, str) else summarize(result)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one trial per row, 1 s interval, tuned Prometheus only")
    parser.add_argument("--trials", type=int, default=6, help="trials per row (default 6)")
    parser.add_argument("--cap-s", type=float, default=1800.0, help="wall-time cap: no new trial after it")
    parser.add_argument("--no-prometheus", action="store_true", help="starpulse rows only")
    parser.add_argument("--kinds", nargs="*", choices=sorted(KINDS), help="starpulse fault kinds (default: all)")
    args = parser.parse_args()
    if args.trials < 1:
        parser.error("--trials: must be at least 1")
    quiet_logging()
    started = time.monotonic()
    rows = asyncio.run(run(args))
    print(_render(rows))
    path = write_result(
        "latency", {"quick": args.quick, "trials": args.trials, "nodes": NODES}, rows,
        wall_s=round(time.monotonic() - started, 1),
    )  # fmt: skip
    print(f"\nresult: {path}")


def _render(rows: dict[str, Any]) -> str:
    lines: list[tuple[str, Any]] = []
    tuned = rows.get(TUNED.name)
    defaults = rows.get(DEFAULTS.name)
    for name, r in rows.items():
        if isinstance(r, str):
            lines.append((name, r))
            continue
        cell = (
            f"incident p50 {r['incident_p50_s']:.3f} s p99 {r['incident_p99_s']:.3f} s | "
            f"webhook p50 {r['webhook_p50_s']:.3f} s p99 {r['webhook_p99_s']:.3f} s (n={r['trials']}, "
            f"missed {r['missed']})"
        )
        if name.startswith("starpulse") and "leaf" in name:
            cell += f" | NIC incidents {r['nic_incidents_opened']}, blaming a node {r['incidents_blaming_a_node']}"
        for ref in (tuned, defaults):
            if isinstance(ref, dict) and name.startswith("starpulse") and r["webhook_p50_s"] > 0:
                cell += (
                    f" | x{ref['webhook_p50_s'] / r['webhook_p50_s']:.1f} vs {'tuned' if ref is tuned else 'defaults'}"
                )
        lines.append((name, cell))
        if r["stages_p50_ms"]:
            lines.append(("  stages p50 (ms)", " ".join(f"{k} {v:.1f}" for k, v in r["stages_p50_ms"].items())))
    return table("fault -> incident -> webhook (seconds)", lines)


if __name__ == "__main__":
    main()
