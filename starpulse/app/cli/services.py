"""The long-running services (controller, agent, relay): one way from file, environment and flags to their settings."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from starpulse.app.cli.common import install_stop

_CONFIG_HELP = (
    "settings file (YAML or TOML; see deploy/). Precedence: the file, then STARPULSE_<SECTION>__<KEY> "
    "environment overrides, then flags given on this command line"
)


def _given(args: argparse.Namespace) -> dict[str, Any]:
    """The flags given on the command line (dest -> value), not those left at their defaults."""
    from starpulse.app.cli import build_parser, subparsers  # the parser is built above this module

    parser = build_parser(args.command)
    sub = subparsers(parser).choices[args.command]
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
    node = {"node": built[0].node_id} if isinstance(built, tuple) else None  # the agent's (config, options)
    configure_logging(log.level, fmt=log.format, fields=node)
    return built


def _listen_line(command: str, exc: Any) -> str:
    """A ListenError as the service's one line, naming the flag that sets the address."""
    from starpulse.app.config import service

    flags = {f.key: f.name for f in service(command).FLAGS}
    what = flags.get(exc.what, exc.what)
    return f"starpulse {command}: {what} {exc.address}: {exc.reason}"


def cmd_controller(args: argparse.Namespace) -> int:
    """Run one controller (or one HA replica): exit 2 on bad settings, 3 when a replica lost its leadership."""
    settings = _settings(args)
    if settings is None:
        return 2
    return _serve_controller(settings.controller)


def _serve_controller(config: Any) -> int:
    """Run one controller, or one HA replica when config.ha is set; exit 3 when a replica lost its leadership."""
    from controller.service import Controller
    from starpulse.core.clock import SYSTEM_CLOCK

    async def main() -> None:
        stop = asyncio.Event()
        install_stop(stop)
        if config.ha is not None:
            from controller.replica import Replica

            await Replica(config, SYSTEM_CLOCK).serve_forever(stop)
        else:
            await Controller(config, clock=SYSTEM_CLOCK).serve_forever(stop)

    from starpulse.core.listen import ListenError

    try:
        asyncio.run(main())
    except ListenError as exc:
        print(_listen_line("controller", exc), file=sys.stderr)
        return 2
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
    from agent.transport.statelock import lock_state_dir
    from starpulse.core.listen import ListenError
    from starpulse.core.tls import load_material

    settings = _settings(args)
    if settings is None:
        return 2
    config, opt = settings
    if config.tls is not None:
        load_material(config.tls)  # a bad file is one line now, not a traceback in the link
    try:
        held = lock_state_dir(opt.state_dir)  # held for the process's life; the kernel frees it at exit
    except OSError as exc:  # in use by another agent, or a folder this user cannot write
        print(f"starpulse agent: --state-dir {exc}", file=sys.stderr)
        return 2
    try:
        return _agent_on(config, opt)
    except ListenError as exc:  # its --metrics address
        print(_listen_line("agent", exc), file=sys.stderr)
        return 2
    finally:
        held.release()


def _agent_on(config: Any, opt: Any) -> int:
    """Build and run the agent of the settings (its state folder is locked by the caller)."""
    from agent.factory import BackendUnavailable, build_agent, build_switch_agent

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
        print(f"starpulse agent: backend {opt.backend} unavailable: {exc}", file=sys.stderr)
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
    install_stop(stop)
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
        install_stop(stop)
        await relay.serve_forever(stop)

    from starpulse.core.listen import ListenError

    try:
        asyncio.run(main())
    except ListenError as exc:
        print(_listen_line("relay", exc), file=sys.stderr)
        return 2
    return 0


_SERVICES = (
    ("controller", "run the controller service", cmd_controller),
    ("agent", "run the node agent", cmd_agent),
    ("relay", "carry many agents' streams to the controller, batched (large fleets)", cmd_relay),
)


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


def register(sub: Any, only: str | None) -> None:
    """Add the service commands; with ``only``, the others get no flags (their settings stay unimported)."""
    for name, help, func in _SERVICES:
        _add_service(sub, name, help, func, only in (None, name))
