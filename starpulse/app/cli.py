"""The `starpulse` command: services (controller, agent, relay), one-shot checks, queries, the demo."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from starpulse import __version__

DEFAULT_CONTROLLER = "127.0.0.1:50051"


def _install_stop(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(sig, stop.set)


# -- services: one way from flags, environment and file to their config ----------------------
_CONFIG_HELP = (
    "settings file (YAML or TOML; see deploy/). Precedence: the file, then STARPULSE_<SECTION>__<KEY> "
    "environment overrides, then flags given on this command line"
)


def _given(args: argparse.Namespace) -> dict[str, Any]:
    """The flags given on the command line (dest -> value), not those left at their defaults."""
    parser = build_parser(args.command)
    sub = _subparsers(parser).choices[args.command]
    argv = getattr(args, "argv", None)
    if argv is None:  # called without main(): a flag that differs from its default was given
        dests = {a.dest for a in sub._actions if getattr(args, a.dest, a.default) != a.default}
    else:
        for action in sub._actions:
            action.default = argparse.SUPPRESS
        dests = set(vars(parser.parse_args(argv)))
    return {d: getattr(args, d) for d in dests - {"command", "func", "help", "config"} if hasattr(args, d)}


def overrides(args: argparse.Namespace, errors: list[str] | None = None) -> dict[str, Any]:
    """The settings a service command's given flags set, as (flag, value); a bad one: ConfigError, or into errors."""
    from starpulse.app.config import service
    from starpulse.core.schema import flag_overrides

    mod = service(args.command)
    return flag_overrides(mod.SCHEMA, mod.FLAGS, _given(args), errors)


def _settings(args: argparse.Namespace) -> Any:
    """The service's settings: --config FILE < environment < flags; None after printing every problem."""
    from starpulse.app.config import ConfigError, service
    from starpulse.core.logs import configure_logging

    mod = service(args.command)
    errors: list[str] = []
    try:
        built = mod.load(args.config, overrides=overrides(args, errors), flags={f.key: f.name for f in mod.FLAGS})
    except ConfigError as exc:
        errors.extend(exc.errors)
    for line in errors:
        print(f"starpulse {args.command}: {line}", file=sys.stderr)
    if errors:
        return None
    log = built[1].log if isinstance(built, tuple) else built.log
    configure_logging(log.level, fmt=log.format)
    return built


def cmd_controller(args: argparse.Namespace) -> int:
    """Run one controller (or one HA replica): exit 2 on bad settings, 3 when a replica lost its leadership."""
    settings = _settings(args)
    if settings is None:
        return 2
    return _serve_controller(settings.controller)


def _serve_controller(config: Any) -> int:
    """Run one controller, or one HA replica when config.ha is set; exit 3 when a replica lost its leadership."""
    from controller.service import Controller

    async def main() -> None:
        stop = asyncio.Event()
        _install_stop(stop)
        if config.ha is not None:
            from controller.replica import Replica

            await Replica(config).serve_forever(stop)
        else:
            await Controller(config).serve_forever(stop)

    try:
        asyncio.run(main())
    except Exception as exc:
        from controller.detect.shards import ShardLost
        from controller.ha.etcd import EtcdUnavailable
        from controller.replica import LeadershipLost

        if isinstance(exc, LeadershipLost | EtcdUnavailable):
            print(f"starpulse controller: {exc}", file=sys.stderr)
            return 3
        if isinstance(exc, ShardLost):
            print(f"starpulse controller: {exc}", file=sys.stderr)
            return 4
        raise
    return 0


def cmd_agent(args: argparse.Namespace) -> int:
    """Run the node agent on its backend (or on a SONiC switch with --role switch)."""
    from agent.factory import BackendUnavailable, build_agent, build_switch_agent
    from starpulse.core.tls import load_material

    settings = _settings(args)
    if settings is None:
        return 2
    config, opt = settings
    if config.tls is not None:
        load_material(config.tls)  # a bad file is one line now, not a traceback in the link
    if opt.role == "switch":
        asyncio.run(_run_agent(build_switch_agent(config, _redis_factory(opt.redis) if opt.redis else None)))
        return 0
    sim = _sim_node(
        config.node_id, opt.state_dir, opt.backend, opt.seed, opt.sim_gpus, opt.sim_nics, opt.sim_real_netdevs
    )
    try:
        agent = build_agent(
            config,
            opt.backend,
            sysfs_root=opt.sysfs_root,
            kmsg_path=opt.kmsg,
            sim=sim,
            mounts=opt.mounts,
            ethtool=opt.ethtool,
            lldpcli_socket=opt.lldpcli_socket,
            lldp_interval_s=opt.lldp_interval_s,
        )
    except BackendUnavailable as exc:
        print(f"starpulse agent: backend nvml unavailable: {exc}", file=sys.stderr)
        return 2
    asyncio.run(_run_agent(agent))
    return 0


