"""KubernetesScheduler with the official client against a LOCAL HTTP STAND-IN of the API.

No Kubernetes API server runs on these machines (only client libraries exist), so these
tests do not prove behaviour against a real cluster. The stand-in is an aiohttp app on
127.0.0.1 implementing just the endpoints the backend uses: GET/PATCH /api/v1/nodes/{name},
GET /api/v1/nodes, GET /api/v1/pods?fieldSelector=spec.nodeName=..., GET
/api/v1/namespaces/{ns}/pods?labelSelector=job-name=..., and POST
/api/v1/namespaces/{ns}/pods/{pod}/eviction answering 201, or 429 for PDB-protected pods.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

pytest.importorskip("kubernetes", reason="pip install kubernetes (the official client)")
from kubernetes import client as k8s

from controller.heal.scheduler.kubernetes import CORDONED_BY, TAINT_KEY, KubernetesScheduler, taint_value


def merge(dst: dict[str, Any], patch: dict[str, Any]) -> None:
    """Merge-patch semantics: dicts merge, None deletes, lists replace."""
    for k, v in patch.items():
        if v is None:
            dst.pop(k, None)
        elif isinstance(v, dict) and isinstance(dst.get(k), dict):
            merge(dst[k], v)
        else:
            dst[k] = copy.deepcopy(v)


class StandIn:
    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.pdb_blocked: set[str] = set()
        self.requests: list[tuple[str, str]] = []
        self.rv = 1

    def add_node(self, name: str, unschedulable: bool = False, annotations: dict[str, str] | None = None) -> None:
        self.nodes[name] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "annotations": dict(annotations or {}), "resourceVersion": str(self.rv)},
            "spec": {"unschedulable": unschedulable} if unschedulable else {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }

    def add_pod(
        self, ns: str, name: str, node: str, owner: str | None = None, mirror: bool = False, job: str | None = None
    ) -> None:
        meta: dict[str, Any] = {"name": name, "namespace": ns, "annotations": {}, "labels": {}}
        if owner:
            meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner, "name": "o", "uid": "u"}]
        if mirror:
            meta["annotations"]["kubernetes.io/config.mirror"] = "x"
        if job:
            meta["labels"]["job-name"] = job
        self.pods[(ns, name)] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running"},
        }

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/nodes", self.list_nodes)
        app.router.add_get("/api/v1/nodes/{name}", self.get_node)
        app.router.add_patch("/api/v1/nodes/{name}", self.patch_node)
        app.router.add_get("/api/v1/pods", self.list_pods)
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self.list_pods)
        app.router.add_post("/api/v1/namespaces/{ns}/pods/{pod}/eviction", self.evict)
        return app

    @staticmethod
    def status(code: int, reason: str, msg: str) -> web.Response:
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "reason": reason,
            "message": msg,
            "code": code,
        }
        return web.json_response(body, status=code)

    async def list_nodes(self, req: web.Request) -> web.Response:
        self.requests.append(("GET", req.path))
        return web.json_response(
            {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": list(self.nodes.values())}
        )

    async def get_node(self, req: web.Request) -> web.Response:
        self.requests.append(("GET", req.path))
        node = self.nodes.get(req.match_info["name"])
        return web.json_response(node) if node else self.status(404, "NotFound", "node not found")

    async def patch_node(self, req: web.Request) -> web.Response:
        self.requests.append(("PATCH", req.path))
        node = self.nodes.get(req.match_info["name"])
        if node is None:
            return self.status(404, "NotFound", "node not found")
        patch = await req.json()
        rv = patch.get("metadata", {}).pop("resourceVersion", None)
        if rv is not None and rv != node["metadata"]["resourceVersion"]:
            return self.status(409, "Conflict", "the object has been modified")
        merge(node, patch)
        self.rv += 1
        node["metadata"]["resourceVersion"] = str(self.rv)
        return web.json_response(node)

    async def list_pods(self, req: web.Request) -> web.Response:
        self.requests.append(("GET", req.path_qs))
        items = list(self.pods.values())
        if "ns" in req.match_info:
            items = [p for p in items if p["metadata"]["namespace"] == req.match_info["ns"]]
        field = req.query.get("fieldSelector", "")
        if field.startswith("spec.nodeName="):
            items = [p for p in items if p["spec"]["nodeName"] == field.split("=", 1)[1]]
        label = req.query.get("labelSelector", "")
        if label.startswith("job-name="):
            items = [p for p in items if p["metadata"]["labels"].get("job-name") == label.split("=", 1)[1]]
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})

    async def evict(self, req: web.Request) -> web.Response:
        ns, name = req.match_info["ns"], req.match_info["pod"]
        self.requests.append(("POST", req.path))
        body = await req.json()
        assert body["kind"] == "Eviction" and body["apiVersion"] == "policy/v1"
        if (ns, name) not in self.pods:
            return self.status(404, "NotFound", "pod not found")
        if name in self.pdb_blocked:
            msg = "Cannot evict pod as it would violate the pod's disruption budget."
            return self.status(429, "TooManyRequests", msg)
        del self.pods[(ns, name)]
        return web.json_response(body, status=201)


@pytest.fixture
async def api() -> AsyncIterator[tuple[StandIn, KubernetesScheduler]]:
    stand = StandIn()
    for n in ("gpu01", "gpu02", "gpu03"):
        stand.add_node(n)
    runner = web.AppRunner(stand.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    cfg = k8s.Configuration(host=f"http://127.0.0.1:{port}")
    client = k8s.ApiClient(cfg)
    try:
        yield stand, KubernetesScheduler(api_client=client, request_timeout_s=5)
    finally:
        client.close()
        await runner.cleanup()


async def test_cordon_taints_and_annotates_idempotently(api: tuple[StandIn, KubernetesScheduler]) -> None:
    stand, sched = api
    res = await sched.cordon("gpu01", "xid 79: GPU fell off the bus")
    assert res.ok, res
    node = stand.nodes["gpu01"]
    assert node["spec"]["unschedulable"] is True
    taint = {"key": TAINT_KEY, "value": "xid-79-GPU-fell-off-the-bus", "effect": "NoSchedule"}
    assert node["spec"]["taints"] == [taint]
    assert node["metadata"]["annotations"][CORDONED_BY] == "starpulse"
    patches = sum(1 for m, _ in stand.requests if m == "PATCH")
    assert (await sched.cordon("gpu01", "again")).ok
    assert sum(1 for m, _ in stand.requests if m == "PATCH") == patches  # second call changed nothing
    st = await sched.node_status("gpu01")
    assert (st.state, st.drained_by_us, st.reason) == ("cordoned", True, "xid 79: GPU fell off the bus")


async def test_drain_evicts_skipping_daemonset_and_mirror_pods(api: tuple[StandIn, KubernetesScheduler]) -> None:
    stand, sched = api
    stand.add_pod("ml", "trainer-0", "gpu02", owner="StatefulSet")
    stand.add_pod("kube-system", "dcgm-exporter", "gpu02", owner="DaemonSet")
    stand.add_pod("kube-system", "static-proxy", "gpu02", mirror=True)
    stand.add_pod("ml", "other", "gpu03")
    stand.nodes["gpu02"]["spec"]["taints"] = [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    res = await sched.drain("gpu02", "nvlink down")
    assert res.ok, res
    assert ("ml", "trainer-0") not in stand.pods
    assert {("kube-system", "dcgm-exporter"), ("kube-system", "static-proxy"), ("ml", "other")} <= set(stand.pods)
    keys = [t["key"] for t in stand.nodes["gpu02"]["spec"]["taints"]]
    assert keys == ["nvidia.com/gpu", TAINT_KEY]  # someone else's taint kept
    assert (await sched.node_status("gpu02")).state == "cordoned"


async def test_pdb_429_is_temporary(api: tuple[StandIn, KubernetesScheduler]) -> None:
    stand, sched = api
    stand.add_pod("ml", "trainer-1", "gpu03", owner="StatefulSet")
    stand.pdb_blocked.add("trainer-1")
    res = await sched.drain("gpu03", "ecc")
    assert not res.ok and not res.permanent and "PodDisruptionBudget" in res.detail
    assert (await sched.node_status("gpu03")).state == "draining"
    stand.pdb_blocked.clear()
    assert (await sched.drain("gpu03", "ecc")).ok  # the retry succeeds


async def test_resume_only_our_cordon(api: tuple[StandIn, KubernetesScheduler]) -> None:
    stand, sched = api
    stand.add_node("gpu09", unschedulable=True, annotations={"ops/ticket": "PSU-42"})
    res = await sched.resume("gpu09", "healthy")
    assert not res.ok and res.permanent and "someone else" in res.detail
    assert stand.nodes["gpu09"]["spec"]["unschedulable"] is True
    assert (await sched.cordon("gpu09", "xid")).ok
    assert "taints" not in stand.nodes["gpu09"]["spec"]  # their cordon left alone
    assert (await sched.node_status("gpu09")).drained_by_us is False

    assert (await sched.drain("gpu01", "xid 79")).ok
    res = await sched.resume("gpu01", "burn-in passed")
    assert res.ok, res
    node = stand.nodes["gpu01"]
    assert node["spec"]["unschedulable"] is False and node["spec"]["taints"] == []
    assert CORDONED_BY not in node["metadata"]["annotations"]
    assert (await sched.resume("gpu01", "again")).ok


async def test_requeue_evicts_job_pods_on_bad_node(api: tuple[StandIn, KubernetesScheduler]) -> None:
    stand, sched = api
    stand.add_pod("ml", "llm-0", "gpu01", job="llm")
    stand.add_pod("ml", "llm-1", "gpu02", job="llm")
    assert await sched.job_nodes("ml/llm") == ["gpu01", "gpu02"]
    res = await sched.requeue("ml/llm", exclude=["gpu02"], prefer=["gpu03"])
    assert res.ok, res
    assert set(stand.pods) == {("ml", "llm-0")}
    assert (await sched.requeue("ml/llm", exclude=["gpu02"], prefer=[])).ok  # nothing left to do
    sig = await sched.signal_job("ml/llm", "USR1")
    assert not sig.ok and sig.permanent
    assert {s.node for s in await sched.list_nodes()} == {"gpu01", "gpu02", "gpu03"}


async def test_bad_names_and_unknown_node_never_reach_the_api(api: tuple[StandIn, KubernetesScheduler]) -> None:
    stand, sched = api
    before = len(stand.requests)
    res = await sched.cordon("../nodes/gpu01", "x")
    assert not res.ok and res.permanent
    assert not (await sched.requeue("ml/llm?x=1", [], [])).ok
    assert len(stand.requests) == before
    res = await sched.drain("gpu77", "x")
    assert not res.ok and res.permanent and "404" in res.detail


def test_taint_value_is_a_label_value() -> None:
    assert taint_value("  --xid 79: GPU3!!  ") == "xid-79-GPU3"
    assert len(taint_value("x" * 200)) <= 63
    assert taint_value("\n\n") == "unspecified"
