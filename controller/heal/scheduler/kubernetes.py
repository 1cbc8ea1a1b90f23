"""Kubernetes backend: cordon, taint and evict through the official `kubernetes` client.

NOTE: no Kubernetes API server runs on the machines this project is developed and
tested on. This module is tested only against a local HTTP stand-in of the few API
endpoints it uses (tests/controller/heal/scheduler/test_scheduler_kubernetes.py), not a real cluster.

Semantics (telemetry.md 6.4):
* cordon = PATCH node spec.unschedulable=true, plus our taint
  `starpulse.io/unhealthy=<reason slug>:NoSchedule` and annotations
  `starpulse.io/cordoned-by=starpulse`, `starpulse.io/reason=<full reason>`.
  A GPU fault does not make a node NotReady, so the node controller never does this.
* drain = cordon (+ a NoExecute taint when `noexecute_on_drain`), then a policy/v1
  Eviction for every pod on the node (fieldSelector spec.nodeName), skipping mirror
  pods, DaemonSet pods and finished pods. A 429 (PodDisruptionBudget) is a temporary
  failure: the orchestrator retries later.
* resume = uncordon and drop our taint and annotations, but only when the annotation
  says we cordoned it: someone else's cordon is never undone.
* requeue = evict the job's pods on the excluded nodes; their controller recreates them
  and the scheduler places them away from the cordoned node. `prefer` cannot be forced
  without editing the workload, so it is only logged. signal_job is not possible through
  the API (permanent failure).
The client is blocking, so every call runs in a thread (asyncio.to_thread).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import structlog
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from controller.heal.scheduler.base import (
    ALLOCATED,
    CORDONED,
    DOWN,
    DRAINING,
    IDLE,
    ActionResult,
    InvalidName,
    NodeStatus,
    SchedulerError,
    sanitize_reason,
    validate_job_id,
    validate_node_id,
)

log = structlog.get_logger(__name__)

TAINT_KEY = "starpulse.io/unhealthy"
CORDONED_BY = "starpulse.io/cordoned-by"
REASON_ANNOTATION = "starpulse.io/reason"
OURS = "starpulse"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


def taint_value(reason: str) -> str:
    """A reason as a label value (≤63 chars of [A-Za-z0-9._-], alphanumeric at both ends)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", sanitize_reason(reason))[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", slug) or "unhealthy"


def _status_code(exc: ApiException) -> int:
    return int(exc.status or 0)


def _api_result(exc: ApiException, what: str) -> ActionResult:
    """429/409/5xx and connection trouble are temporary; other 4xx are permanent."""
    code = _status_code(exc)
    detail = f"{what}: HTTP {code} {exc.reason}"
    if code in (0, 408, 409, 429) or code >= 500:
        return ActionResult.temporary(detail)
    return ActionResult.failure(detail)


