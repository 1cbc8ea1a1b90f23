"""Prometheus integration: rules and dashboard against the real expositions, and a real scrape.

Needs the Debian package `prometheus` (prometheus + promtool); the tests that need a
binary skip with that reason when it is absent.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from agent.factory import build_agent
from agent.runtime import AgentConfig
from agent.sim.node import SimNode
from controller.service import Controller, ControllerConfig
from starpulse.core.clock import SYSTEM_CLOCK
from tests.helpers import free_port
from tests.support.metrics import agent_expositions, controller_exposition

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
EXAMPLE_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "starpulse.json"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
METRIC_RE = re.compile(r"\bstarpulse_[a-z0-9_]+\b")
INCIDENT_DESCRIPTION = "See `starpulse incidents` for root cause and recommended action."
NO_PROMTOOL = "promtool not installed (apt-get install --no-install-recommends prometheus)"


def exposed_names(tmp_path: Path) -> set[str]:
    """Every sample and family name the agent (compute + switch) and the controller expose."""
    names: set[str] = set()
    for text in [*agent_expositions(tmp_path), controller_exposition()]:
        for fam in text_string_to_metric_families(text):
            names.add(fam.name)
            names.update(s.name for s in fam.samples)
    return names


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for var in dashboard.get("templating", {}).get("list", []):
        query = var.get("query")
        exprs.append(query["query"] if isinstance(query, dict) else str(query))
    return exprs


def rule_exprs() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [r["expr"] for g in doc["groups"] for r in g["rules"]]


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], check=False, capture_output=True, text=True, timeout=60)


class TestDeployFiles:
    def test_dashboard_shape(self) -> None:
        dash = json.loads(DASHBOARD.read_text())
        assert 36 <= dash["schemaVersion"] <= 41
        assert [i["name"] for i in dash["__inputs"]] == ["DS_PROMETHEUS"]
        titles = {p["title"] for p in dash["panels"]}
        for wanted in (
            "Nodes by state",
            "Open incidents by kind",
            "Detection latency",
            "Ingest rate",
            "GPU temperature",
            "GPU power",
            "GPU utilization",
            "ECC and Xid",
            "NIC ports not ACTIVE",
            "NIC error rates",
            "PFC pause rates",
            "Switch ports down",
            "Optics RX power",
        ):
            assert wanted in titles
        for p in dash["panels"]:
            if p["type"] != "row":
                assert p["datasource"]["uid"] == "${DS_PROMETHEUS}", p["title"]
                assert p["targets"], p["title"]
        assert any("histogram_quantile(0.99" in e for e in dashboard_exprs(dash))

    def test_dashboard_and_rules_use_only_exposed_metrics(self, tmp_path: Path) -> None:
        """Renaming a series in code without updating the dashboard or rules fails here."""
        names = exposed_names(tmp_path)
        dash = json.loads(DASHBOARD.read_text())
        for source, exprs in (("dashboard", dashboard_exprs(dash)), ("rules", rule_exprs())):
            used = {m for e in exprs for m in METRIC_RE.findall(e)}
            assert used, source
            missing = sorted(used - names)
            assert not missing, f"{source} uses series no exposition has: {missing}"

    def test_rules_pass_promtool(self) -> None:
        if PROMTOOL is None:
            pytest.skip(NO_PROMTOOL)
        proc = promtool("check", "rules", str(RULES))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        proc = promtool("check", "config", "--syntax-only", str(EXAMPLE_CONFIG))
        assert proc.returncode == 0, proc.stdout + proc.stderr

    def test_rules_fire_as_intended(self, tmp_path: Path) -> None:
        """promtool's rule unit tests: a few alerts fire, with the labels routing relies on."""
        if PROMTOOL is None:
            pytest.skip(NO_PROMTOOL)
        gpu = 'node="node-000",gpu="3",uuid="GPU-x",pci="00000000:0B:00.0",job="starpulse-agent",instance="a:9464"'
        port = 'node="leaf-0",port="Ethernet8",job="starpulse-agent",instance="s:9464"'
        tests = {
            "rule_files": [str(RULES)],
            "evaluation_interval": "1m",
            "tests": [
                {
                    "interval": "1m",
                    "input_series": [
                        {"series": f"starpulse_gpu_lost{{{gpu}}}", "values": "0 1 1 1"},
                        {"series": 'starpulse_incidents_open{kind="gpu_fault"}', "values": "1x5"},
                        {"series": 'starpulse_incidents_open{kind="link_fault"}', "values": "1x5"},
                        {"series": f'starpulse_switch_port_optic_rx_power_dbm{{{port},lane="1"}}', "values": "-14x5"},
                        {"series": f'starpulse_switch_port_optic_rx_power_dbm{{{port},lane="2"}}', "values": "-2x5"},
                        {"series": f"starpulse_switch_port_optic_rx_power_low_alarm_dbm{{{port}}}", "values": "-10x5"},
                        {"series": f"starpulse_gpu_ecc_dbe_volatile_total{{{gpu}}}", "values": "0 0 1 1"},
                        {
                            "series": 'starpulse_relays_connected{job="starpulse-controller",instance="c:8080"}',
                            "values": "3 3 2 2 2 2 2",
                        },
                        {
                            "series": 'starpulse_detect_shard_reports_in_flight{job="starpulse-controller",'
                            'instance="c:8080"}',
                            "values": "100 3000 3000 3000 3000 3000 3000 3000",
                        },
                    ],
                    "alert_rule_test": [
                        {
                            "eval_time": "2m",
                            "alertname": "StarpulseGpuLost",
                            "exp_alerts": [
                                {
                                    "exp_labels": {
                                        "severity": "critical",
                                        "node": "node-000",
                                        "gpu": "3",
                                        "uuid": "GPU-x",
                                        "pci": "00000000:0B:00.0",
                                        "job": "starpulse-agent",
                                        "instance": "a:9464",
                                    },
                                    "exp_annotations": {
                                        "summary": "GPU 3 (00000000:0B:00.0) on node-000 is lost (fell off the bus)"
                                    },
                                }
                            ],
                        },
                        {
                            "eval_time": "1m",
                            "alertname": "StarpulseIncidentOpen",
                            "exp_alerts": [
                                {
                                    "exp_labels": {"severity": "critical", "kind": "gpu_fault"},
                                    "exp_annotations": {
                                        "summary": "1 open gpu_fault incident(s)",
                                        "description": INCIDENT_DESCRIPTION,
                                    },
                                },
                                {
                                    "exp_labels": {"severity": "warning", "kind": "link_fault"},
                                    "exp_annotations": {
                                        "summary": "1 open link_fault incident(s)",
                                        "description": INCIDENT_DESCRIPTION,
                                    },
                                },
                            ],
                        },
                        {
                            "eval_time": "4m",
                            "alertname": "StarpulseOpticPowerOutOfRange",
                            "exp_alerts": [
                                {
                                    "exp_labels": {
                                        "severity": "warning",
                                        "node": "leaf-0",
                                        "port": "Ethernet8",
                                        "lane": "1",
                                        "job": "starpulse-agent",
                                        "instance": "s:9464",
                                    },
                                    "exp_annotations": {
                                        "summary": "Optic on switch leaf-0 port Ethernet8 lane 1 at -14 dBm, "
                                        "outside its alarm thresholds"
                                    },
                                }
                            ],
                        },
                        {"eval_time": "1m", "alertname": "StarpulseGpuEccDbe", "exp_alerts": []},
                        {"eval_time": "2m", "alertname": "StarpulseRelayLost", "exp_alerts": []},
                        {"eval_time": "5m", "alertname": "StarpulseDetectionShardsBehind", "exp_alerts": []},
                        {
                            "eval_time": "6m",
                            "alertname": "StarpulseDetectionShardsBehind",
                            "exp_alerts": [
                                {
                                    "exp_labels": {
                                        "severity": "warning",
                                        "job": "starpulse-controller",
                                        "instance": "c:8080",
                                    },
                                    "exp_annotations": {
                                        "summary": "Controller c:8080 has 3000 reports waiting in its detection shards",
                                        "description": "Add detection workers (detection.workers) or controller "
                                        "CPU; see docs/architecture.md, Detection shards.",
                                    },
                                }
                            ],
                        },
                        {
                            "eval_time": "5m",
                            "alertname": "StarpulseRelayLost",
                            "exp_alerts": [
                                {
                                    "exp_labels": {
                                        "severity": "warning",
                                        "job": "starpulse-controller",
                                        "instance": "c:8080",
                                    },
                                    "exp_annotations": {
                                        "summary": "Controller c:8080 has 2 relay(s) connected, fewer than in the "
                                        "last hour",
                                        "description": "Check `systemctl status starpulse-relay` on the relay "
                                        "hosts; agents should list a second relay.",
                                    },
                                }
                            ],
                        },
                    ],
                }
            ],
        }
        path = tmp_path / "rules_test.yml"
        path.write_text(yaml.safe_dump(tests, sort_keys=False))
        proc = promtool("test", "rules", str(path))
        assert proc.returncode == 0, proc.stdout + proc.stderr


