"""Probe results for the load generator (issue 29): every simulated node reports its plan's windows.

``bench.scale --probe-results`` declares a rail-optimised fabric for the simulated nodes (8
rails, 8 spines, ``per_block`` nodes under each leaf), hands it to the controller with the
probe mesh enabled, and plans the mesh with the controller's own planner and defaults
(``plan_mesh``: the same targets the controller pushes). Each node's reports then carry what
its prober would: one result per target per ``window_s`` (the clean flows of a target summed,
as ``agent.probe.prober`` does), with loopback-like round trips (p50 ~9 us, p99 ~10-20 us) and,
on a small share of flows, one lost probe reported alone with its source port, as a real
fabric's stray drops are. The controller decodes them where it decodes reports (its detection
shards with ``--detect-workers``), and its localiser adds and votes on them at fleet size.

Results are pre-encoded per node (a few draws each, taken in turn) as the bytes of the
report's repeated ``probe_results`` field, appended to the report template: proto fields may
come in any order, so the controller decodes the report a full encode would give.
"""

from __future__ import annotations

import random
from pathlib import Path

from bench.loadgen import varint
from controller.fabric import Fabric, generate_fabric, save_fabric
from controller.fabric.probeplan import ProbeConfig, plan_mesh
from starpulse.v1 import telemetry_pb2 as tpb

_FIELD = tpb.Report.DESCRIPTOR.fields_by_name["probe_results"].number
_TAG = varint((_FIELD << 3) | 2)  # the field's key, length-delimited


def fabric_for(nodes: int, per_block: int = 32) -> Fabric:
    """The declared fabric of ``nodes`` simulated nodes: 8 rails, 8 spines (the planner's shape)."""
    return generate_fabric(nodes, gpus_per_node=8, rails=8, nodes_per_block=per_block, spines=8)


def controller_args(workdir: Path, fabric: Fabric) -> list[str]:
    """The controller's flags for a run with probes: the declared fabric and the mesh enabled."""
    fabric_path = workdir / "fabric.json"
    save_fabric(fabric, fabric_path)
    settings = workdir / "probes.yaml"
    settings.write_text("detection:\n  probes:\n    enabled: true\n", encoding="utf-8")
    return ["--fabric", str(fabric_path), "--config", str(settings)]


def window(
    targets: list[tuple[str, str, tuple[int, ...], float]],
    window_s: int,
    rng: random.Random,
    stray_loss: float,
    version: int,
) -> list[tpb.ProbeResult]:
    """One window of one node's targets ``(local NIC, peer NIC, source ports, packets/s)``, drawn."""
    out: list[tpb.ProbeResult] = []
    for local, peer, ports, pps in targets:
        flows = max(1, len(ports))
        sent = max(1, round(pps * window_s))
        lossy = rng.random() < stray_loss * flows  # one flow of the target lost one probe
        if lossy and flows > 1:
            per_flow = max(1, sent // flows)
            out.append(
                tpb.ProbeResult(
                    local_nic=local,
                    peer_nic=peer,
                    src_port=rng.choice(ports),
                    sent=per_flow,
                    lost=1,
                    rtt_p50_us=9.0 + rng.random(),
                    rtt_p99_us=12.0 + 8 * rng.random(),
                    responder_us=3.0,
                    plan_version=version,
                    window_ms=window_s * 1000,
                )
            )
            sent -= per_flow
        out.append(
            tpb.ProbeResult(
                local_nic=local,
                peer_nic=peer,
                sent=sent,
                rtt_p50_us=9.0 + rng.random(),
                rtt_p99_us=10.0 + 10 * rng.random(),
                rtt_stdev_us=1.0 + rng.random(),
                responder_us=3.0,
                plan_version=version,
                window_ms=window_s * 1000,
            )
        )
    return out


def payloads(
    fabric: Fabric,
    nodes: list[str],
    *,
    draws: int = 3,
    seed: int = 0,
    stray_loss: float = 1e-4,
    config: ProbeConfig | None = None,
) -> dict[str, list[bytes]]:
    """Each node's ``draws`` windows as the bytes of ``Report.probe_results`` (to append to a report).

    ``stray_loss``: the chance one flow loses one probe in a window (a clean fabric's strays,
    far under the localiser's ``min_lost`` and loss threshold).
    """
    cfg = config or ProbeConfig(enabled=True)
    mesh = plan_mesh(fabric, cfg, version=1)
    rng = random.Random(seed)
    tag = _TAG
    out: dict[str, list[bytes]] = {}
    for node in nodes:
        plan = mesh.for_node(node, cfg)
        targets = [(t.local_nic, t.peer_nic, tuple(t.src_ports), t.packets_per_s) for t in plan.targets]
        variants = []
        for _ in range(draws):
            encoded = bytearray()
            for r in window(targets, cfg.window_s, rng, stray_loss, plan.version):
                body = r.SerializeToString()
                encoded += tag + varint(len(body)) + body
            variants.append(bytes(encoded))
        out[node] = variants
    return out