def _sim_node(node_id: str, state_dir: Path, backend: str, seed: int, gpus: int, nics: int, real_netdevs: bool) -> Any:
    """The SimNode for `--backend sim` (None otherwise); with real_netdevs its ports follow this host's links."""
    if backend != "sim":
        return None
    from agent.sim.node import SimNode

    sim = SimNode(node_id, state_dir / "sim", gpus=gpus, nics=nics, seed=seed)
    if real_netdevs:
        sim.follow_real_netdevs()
    return sim


def _redis_factory(address: str) -> Any:
    """Clients for a SONiC switch's Redis at HOST:PORT (the settings checked the form)."""
    import redis

    host, _, port = address.rpartition(":")
    return lambda db: redis.Redis(host=host, port=int(port), db=db, decode_responses=True, socket_timeout=5.0)


async def _run_agent(agent: Any) -> None:
    """Run until SIGINT/SIGTERM; the agent flushes what it can and keeps the rest on disk."""
    stop = asyncio.Event()
    _install_stop(stop)
    await agent.run(stop)


def cmd_relay(args: argparse.Namespace) -> int:
    """Terminate agents' streams here and carry them to the controller in batches (relay/)."""
    from relay.service import Relay
    from starpulse.core.tls import load_material

    settings = _settings(args)
    if settings is None:
        return 2
    try:
        if settings.relay.tls is not None:
            load_material(settings.relay.tls)
        relay = Relay(settings.relay)
    except (OSError, ValueError) as exc:
        print(f"starpulse relay: {exc}", file=sys.stderr)
        return 2

    async def main() -> None:
        stop = asyncio.Event()
        _install_stop(stop)
        await relay.serve_forever(stop)

    asyncio.run(main())
    return 0