# -- a real Prometheus scraping a real controller and agent --------------------------------


@pytest.fixture
def prometheus_binary() -> str:
    if PROMETHEUS is None:
        pytest.skip("prometheus not installed (apt-get install --no-install-recommends prometheus)")
    return PROMETHEUS


class PrometheusProcess:
    def __init__(self, binary: str, workdir: Path, agent_port: int, controller_port: int) -> None:
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {"job_name": "starpulse-agent", "static_configs": [{"targets": [f"127.0.0.1:{agent_port}"]}]},
                {
                    "job_name": "starpulse-controller",
                    "static_configs": [{"targets": [f"127.0.0.1:{controller_port}"]}],
                },
            ],
        }
        config_path = workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config))
        self.log = (workdir / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--rules.alert.resend-delay=1s",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()


@pytest.fixture
def prometheus_factory(prometheus_binary: str, tmp_path: Path) -> Iterator[list[PrometheusProcess]]:
    started: list[PrometheusProcess] = []
    yield started
    for p in started:
        p.stop()


async def query(session: aiohttp.ClientSession, base: str, promql: str) -> list[dict[str, Any]]:
    try:
        async with session.get(f"{base}/api/v1/query", params={"query": promql}) as resp:
            if resp.status != 200:
                return []
            body = await resp.json()
    except aiohttp.ClientError:
        return []
    return list(body.get("data", {}).get("result", []))


@pytest.mark.slow
async def test_real_prometheus_scrapes_agent_and_controller(
    tmp_path: Path, prometheus_binary: str, prometheus_factory: list[PrometheusProcess]
) -> None:
    grpc_port, agent_metrics_port = free_port(), free_port()
    ctl = Controller(
        ControllerConfig(
            listen=f"127.0.0.1:{grpc_port}",
            http="127.0.0.1:0",
            db_path=tmp_path / "controller.db",
            sweep_interval_s=0.2,
        ),
        clock=SYSTEM_CLOCK,
    )
    await ctl.start()
    agent = build_agent(
        AgentConfig(
            node_id="node-000",
            controllers=[f"127.0.0.1:{grpc_port}"],
            interval_s=0.5,
            buffer_path=str(tmp_path / "buffer.db"),
            metrics_listen=f"127.0.0.1:{agent_metrics_port}",
        ),
        "sim",
        sim=SimNode("node-000", tmp_path / "hw", seed=0),
    )
    stop = asyncio.Event()
    agent_task = asyncio.create_task(agent.run(stop))
    try:
        prom = PrometheusProcess(prometheus_binary, tmp_path, agent_metrics_port, ctl.http_port)
        prometheus_factory.append(prom)
        checks = {
            "agent up": 'up{job="starpulse-agent"} == 1',
            "controller up": 'up{job="starpulse-controller"} == 1',
            "gpu power": 'starpulse_gpu_power_watts{job="starpulse-agent",node="node-000",gpu="0"} > 100',
            "node online": 'starpulse_nodes{job="starpulse-controller",state="online"} == 1',
            "agent connected": 'starpulse_agent_connected{node="node-000"} == 1',
            "nic rail": 'starpulse_nic_up{node="node-000",rail="0"} == 1',
            # Ingest rate, as the dashboard computes it.
            "ingest rate": "sum(rate(starpulse_reports_received_total[10s])) > 0",
        }
        pending = dict(checks)
        deadline = time.monotonic() + 60
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            while pending:
                assert prom.proc.poll() is None, "prometheus exited; see prometheus.log"
                for what, promql in list(pending.items()):
                    if await query(session, prom.url, promql):
                        del pending[what]
                if time.monotonic() > deadline:
                    raise AssertionError(f"prometheus never saw: {sorted(pending)}")
                await asyncio.sleep(0.5)
            async with session.get(f"{prom.url}/api/v1/rules") as resp:
                groups = (await resp.json())["data"]["groups"]
            assert {g["name"] for g in groups} >= {"starpulse-controller", "starpulse-gpu", "starpulse-switch"}
            assert all(r["health"] != "err" for g in groups for r in g["rules"])
    finally:
        stop.set()
        await agent_task
        await ctl.stop()