class KubernetesScheduler:
    """Scheduler backed by the Kubernetes API (CoreV1 nodes/pods, policy/v1 evictions)."""

    name = "kubernetes"

    def __init__(
        self,
        api_client: k8s.ApiClient | None = None,
        config_file: str | None = None,
        noexecute_on_drain: bool = False,
        grace_period_s: int | None = None,
        request_timeout_s: float = 30.0,
    ) -> None:
        if api_client is None:
            from kubernetes import config

            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config(config_file=config_file)
            api_client = k8s.ApiClient()
        self.api = k8s.CoreV1Api(api_client)
        self.noexecute_on_drain = noexecute_on_drain
        self.grace_period_s = grace_period_s
        self.request_timeout_s = request_timeout_s

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("_request_timeout", self.request_timeout_s)
        return await asyncio.to_thread(fn, *args, **kwargs)

    # -- node helpers --------------------------------------------------------------
    @staticmethod
    def _ours(node: Any) -> bool:
        return bool((node.metadata.annotations or {}).get(CORDONED_BY) == OURS)

    @staticmethod
    def _our_taints(node: Any) -> list[Any]:
        return [t for t in (node.spec.taints or []) if t.key == TAINT_KEY]

    async def _get_node(self, node: str) -> Any:
        return await self._call(self.api.read_node, node)

    async def _mark(self, node: str, reason: str, effects: list[str]) -> ActionResult:
        """Cordon with our taint(s) and annotations; leave someone else's cordon alone."""
        try:
            validate_node_id(node)
            obj = await self._get_node(node)
        except InvalidName as exc:
            return ActionResult.failure(str(exc))
        except ApiException as exc:
            return _api_result(exc, f"read node {node}")
        if obj.spec.unschedulable and not self._ours(obj):
            log.info("k8s_cordon_noop", node=node, by="someone else")
            return ActionResult.success(f"{node} already cordoned by someone else")
        why = sanitize_reason(reason)
        have = {t.effect for t in self._our_taints(obj)}
        if obj.spec.unschedulable and set(effects) <= have:
            return ActionResult.success(f"{node} already cordoned by us")
        taints = [t.to_dict() for t in (obj.spec.taints or []) if t.key != TAINT_KEY]
        taints = [{k: v for k, v in t.items() if v is not None} for t in taints]
        value = taint_value(why)
        taints += [{"key": TAINT_KEY, "value": value, "effect": e} for e in sorted(set(effects) | have)]
        body = {
            "metadata": {
                "annotations": {CORDONED_BY: OURS, REASON_ANNOTATION: why},
                "resourceVersion": obj.metadata.resource_version,  # optimistic lock: 409 on a race
            },
            "spec": {"unschedulable": True, "taints": taints},
        }
        try:
            await self._call(self.api.patch_node, node, body)
        except ApiException as exc:
            return _api_result(exc, f"cordon {node}")
        log.info("k8s_cordoned", node=node, reason=why, effects=effects)
        return ActionResult.success(f"cordoned {node}: {why}")

    async def _pods_on(self, node: str) -> list[Any]:
        pods = await self._call(self.api.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}")
        return list(pods.items or [])

    @staticmethod
    def _evictable(pod: Any) -> bool:
        if (pod.metadata.annotations or {}).get(MIRROR_ANNOTATION):
            return False
        if any(o.kind == "DaemonSet" for o in (pod.metadata.owner_references or [])):
            return False
        return (pod.status.phase if pod.status else None) not in {"Succeeded", "Failed"}

    async def _evict(self, pods: list[Any]) -> ActionResult:
        blocked: list[tuple[str, ActionResult]] = []
        errors: list[tuple[str, ActionResult]] = []
        evicted: list[str] = []
        for pod in pods:
            ns, name = pod.metadata.namespace, pod.metadata.name
            body = k8s.V1Eviction(
                api_version="policy/v1",
                kind="Eviction",
                metadata=k8s.V1ObjectMeta(name=name, namespace=ns),
                delete_options=k8s.V1DeleteOptions(grace_period_seconds=self.grace_period_s)
                if self.grace_period_s is not None
                else None,
            )
            try:
                await self._call(self.api.create_namespaced_pod_eviction, name, ns, body)
                evicted.append(f"{ns}/{name}")
            except ApiException as exc:
                code = _status_code(exc)
                if code == 404:
                    continue  # already gone: the goal is met
                (blocked if code == 429 else errors).append((f"{ns}/{name}", _api_result(exc, "evict")))
        log.info("k8s_evicted", evicted=evicted, blocked=[b for b, _ in blocked], errors=[e for e, _ in errors])
        if errors:
            permanent = all(r.permanent for _, r in errors)
            return ActionResult(False, "; ".join(f"{p}: {r.detail}" for p, r in errors), permanent)
        if blocked:
            names = ", ".join(p for p, _ in blocked)
            return ActionResult.temporary(f"evicted {len(evicted)}; blocked by PodDisruptionBudget: {names}")
        return ActionResult.success(f"evicted {len(evicted)} pod(s)")

    # -- Scheduler -----------------------------------------------------------------
    async def cordon(self, node: str, reason: str) -> ActionResult:
        return await self._mark(node, reason, ["NoSchedule"])

    async def drain(self, node: str, reason: str) -> ActionResult:
        effects = ["NoSchedule", "NoExecute"] if self.noexecute_on_drain else ["NoSchedule"]
        res = await self._mark(node, reason, effects)
        if not res.ok:
            return res
        try:
            pods = [p for p in await self._pods_on(node) if self._evictable(p)]
        except ApiException as exc:
            return _api_result(exc, f"list pods on {node}")
        ev = await self._evict(pods)
        return ActionResult(ev.ok, f"{res.detail}; {ev.detail}", ev.permanent)

    async def resume(self, node: str, reason: str) -> ActionResult:
        try:
            validate_node_id(node)
            obj = await self._get_node(node)
        except InvalidName as exc:
            return ActionResult.failure(str(exc))
        except ApiException as exc:
            return _api_result(exc, f"read node {node}")
        ours = self._ours(obj)
        if not obj.spec.unschedulable and not self._our_taints(obj) and not ours:
            return ActionResult.success(f"{node} already in service")
        if not ours:
            return ActionResult.failure(f"{node} cordoned by someone else")
        taints = [
            {k: v for k, v in t.to_dict().items() if v is not None}
            for t in (obj.spec.taints or [])
            if t.key != TAINT_KEY
        ]
        body = {
            "metadata": {
                "annotations": {CORDONED_BY: None, REASON_ANNOTATION: None},
                "resourceVersion": obj.metadata.resource_version,
            },
            "spec": {"unschedulable": False, "taints": taints},
        }
        try:
            await self._call(self.api.patch_node, node, body)
        except ApiException as exc:
            return _api_result(exc, f"uncordon {node}")
        log.info("k8s_uncordoned", node=node, why=sanitize_reason(reason))
        return ActionResult.success(f"uncordoned {node}")

    def _node_status(self, obj: Any, pods: list[Any]) -> NodeStatus:
        conditions = {c.type: c.status for c in (obj.status.conditions or [])} if obj.status else {}
        work = [f"{p.metadata.namespace}/{p.metadata.name}" for p in pods if self._evictable(p)]
        annotations = obj.metadata.annotations or {}
        ours = self._ours(obj)
        if conditions.get("Ready") not in (None, "True"):
            state = DOWN
        elif obj.spec.unschedulable:
            state = DRAINING if work else CORDONED
        else:
            state = ALLOCATED if work else IDLE
        taken_out = bool(obj.spec.unschedulable)
        return NodeStatus(
            state=state,
            reason=annotations.get(REASON_ANNOTATION, "") if ours else "",
            drained_by_us=ours if taken_out else None,
            jobs=work,
            node=obj.metadata.name,
        )

    async def node_status(self, node: str) -> NodeStatus:
        validate_node_id(node)
        try:
            obj = await self._get_node(node)
            pods = await self._pods_on(node)
        except ApiException as exc:
            raise SchedulerError(f"node {node}: HTTP {exc.status} {exc.reason}", _status_code(exc) == 404) from exc
        return self._node_status(obj, pods)

    async def list_nodes(self) -> list[NodeStatus]:
        try:
            nodes = (await self._call(self.api.list_node)).items or []
            out = []
            for obj in nodes:
                out.append(self._node_status(obj, await self._pods_on(obj.metadata.name)))
            return out
        except ApiException as exc:
            raise SchedulerError(f"list nodes: HTTP {exc.status} {exc.reason}") from exc

    @staticmethod
    def _split_job(job: str) -> tuple[str, str]:
        """Jobs are `namespace/name` of a batch Job (pods labelled job-name=<name>)."""
        validate_job_id(job)
        ns, sep, name = job.partition("/")
        return (ns, name) if sep else ("default", ns)

    async def _job_pods(self, job: str) -> list[Any]:
        ns, name = self._split_job(job)
        pods = await self._call(self.api.list_namespaced_pod, ns, label_selector=f"job-name={name}")
        return list(pods.items or [])

    async def job_nodes(self, job: str) -> list[str]:
        try:
            pods = await self._job_pods(job)
        except ApiException as exc:
            raise SchedulerError(f"job {job}: HTTP {exc.status} {exc.reason}") from exc
        return sorted({p.spec.node_name for p in pods if p.spec and p.spec.node_name})

    async def requeue(self, job: str, exclude: list[str], prefer: list[str]) -> ActionResult:
        """Evict the job's pods on `exclude`; its controller recreates them elsewhere."""
        try:
            exclude = [validate_node_id(n) for n in exclude]
            prefer = [validate_node_id(n) for n in prefer]
            pods = await self._job_pods(job)
        except InvalidName as exc:
            return ActionResult.failure(str(exc))
        except ApiException as exc:
            return _api_result(exc, f"list pods of {job}")
        bad = [p for p in pods if p.spec and p.spec.node_name in exclude and self._evictable(p)]
        if not bad:
            return ActionResult.success(f"job {job} has no pods on {','.join(exclude)}")
        log.info("k8s_requeue", job=job, exclude=exclude, prefer_advisory=prefer, pods=len(bad))
        return await self._evict(bad)

    async def signal_job(self, job: str, signal: str) -> ActionResult:
        return ActionResult.failure("signals are not possible through the Kubernetes API; use an exec hook")