# -- scan ---------------------------------------------------------------------------------
def cmd_scan(args: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict

    from agent.collectors.kmsg import scan_file
    from agent.factory import BackendUnavailable, build_collectors
    from agent.runtime import CollectorSet
    from agent.sim.node import SimNode
    from starpulse.core.logs import configure_logging

    configure_logging("warning", fmt="console", stream=sys.stderr)
    findings: list[Any] = []
    sim = None
    if args.backend == "sim":
        import tempfile

        sim = SimNode("scan", Path(tempfile.mkdtemp(prefix="starpulse-scan-")), seed=args.seed)
    try:
        plan = build_collectors(
            args.backend, findings.append, sysfs_root=args.sysfs_root, kmsg_path=None, sim=sim, lldp=True
        )
    except BackendUnavailable as exc:
        print(f"starpulse scan: backend nvml unavailable: {exc}", file=sys.stderr)
        return 2
    collectors = CollectorSet(plan.collectors)
    collectors.probe()
    inventory = collectors.describe()
    for hook in plan.inventory_hooks:
        hook(inventory)
    if plan.before_collect is not None:
        plan.before_collect(1.0)
    result = collectors.collect(seq=1)
    findings.extend(result.findings)
    kmsg = args.kmsg or (None if sim is None else sim.kmsg_path)
    if kmsg:
        findings.extend(collectors.localise(f) for f in scan_file(kmsg))
    collectors.close()
    out = {
        "inventory": MessageToDict(inventory, preserving_proto_field_name=True),
        "sample": MessageToDict(result.report, preserving_proto_field_name=True),
        "findings": [f.to_dict() for f in findings],
    }
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        _print_scan(out)
    return 1 if any(f.severity in ("critical", "fatal") for f in findings) else 0


def _print_scan(out: dict[str, Any]) -> None:
    inv = out["inventory"]
    host = inv.get("host", {})
    print(
        f"host {host.get('hostname', '?')}  kernel {host.get('kernel', '?')}  driver {host.get('driver_version', '-')}"
    )
    print(f"GPUs: {len(inv.get('gpus', []))}   NIC ports: {len(inv.get('nics', []))}")
    for c in out["sample"].get("collectors", []):
        state = "ok" if c.get("ok") else ("unsupported" if not c.get("supported") else "FAILED")
        print(f"  collector {c['name']:<8} {state}  {c.get('error', '')}")
    if not out["findings"]:
        print("no findings: healthy")
    for f in out["findings"]:
        xid = f" xid={f['xid']}" if "xid" in f else ""
        print(f"  [{f['severity']:>8}] {f['component']:<14} {f['kind']}{xid} -> {f['action']}: {f['message']}")


# -- TLS and credentials -------------------------------------------------------------------
ADMIN_TOKEN_ENV = "STARPULSE_ADMIN_TOKEN"


def _add_tls_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tls-ca", default=None, metavar="PEM", help="CA certificate (mutual TLS; with the two below)")
    parser.add_argument("--tls-cert", default=None, metavar="PEM", help="this side's certificate")
    parser.add_argument("--tls-key", default=None, metavar="PEM", help="this side's private key")


def _add_client_auth_flags(parser: argparse.ArgumentParser) -> None:
    _add_tls_flags(parser)
    parser.add_argument(
        "--admin-token-file",
        default=None,
        metavar="PATH",
        help=f"file whose first line is the admin token to send (default: ${ADMIN_TOKEN_ENV})",
    )


def _tls_settings(args: argparse.Namespace) -> Any:
    """TLSSettings from --tls-ca/--tls-cert/--tls-key (all three or none); ValueError otherwise."""
    given = [args.tls_ca, args.tls_cert, args.tls_key]
    if not any(given):
        return None
    if not all(given):
        raise ValueError("--tls-ca, --tls-cert and --tls-key go together")
    from starpulse.core.tls import TLSSettings

    return TLSSettings(ca_file=Path(args.tls_ca), cert_file=Path(args.tls_cert), key_file=Path(args.tls_key))


def _client_token(args: argparse.Namespace) -> str | None:
    """The admin token to send: --admin-token-file (first token in it), else $STARPULSE_ADMIN_TOKEN."""
    import os

    if getattr(args, "admin_token_file", None):
        from starpulse.core.auth import load_tokens

        return load_tokens(args.admin_token_file)[0]
    return os.environ.get(ADMIN_TOKEN_ENV, "").strip() or None


def _client_channel(args: argparse.Namespace) -> Any:
    """A channel to args.controller: mutual TLS when --tls-* are given, the admin token on every call."""
    import grpc

    tls = _tls_settings(args)
    if tls is not None:
        from starpulse.core.tls import load_channel_credentials

        channel = grpc.secure_channel(args.controller, load_channel_credentials(tls))
    else:
        channel = grpc.insecure_channel(args.controller)
    token = _client_token(args)
    if token is None:
        return channel
    from starpulse.core.auth import bearer_metadata

    extra = list(bearer_metadata(token))

    class CallDetails(grpc.ClientCallDetails):
        def __init__(self, details: Any, metadata: list[tuple[str, str]]) -> None:
            self.method = details.method
            self.timeout = details.timeout
            self.metadata = metadata
            self.credentials = details.credentials
            self.wait_for_ready = getattr(details, "wait_for_ready", None)
            self.compression = getattr(details, "compression", None)

    class TokenInterceptor(grpc.UnaryUnaryClientInterceptor):
        """Adds ``authorization: Bearer <token>`` to every unary call."""

        def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
            metadata = [*(client_call_details.metadata or ()), *extra]
            return continuation(CallDetails(client_call_details, metadata), request)

    return grpc.intercept_channel(channel, TokenInterceptor())


def cmd_tls_make_test_ca(args: argparse.Namespace) -> int:
    from starpulse.core.names import InvalidName
    from starpulse.core.tls import make_test_ca

    nodes = [n.strip() for part in args.nodes for n in part.split(",") if n.strip()]
    hosts = [
        h.strip() for part in (args.controller_host or ["localhost,127.0.0.1"]) for h in part.split(",") if h.strip()
    ]
    try:
        ca = make_test_ca(Path(args.out), nodes, controller_hosts=hosts)
    except (InvalidName, ValueError, OSError) as exc:
        print(f"starpulse tls make-test-ca: {exc}", file=sys.stderr)
        return 2
    print(
        f"wrote a test CA to {args.out}: ca.pem, controller.pem (hosts {', '.join(hosts)}), "
        f"admin.pem and {len(ca.nodes)} node certificates (keys are mode 0600)"
    )
    print("not for production: the CA key (ca.key) sits next to the certificates")
    return 0


# -- queries ------------------------------------------------------------------------------
def _query_stub(args: argparse.Namespace) -> Any:
    from starpulse.v1 import service_pb2_grpc as sgrpc

    return sgrpc.QueryStub(_client_channel(args))


def _age(ms: int) -> str:
    if not ms:
        return "never"
    s = max(0.0, time.time() - ms / 1000)
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago"


def cmd_nodes(args: argparse.Namespace) -> int:
    from google.protobuf.json_format import MessageToDict

    from starpulse.v1 import service_pb2 as spb

    resp = _rpc("nodes", args, _query_stub(args), "ListNodes", spb.ListNodesRequest(), 10)
    if resp is None:
        return 2
    if args.json:
        rows = [
            MessageToDict(n, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
            for n in resp.nodes
        ]
        print(json.dumps({"nodes": rows}, indent=2))
        return 0
    print(f"{'NODE':<16} {'STATE':<12} {'LAST SEEN':<10} {'GPUS':>4} {'NICS':>4} {'EVENTS':>6}")
    for n in resp.nodes:
        print(
            f"{n.node_id:<16} {n.state:<12} {_age(n.last_seen_ms):<10} "
            f"{n.gpu_count:>4} {n.nic_count:>4} {n.open_events:>6}"
        )
    return 0


def cmd_events(args: argparse.Namespace) -> int:

    from starpulse.core.findings import event_kind_name, severity_name
    from starpulse.v1 import service_pb2 as spb

    request = spb.ListEventsRequest(node_id=args.node or "", limit=args.limit)
    resp = _rpc("events", args, _query_stub(args), "ListEvents", request, 10)
    if resp is None:
        return 2
    rows = [
        {
            "node": e.node_id,
            "seq": e.event.seq,
            "timestamp_ms": e.event.timestamp_ms,
            "kind": event_kind_name(e.event.kind),
            "severity": severity_name(e.event.severity),
            "component": e.event.component,
            "action": e.event.action,
            "xid": e.event.xid or None,
            "message": e.event.message,
        }
        for e in resp.events
    ]
    if args.json:
        print(json.dumps({"events": rows}, indent=2))
        return 0
    for r in rows:
        when = time.strftime("%H:%M:%S", time.localtime(r["timestamp_ms"] / 1000))
        print(
            f"{when} {r['node']:<14} {r['severity']:>8} {r['kind']:<18} {r['component']:<12} "
            f"{r['action']:<14} {r['message']}"
        )
    return 0


def cmd_incidents(args: argparse.Namespace) -> int:

    from starpulse.v1 import service_pb2 as spb

    request = spb.ListIncidentsRequest(include_resolved=args.all, limit=args.limit)
    resp = _rpc("incidents", args, _query_stub(args), "ListIncidents", request, 10)
    if resp is None:
        return 2
    rows = [
        {
            "id": i.id,
            "kind": i.kind,
            "root_cause": i.root_cause,
            "component_type": i.component_type,
            "affected_nodes": list(i.affected_nodes),
            "affected_jobs": list(i.affected_jobs),
            "severity": i.severity,
            "action": i.action,
            "evidence": json.loads(i.evidence_json or "[]"),
            "opened_ms": i.opened_ms,
            "resolved_ms": i.resolved_ms or None,
        }
        for i in resp.incidents
    ]
    if args.json:
        print(json.dumps({"incidents": rows}, indent=2))
        return 0
    if not rows:
        print("no open incidents" if not args.all else "no incidents")
    for r in rows:
        state = "open" if r["resolved_ms"] is None else "resolved"
        nodes = r["affected_nodes"]
        shown = ", ".join(nodes[:4]) + (f" (+{len(nodes) - 4})" if len(nodes) > 4 else "")
        print(
            f"{r['id']:<11} {state:<8} {r['severity']:>8} {r['kind']:<13} {r['root_cause'] or '(network)':<30} "
            f"{r['action']:<20} {_age(r['opened_ms']):<9} {shown}"
        )
    return 0


# -- admin: what a person does to the fleet -------------------------------------------------
def _admin_stub(args: argparse.Namespace) -> Any:
    from starpulse.v1 import service_pb2_grpc as sgrpc

    return sgrpc.AdminStub(_client_channel(args))


def default_actor() -> str | None:
    """The person running the command: $USER, else the OS login name; never the controller's own name."""
    import getpass
    import os

    name = os.environ.get("USER", "").strip()
    if not name:
        with contextlib.suppress(Exception):
            name = getpass.getuser().strip()
    return name if name and name not in ("starpulse", "external") else None


def _actor(args: argparse.Namespace, command: str) -> str | None:
    actor = (args.actor or default_actor() or "").strip()
    if not actor:
        print(f"starpulse {command}: who is acting? pass --actor NAME (a person, not 'starpulse')", file=sys.stderr)
        return None
    return actor


def _rpc(command: str, args: argparse.Namespace, stub: Any, method: str, request: Any, timeout_s: float) -> Any:
    """One RPC; None (after one line on stderr naming the controller and the status) when it fails."""
    import grpc

    try:
        return getattr(stub, method)(request, timeout=timeout_s)
    except grpc.RpcError as exc:
        print(f"starpulse {command}: controller {args.controller}: {exc.code().name} {exc.details()}", file=sys.stderr)
        return None


def _admin_call(command: str, args: argparse.Namespace, method: str, request: Any) -> Any:
    """One Admin RPC; None (after one line on stderr) when it fails."""
    return _rpc(command, args, _admin_stub(args), method, request, 30)


def _dict(message: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def cmd_node_action(args: argparse.Namespace) -> int:
    """cordon | uncordon | drain NODE --reason TEXT."""
    from starpulse.v1 import service_pb2 as spb

    actor = _actor(args, args.command)
    if actor is None:
        return 2
    request = spb.NodeActionRequest(
        node=args.node, reason=args.reason, actor=actor, force=bool(getattr(args, "force", False))
    )
    resp = _admin_call(args.command, args, args.command.capitalize(), request)
    if resp is None:
        return 2
    if args.json:
        print(json.dumps(_dict(resp), indent=2))
    else:
        held = f" (held by {resp.drained_by})" if resp.drained_by else ""
        print(f"{resp.message}\n{resp.node}: {resp.state}{held}")
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    from starpulse.v1 import service_pb2 as spb

    actor = _actor(args, "approve")
    if actor is None:
        return 2
    request = spb.ApproveRequest(incident_id=args.incident, actor=actor, node=args.node or "")
    resp = _admin_call("approve", args, "Approve", request)
    if resp is None:
        return 2
    if args.json:
        print(json.dumps(_dict(resp), indent=2))
    else:
        print(f"{resp.message}" + (f"\nnodes: {', '.join(resp.nodes)}" if resp.nodes else ""))
    return 0 if resp.ok else 1


def _print_breaker(resp: Any) -> None:
    if resp.open:
        print(f"breaker OPEN since {_age(resp.opened_ms)}: {resp.reason}")
        print("automatic remediation is stopped until a person resets it: starpulse breaker reset --reason TEXT")
    else:
        closed = f" (closed by {resp.closed_by} {_age(resp.closed_ms)})" if resp.closed_by else ""
        print(f"breaker closed{closed}")
    print(f"mode {resp.mode}; {resp.pending_approvals} approval(s) pending")


def cmd_breaker_status(args: argparse.Namespace) -> int:
    from starpulse.v1 import service_pb2 as spb

    resp = _admin_call("breaker status", args, "GetBreaker", spb.BreakerRequest())
    if resp is None:
        return 2
    if args.json:
        print(json.dumps(_dict(resp), indent=2))
    else:
        _print_breaker(resp)
    return 0


def cmd_breaker_reset(args: argparse.Namespace) -> int:
    from starpulse.v1 import service_pb2 as spb

    actor = _actor(args, "breaker reset")
    if actor is None:
        return 2
    request = spb.BreakerResetRequest(actor=actor, reason=args.reason or "")
    resp = _admin_call("breaker reset", args, "ResetBreaker", request)
    if resp is None:
        return 2
    if args.json:
        print(json.dumps(_dict(resp), indent=2))
    else:
        print(f"breaker closed by {actor}" if resp.changed else "breaker was not open: nothing to reset")
        _print_breaker(resp)
    return 0


def cmd_spares(args: argparse.Namespace) -> int:
    from starpulse.v1 import service_pb2 as spb

    resp = _admin_call("spares", args, "ListSpares", spb.SparesRequest())
    if resp is None:
        return 2
    rows = [
        {
            "spare": s.spare,
            "healthy": s.healthy,
            "allocated_to": s.allocated_to or None,
            "job": s.job or None,
            "block": s.block if s.HasField("block") else None,
            "source": s.source,
        }
        for s in resp.spares
    ]
    if args.json:
        print(json.dumps({"spares": rows}, indent=2))
        return 0
    if not rows:
        print("no spares")
        return 0
    print(f"{'SPARE':<16} {'HEALTHY':<8} {'BLOCK':>5} {'ALLOCATED TO':<16} {'JOB':<20} SOURCE")
    for r in rows:
        block = "-" if r["block"] is None else str(r["block"])
        print(
            f"{r['spare']:<16} {'yes' if r['healthy'] else 'no':<8} {block:>5} "
            f"{r['allocated_to'] or '-':<16} {r['job'] or '-':<20} {r['source']}"
        )
    return 0


def cmd_jobs(args: argparse.Namespace) -> int:
    from starpulse.v1 import service_pb2 as spb

    resp = _admin_call("jobs", args, "ListJobs", spb.JobsRequest())
    if resp is None:
        return 2
    rows = [
        {
            "job": j.job,
            "state": j.state,
            "nodes": list(j.nodes),
            "world_size": j.world_size,
            "step": j.step,
            "checkpoint_dir": j.checkpoint_dir,
            "last_complete_step": j.last_complete_step,
            "last_complete_path": j.last_complete_path,
            "last_complete_ms": j.last_complete_ms or None,
            "restarts": j.restarts,
            "steps_lost": j.steps_lost,
            "downtime_s": j.downtime_s,
            "resumed_from_step": j.resumed_from_step if j.HasField("resumed_from_step") else None,
            "resumed_from_checkpoint": (j.resumed_from_checkpoint if j.HasField("resumed_from_checkpoint") else None),
        }
        for j in resp.jobs
    ]
    if args.json:
        print(json.dumps({"jobs": rows}, indent=2))
        return 0
    if not rows:
        print("no jobs")
        return 0
    print(
        f"{'JOB':<20} {'STATE':<12} {'STEP':>8} {'CHECKPOINT':>10} {'RESTARTS':>8} {'LOST':>6} "
        f"{'DOWN S':>8} {'RESUMED':>8}  NODES"
    )
    for r in rows:
        nodes = r["nodes"]
        shown = ", ".join(nodes[:4]) + (f" (+{len(nodes) - 4})" if len(nodes) > 4 else "")
        resumed = "-" if r["resumed_from_step"] is None else str(r["resumed_from_step"])
        print(
            f"{r['job']:<20} {r['state']:<12} {r['step']:>8} {r['last_complete_step']:>10} {r['restarts']:>8} "
            f"{r['steps_lost']:>6} {r['downtime_s']:>8.1f} {resumed:>8}  {shown}"
        )
    return 0


def cmd_topology_generate(args: argparse.Namespace) -> int:
    from controller.fabric import generate_fabric, save_fabric

    try:
        fabric = generate_fabric(
            args.nodes, args.gpus_per_node, args.rails, args.nodes_per_block, args.spines, spares=args.spares
        )
    except ValueError as exc:
        print(f"starpulse topology generate: {exc}", file=sys.stderr)
        return 2
    if args.out:
        save_fabric(fabric, args.out)
        print(f"wrote {args.out}: {json.dumps(fabric.summary(), sort_keys=True)}")
    else:
        from controller.fabric import fabric_to_dict

        print(json.dumps(fabric_to_dict(fabric), indent=1))
    return 0


def cmd_topology_show(args: argparse.Namespace) -> int:
    if args.file:
        from controller.fabric import FabricFileError, load_fabric

        try:
            summary = load_fabric(args.file).summary()
        except (FabricFileError, OSError) as exc:
            print(f"starpulse topology show: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(summary, indent=2, sort_keys=True))
        return 0

    from starpulse.v1 import service_pb2 as spb

    resp = _rpc("topology show", args, _query_stub(args), "GetTopology", spb.TopologyRequest(), 10)
    if resp is None:
        return 2
    out = {
        "summary": json.loads(resp.summary_json or "{}"),
        "nodes_reporting_lldp": resp.nodes_reporting_lldp,
        "miswired": list(resp.miswired),
        "unknown_devices": list(resp.unknown_devices),
        "missing_links": list(resp.missing_links),
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(json.dumps(out["summary"], sort_keys=True))
    print(f"LLDP reported by {resp.nodes_reporting_lldp} nodes/switches")
    for line in out["miswired"] + out["unknown_devices"] + out["missing_links"]:
        print(f"  {line}")
    if not (out["miswired"] or out["unknown_devices"] or out["missing_links"]):
        print("  wiring matches the declared fabric")
    return 0


def cmd_scenario_run(args: argparse.Namespace) -> int:
    from starpulse.app.scenario.runner import run_scenario
    from starpulse.app.scenario.spec import ScenarioError, load_scenario

    try:
        scenario = load_scenario(args.file)
    except (ScenarioError, OSError) as exc:
        print(f"starpulse scenario run: {exc}", file=sys.stderr)
        return 2
    verdict = asyncio.run(run_scenario(scenario))
    if args.json:
        print(json.dumps(verdict, indent=2))
    else:
        _print_verdict(verdict)
    return 0 if verdict["expectations"]["passed"] else 1


def _print_verdict(verdict: dict[str, Any]) -> None:
    print(f"scenario {verdict['scenario']} ({verdict['duration_s']:g} s)")
    for f in verdict["faults"]:
        found = f"-> {f['incident']} after {f['detection_latency_s']:.1f} s" if f["incident"] else "-> NOT DETECTED"
        print(f"  fault {f['kind']:<22} {f['target']:<28} at {f['at_s']:>5.1f} s {found}")
    for i in verdict["incidents"]:
        resolved = "open" if i["resolved_at_s"] is None else f"resolved {i['resolved_at_s']:.1f} s"
        print(
            f"  {i['id']} {i['kind']:<13} {i['root_cause'] or '(network)':<30} {i['severity']:>8} "
            f"{len(i['affected_nodes']):>3} nodes  opened {i['opened_at_s']:.1f} s, {resolved}"
        )
    exp = verdict["expectations"]
    if exp["checked"]:
        print("expectations: " + ("passed" if exp["passed"] else "FAILED: " + "; ".join(exp["failures"])))


def cmd_demo(args: argparse.Namespace) -> int:
    from starpulse.app.demo import run_demo

    return run_demo(nodes=args.nodes, duration_s=args.duration, http=args.http, listen=args.listen)


def cmd_version(args: argparse.Namespace) -> int:
    print(f"starpulse {__version__}")
    return 0


# -- settings files -------------------------------------------------------------------------
def cmd_config_check(args: argparse.Namespace) -> int:
    """Print 'ok: <summary>' (exit 0), or every error one a line (exit 2)."""
    from starpulse.app.config import ConfigError, check_file

    try:
        summary = check_file(args.file, args.kind)
    except ConfigError as exc:
        for line in exc.errors:
            print(line)
        return 2
    print(f"ok: {summary}")
    return 0


def cmd_config_example(args: argparse.Namespace) -> int:
    """Print a service's reference settings file (deploy/KIND.yaml): every setting at its default, documented."""
    from starpulse.app.config import example

    print(example(args.kind), end="")
    return 0


_SERVICES = (
    ("controller", "run the controller service", cmd_controller),
    ("agent", "run the node agent", cmd_agent),
    ("relay", "carry many agents' streams to the controller, batched (large fleets)", cmd_relay),
)


def _subparsers(parser: argparse.ArgumentParser) -> Any:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def _add_service(sub: Any, name: str, help: str, func: Any, with_flags: bool) -> None:
    """A service command; its flags come from the service's settings (help, default, the setting they set)."""
    parser = sub.add_parser(name, help=help)
    parser.set_defaults(func=func)
    if not with_flags:  # another command runs: its settings' modules stay unimported
        return
    from starpulse.app.config import service

    mod = service(name)
    parser.add_argument("--config", default=None, metavar="FILE", help=_CONFIG_HELP)
    for flag in mod.FLAGS:
        parser.add_argument(flag.name, **flag.argparse_kwargs(mod.SCHEMA))


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``only``, the service commands other than that one get no flags."""
    p = argparse.ArgumentParser(prog="starpulse", description=__doc__)
    p.add_argument("--version", action="version", version=f"starpulse {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for name, help, func in _SERVICES:
        _add_service(sub, name, help, func, only in (None, name))

    s = sub.add_parser("scan", help="one-shot health check of this node")
    s.add_argument("--backend", choices=("nvml", "sim"), default="nvml")
    s.add_argument("--sysfs-root", default="/sys")
    s.add_argument("--kmsg", default=None, help="kernel log file to scan (dmesg, journalctl -k or /dev/kmsg text)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_scan)

    n = sub.add_parser("nodes", help="list nodes the controller knows")
    n.add_argument("--controller", default=DEFAULT_CONTROLLER)
    _add_client_auth_flags(n)
    n.add_argument("--json", action="store_true")
    n.set_defaults(func=cmd_nodes)

    e = sub.add_parser("events", help="list recent events")
    e.add_argument("--controller", default=DEFAULT_CONTROLLER)
    _add_client_auth_flags(e)
    e.add_argument("--node", default=None)
    e.add_argument("--limit", type=int, default=50)
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=cmd_events)

    i = sub.add_parser("incidents", help="list incidents (root causes on the fabric)")
    i.add_argument("--controller", default=DEFAULT_CONTROLLER)
    _add_client_auth_flags(i)
    i.add_argument("--all", action="store_true", help="include resolved incidents")
    i.add_argument("--limit", type=int, default=100)
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=cmd_incidents)

    for verb, what in (
        ("cordon", "stop new work landing on a node"),
        ("uncordon", "return a node to service (not one someone else drained, unless --force)"),
        ("drain", "cordon a node and move its work off"),
    ):
        na = sub.add_parser(verb, help=what)
        na.add_argument("node")
        na.add_argument("--reason", required=True, help="why (recorded with your name)")
        na.add_argument("--actor", default=None, help="who is acting (default: $USER)")
        if verb == "uncordon":
            na.add_argument("--force", action="store_true", help="return a node someone else drained")
        na.add_argument("--controller", default=DEFAULT_CONTROLLER)
        _add_client_auth_flags(na)
        na.add_argument("--json", action="store_true")
        na.set_defaults(func=cmd_node_action)

    ap = sub.add_parser("approve", help="approve a remediation waiting for a person (manual mode), and run it")
    ap.add_argument("incident")
    ap.add_argument("--node", default=None, help="approve only this node's request (default: all of the incident)")
    ap.add_argument("--actor", default=None, help="who approves (default: $USER)")
    ap.add_argument("--controller", default=DEFAULT_CONTROLLER)
    _add_client_auth_flags(ap)
    ap.add_argument("--json", action="store_true")
    ap.set_defaults(func=cmd_approve)

    br = sub.add_parser("breaker", help="the self-healing circuit breaker: status, or reset by a person")
    brsub = br.add_subparsers(dest="breaker_command", required=True)
    brs = brsub.add_parser("status", help="is automatic remediation stopped, and why")
    brs.add_argument("--controller", default=DEFAULT_CONTROLLER)
    _add_client_auth_flags(brs)
    brs.add_argument("--json", action="store_true")
    brs.set_defaults(func=cmd_breaker_status)
    brr = brsub.add_parser("reset", help="close the breaker (only a named person may)")
    brr.add_argument("--actor", default=None, help="who closes it (default: $USER)")
    brr.add_argument("--reason", default="", help="why it is safe to act again")
    brr.add_argument("--controller", default=DEFAULT_CONTROLLER)
    _add_client_auth_flags(brr)
    brr.add_argument("--json", action="store_true")
    brr.set_defaults(func=cmd_breaker_reset)

    sp = sub.add_parser("spares", help="hot spares: health, block, allocation")
    sp.add_argument("--controller", default=DEFAULT_CONTROLLER)
    _add_client_auth_flags(sp)
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_spares)

    jb = sub.add_parser("jobs", help="training jobs: restarts, steps lost, downtime, last complete checkpoint")
    jb.add_argument("--controller", default=DEFAULT_CONTROLLER)
    _add_client_auth_flags(jb)
    jb.add_argument("--json", action="store_true")
    jb.set_defaults(func=cmd_jobs)

    t = sub.add_parser("topology", help="fabric topology: generate a fabric file, show the live graph")
    tsub = t.add_subparsers(dest="topology_command", required=True)
    tg = tsub.add_parser("generate", help="a Xingmai-style multi-rail Clos")
    tg.add_argument("--nodes", type=int, required=True)
    tg.add_argument("--gpus-per-node", type=int, default=8)
    tg.add_argument("--rails", type=int, default=8)
    tg.add_argument("--nodes-per-block", type=int, default=16)
    tg.add_argument("--spines", type=int, default=8)
    tg.add_argument("--spares", type=int, default=0)
    tg.add_argument("--out", default=None, help="file to write (JSON, or YAML for .yaml); default stdout")
    tg.set_defaults(func=cmd_topology_generate)
    ts = tsub.add_parser("show", help="summarise the live graph (or a fabric file)")
    ts.add_argument("--controller", default=DEFAULT_CONTROLLER)
    _add_client_auth_flags(ts)
    ts.add_argument("--file", default=None)
    ts.add_argument("--json", action="store_true")
    ts.set_defaults(func=cmd_topology_show)

    sc = sub.add_parser("scenario", help="run fault scenarios on a simulated cluster")
    scsub = sc.add_subparsers(dest="scenario_command", required=True)
    scr = scsub.add_parser("run", help="run one scenario file and print its verdict")
    scr.add_argument("file")
    scr.add_argument("--json", action="store_true")
    scr.set_defaults(func=cmd_scenario_run)

    d = sub.add_parser("demo", help="a controller and simulated agents on loopback, with faults")
    d.add_argument("--nodes", type=int, default=16)
    d.add_argument("--duration", type=float, default=0.0, help="seconds to run (0: until Ctrl-C)")
    d.add_argument("--listen", default="127.0.0.1:0")
    d.add_argument("--http", default="127.0.0.1:8080")
    d.set_defaults(func=cmd_demo)

    tl = sub.add_parser("tls", help="TLS helpers")
    tlsub = tl.add_subparsers(dest="tls_command", required=True)
    mk = tlsub.add_parser("make-test-ca", help="a throwaway CA with controller, admin and node certificates")
    mk.add_argument("--out", required=True, metavar="DIR", help="folder for the PEM files")
    mk.add_argument("--nodes", action="append", required=True, metavar="ID,ID,...", help="node ids (comma-separated)")
    mk.add_argument(
        "--controller-host",
        action="append",
        metavar="HOST",
        help="host name or IP in the controller certificate (repeatable; default localhost,127.0.0.1)",
    )
    mk.set_defaults(func=cmd_tls_make_test_ca)

    cf = sub.add_parser("config", help="service configuration files")
    cfsub = cf.add_subparsers(dest="config_command", required=True)
    cfc = cfsub.add_parser(
        "check",
        help="check a controller, agent or relay file (and STARPULSE_* overrides): "
        "exit 0 and 'ok: <summary>', or exit 2 and every error, one a line",
    )
    cfc.add_argument("file")
    cfc.add_argument(
        "--kind",
        choices=("controller", "agent", "relay"),
        default=None,
        help="default: by the sections in the file (agent/hardware: agent, relay: relay)",
    )
    cfc.set_defaults(func=cmd_config_check)
    cfe = cfsub.add_parser(
        "example", help="print a service's reference settings file: every setting at its default, documented"
    )
    cfe.add_argument("kind", choices=("controller", "agent", "relay"))
    cfe.set_defaults(func=cmd_config_example)

    v = sub.add_parser("version", help="print the version")
    v.set_defaults(func=cmd_version)
    return p


def _command_of(argv: Sequence[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    given = list(argv if argv is not None else sys.argv[1:])
    args = build_parser(_command_of(given) or "").parse_args(given)
    args.argv = given  # which flags were given (they win over the file and the environment)
    from starpulse.core.logs import configure_logging

    # One-shot commands keep stdout for their output; services reconfigure for JSON on stdout.
    configure_logging("warning", fmt="console", stream=sys.stderr)
    from starpulse.core.schema import ConfigError

    try:
        return int(args.func(args))
    except ConfigError as exc:  # a bad TLS, token, rules, policy or fabric file: one line each, not a traceback
        for line in exc.errors:
            print(f"starpulse {args.command}: {line}", file=sys.stderr)
        return 2


def entrypoint() -> int:
    """The console script: like main(), but a closed stdout (`starpulse … | head`) ends quietly.

    Kept out of main() because tests call main() in-process, where SIG_DFL for SIGPIPE
    would let any write to a closed pipe kill the test runner.
    """
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    return main()


if __name__ == "__main__":
    raise SystemExit(entrypoint())
