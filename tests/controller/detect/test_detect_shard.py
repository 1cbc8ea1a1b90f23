"""A detection shard's logic in-process (controller.detect.shard_worker.Shard) and its wire framing.

The shard must reach the verdicts the controller's own engine reaches on the same reports
and events, answer every report (valid or not) so its stream can be acked or ended, and
frame its traffic so a torn frame is an error, never a wrong message.
"""

from __future__ import annotations

import math
import os
import pickle
from pathlib import Path

import pytest

from agent.factory import build_collectors
from agent.runtime import CollectorSet
from agent.sim.node import SimNode
from agent.transport.delta import ReportDelta
from controller.detect.conditions import ConditionEngine
from controller.detect.model import ConditionChange
from controller.detect.rules import load_rules
from controller.detect.shard_worker import OP_EVENTS, OP_FORGET, OP_NODE, OP_REPORT, Shard, ShardSettings
from controller.detect.shardwire import ShardWireError, encode_frame, read_frame_fd, write_frame_fd
from controller.ingest.registry import ONLINE, NodeRecord
from controller.ingest.verdict import ReportResult
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb


def _sim_node(tmp_path: Path) -> tuple[ipb.Inventory, SimNode, CollectorSet]:
    """A simulated node, its collectors (probed) and its inventory, as an agent starts them."""
    sim = SimNode("node-007", tmp_path / "hw", seed=3)
    plan = build_collectors("sim", sink=lambda f: None, sim=sim, kmsg_path=None)
    cs = CollectorSet(plan.collectors)
    cs.probe()
    inv = cs.describe()
    for hook in plan.inventory_hooks:
        hook(inv)
    return inv, sim, cs


def _keys(changes: list[ConditionChange]) -> list[tuple[str, str, str]]:
    return [(c.kind, c.condition.rule, c.condition.component) for c in changes]


def test_shard_reaches_the_engines_verdicts_on_the_same_reports(tmp_path: Path) -> None:
    """Full and delta reports with faults appearing: the shard's changes are the engine's, in order."""
    inv, sim, cs = _sim_node(tmp_path)
    clock = FakeClock()  # one clock for both, standing still: the same times, the same fail-slow sample
    shard = Shard(ShardSettings(), clock)
    engine = ConditionEngine(load_rules(), fabric=None, clock=clock)
    node = NodeRecord(node_id="node-007", role=ipb.NODE_ROLE_COMPUTE, state=ONLINE, first_seen_ms=0, last_seen_ms=0)
    node.inventory.CopyFrom(inv)
    node.stream_token = 1
    delta = ReportDelta(full_every=4)
    delta.reset(enabled=True)
    ops: list[tuple[object, ...]] = [(OP_NODE, "node-007", ipb.NODE_ROLE_COMPUTE, 1, inv.SerializeToString())]
    expected: list[ConditionChange] = []
    try:
        for step in range(10):
            if step == 3:
                sim.inject("gpu_row_remap_failure", "gpu-1")
            if step == 5:
                sim.inject("nic_down", "nic-2")
            sim.advance(1.0)
            report = delta.encode(cs.collect(1).report)
            report.seq = step + 1
            expected += engine.on_report(node, report)
            ops.append((OP_REPORT, "node-007", 1, spb.AgentMessage(report=report).SerializeToString(), False, 0.0))
    finally:
        cs.close()
    xid = tpb.Event(seq=1, kind=tpb.EVENT_KIND_XID, severity=tpb.SEVERITY_CRITICAL, component="gpu-4", xid=79)
    expected += engine.on_events(node, [xid])
    ops.append((OP_EVENTS, "node-007", [xid.SerializeToString()]))
    expected += engine.forget("node-007")
    ops.append((OP_FORGET, "node-007"))

    results, changes, opened_by_events = shard.handle(ops)

    assert [r.seq for r in results] == list(range(1, 11))
    assert not any(r.error for r in results)
    assert all(r.gpus == 8 and r.nics >= 8 for r in results)
    # fail-slow signals ride along, from one report per sample_every_s (15 s; the clock stands still)
    assert results[0].signals and not any(r.signals for r in results[1:])
    assert _keys(changes) == _keys(expected)
    opened = {(rule, comp) for kind, rule, comp in _keys(changes) if kind == "opened"}
    assert any(comp == "node-007/gpu-1" for _, comp in opened)
    assert any(comp == "node-007/gpu-4" for _, comp in opened)
    # The one batch of events comes back with what it opened (the Xid's condition), for the trace.
    ((batch,),) = [opened_by_events]
    assert batch.node == "node-007" and batch.seqs == [1]
    assert [k[1] for k in batch.keys] == ["node-007/gpu-4"]


def test_each_batch_of_events_says_what_it_opened_and_when() -> None:
    """The controller traces a sharded event and picks its grouping window from this answer.

    A batch that opens a condition names it with the batch's seqs and the time on the shard's
    clock; a batch that opens nothing still comes back (empty keys), so its trace is let go.
    """
    clock = FakeClock()
    shard = Shard(ShardSettings(), clock)
    down = tpb.Event(seq=4, kind=tpb.EVENT_KIND_NIC_LINK_DOWN, severity=tpb.SEVERITY_CRITICAL, component="mlx5_3/1")
    info = tpb.Event(seq=5, kind=tpb.EVENT_KIND_NIC_LINK_UP, severity=tpb.SEVERITY_INFO, component="mlx5_1/1")
    _, changes, opened = shard.handle(
        [
            (OP_NODE, "node-001", ipb.NODE_ROLE_COMPUTE, 1, b""),
            (OP_EVENTS, "node-001", [down.SerializeToString()]),
            (OP_EVENTS, "node-001", [info.SerializeToString()]),
        ]
    )
    assert [(c.kind, c.condition.rule) for c in changes] == [("opened", "nic.port_down")]
    assert [(o.node, o.seqs) for o in opened] == [("node-001", [4]), ("node-001", [5])]
    assert opened[0].keys == [changes[0].condition.key] and opened[1].keys == []
    assert opened[0].at == clock.time()


def test_every_report_gets_an_answer_even_a_bad_one() -> None:
    """Invalid, undecodable, not-a-report and unknown-node reports come back with an error, never silence."""
    shard = Shard(ShardSettings(), FakeClock())
    ok = spb.AgentMessage(report=tpb.Report(seq=1)).SerializeToString()
    nan = spb.AgentMessage(report=tpb.Report(seq=2, gpus=[tpb.GpuSample(temperature_c=math.nan)])).SerializeToString()
    hello = spb.AgentMessage(hello=spb.Hello(node_id="node-001")).SerializeToString()
    results, _, _ = shard.handle(
        [
            (OP_REPORT, "node-001", 1, ok, False, 0.0),  # before the shard was told about the node
            (OP_NODE, "node-001", ipb.NODE_ROLE_COMPUTE, 1, b""),
            (OP_REPORT, "node-001", 1, ok, False, 0.0),
            (OP_REPORT, "node-001", 1, nan, False, 0.0),
            (OP_REPORT, "node-001", 1, b"\x12\x03\xff\xff\xff", False, 0.0),
            (OP_REPORT, "node-001", 1, hello, False, 0.0),
            (
                OP_REPORT,
                "node-001",
                1,
                spb.AgentMessage(report=tpb.Report(seq=3, counters_delta=True)).SerializeToString(),
                True,
                0.0,
            ),
        ]
    )
    assert len(results) == 6
    assert "knows no node" in results[0].error
    assert results[1].error == "" and results[1].seq == 1
    assert "finite" in results[2].error or "nan" in results[2].error.lower()
    assert "not an AgentMessage" in results[3].error
    assert results[4].error == "expected a report"
    assert results[5].error == "" and not results[5].full_report_needed  # a full report came first


def test_a_delta_before_any_full_report_asks_for_one() -> None:
    shard = Shard(ShardSettings(), FakeClock())
    delta = spb.AgentMessage(report=tpb.Report(seq=1, counters_delta=True)).SerializeToString()
    results, *_ = shard.handle([(OP_NODE, "n", ipb.NODE_ROLE_COMPUTE, 1, b""), (OP_REPORT, "n", 1, delta, False, 0.0)])
    assert results[0].full_report_needed
    results, *_ = shard.handle([(OP_NODE, "n", ipb.NODE_ROLE_COMPUTE, 2, b""), (OP_REPORT, "n", 2, delta, False, 0.0)])
    assert results[0].full_report_needed  # a new stream starts over


def test_frames_round_trip_and_a_torn_frame_is_an_error() -> None:
    r, w = os.pipe()
    try:
        write_frame_fd(w, [("report", "node-1", 1, b"x" * 20_000)])
        write_frame_fd(w, {"second": True})
        assert read_frame_fd(r) == [("report", "node-1", 1, b"x" * 20_000)]
        assert read_frame_fd(r) == {"second": True}
        os.write(w, encode_frame("cut short")[:-3])
        os.close(w)
        w = -1
        with pytest.raises(ShardWireError):
            read_frame_fd(r)
        assert read_frame_fd(r) is None  # nothing more: a clean end of file
    finally:
        os.close(r)
        if w != -1:
            os.close(w)


def _probe_shard() -> tuple[Shard, list[str]]:
    from controller.fabric import generate_fabric
    from controller.fabric.probeplan import ProbeConfig

    fabric = generate_fabric(16, gpus_per_node=2, rails=2, nodes_per_block=8, spines=4)
    shard = Shard(ShardSettings(probes=ProbeConfig(enabled=True), fabric=fabric), FakeClock())
    return shard, sorted(fabric.nics())


def _probe_report(seq: int, local: str, peer: str, lost: int) -> bytes:
    report = tpb.Report(seq=seq)
    report.probe_results.add(local_nic=local, peer_nic=peer, sent=200, lost=lost, rtt_p99_us=9.0)
    report.probe_results.add(local_nic=local, peer_nic="m/nic-0", sent=0)  # nothing sent: nothing to say
    return spb.AgentMessage(report=report).SerializeToString()


def test_probe_results_are_summed_in_the_shard_and_asked_for_by_the_localiser() -> None:
    """Issue 29: the shard decodes a report's probe results into its own window, stamped with the
    controller's clock (the op's last field); the verdict carries only their count. A snapshot
    answers per component and holds the window: results that come before the release wait."""
    from controller.detect.probe_sums import SumsRequest
    from controller.detect.shard_worker import OP_PROBE_KEYS, OP_PROBE_RELEASE, OP_PROBE_SNAPSHOT

    shard, nics = _probe_shard()
    a, b = nics[0], nics[1]
    req = SumsRequest(40_000, 10_000, frozenset(), 500.0)
    results, *_ = shard.handle(
        [
            (OP_NODE, "n", ipb.NODE_ROLE_COMPUTE, 1, b""),
            (OP_REPORT, "n", 1, _probe_report(1, a, b, 3), False, 0.0, 39_000),
            (OP_PROBE_SNAPSHOT, req),
            (OP_REPORT, "n", 1, _probe_report(2, a, b, 1), False, 0.0, 39_500),  # while held
            (OP_PROBE_KEYS, frozenset({a}), 0),
            (OP_PROBE_RELEASE,),
        ]
    )
    back = ReportResult.from_wire(pickle.loads(pickle.dumps(results[0].to_wire())))
    assert back.probe_count == 2
    snap, (keys, sample) = [pickle.loads(answer.payload or b"") for answer in shard.probe_answers]
    assert sample == []
    assert snap.csent[a] == 200 and snap.clost[a] == 3 and snap.tsent == 200
    assert [(r.local_nic, r.peer_nic, r.sent, r.lost) for r in keys] == [(a, b, 200, 3)]
    after = shard.probe_sums.snapshot(req) if shard.probe_sums is not None else None
    assert after is not None and after.clost[a] == 4  # released: the held report counts now
    old = SumsRequest(80_000, 39_600, frozenset(), 500.0)  # both aged out (stamped 39.0 and 39.5 s)
    assert shard.probe_sums is not None and shard.probe_sums.snapshot(old).tsent == 0


async def test_the_shards_answer_probe_questions_over_the_wire() -> None:
    """Real shard processes: each node's results go to its shard, and the snapshots the shards
    send merge into what one window holding every result gives."""
    from controller.detect.probe_sums import ProbeSums, SumsRequest, observations
    from controller.detect.probes import merge
    from controller.detect.shard_worker import OP_PROBE_KEYS, OP_PROBE_RELEASE, OP_PROBE_SNAPSHOT
    from controller.detect.shards import DetectShards

    probe_shard, nics = _probe_shard()
    settings = ShardSettings(probes=probe_shard.probe_sums.config, fabric=probe_shard.probe_sums.paths.fabric)  # type: ignore[union-attr]
    whole = ProbeSums(settings.fabric, settings.probes)  # type: ignore[arg-type]
    verdicts: list[ReportResult] = []
    shards = DetectShards(
        2, settings, on_changes=lambda changes, opened: None, on_lost=lambda index: None, now_ms=lambda: 39_000
    )
    shards.bind(verdicts.append)
    await shards.start()
    try:
        for i, nic in enumerate(nics):
            node = NodeRecord(
                node_id=f"node-{i}", role=ipb.NODE_ROLE_COMPUTE, state=ONLINE, first_seen_ms=0, last_seen_ms=0
            )
            raw = _probe_report(1, nic, nics[(i + 3) % len(nics)], i % 3)
            shards.decide_raw(node, raw, 0.0)
            whole.add(39_000, observations(spb.AgentMessage.FromString(raw).report))
        req = SumsRequest(40_000, 10_000, frozenset(), 500.0)
        snaps = [pickle.loads(b) for b in await shards.ask((OP_PROBE_SNAPSHOT, req))]
        assert merge(snaps) == merge([whole.snapshot(req)])
        assert {p for s in snaps for p in s.csent} >= set(nics)
        parts = [pickle.loads(b)[0] for b in await shards.ask((OP_PROBE_KEYS, frozenset(nics[:2]), 0))]
        shards.tell((OP_PROBE_RELEASE,))
        got = sorted(r for part in parts for r in part)
        assert got == sorted(whole.keys_through(frozenset(nics[:2])))
        assert len(got) == 4
        assert sum(v.probe_count for v in verdicts) == 2 * len(nics)
    finally:
        await shards.stop()


async def test_events_go_to_their_shard_without_the_reports_linger() -> None:
    """Reports wait up to FLUSH_LINGER_S to share a frame; a batch of events (a fault's first
    word) brings that flush forward to the next turn of the loop, and only one flush runs."""
    import asyncio

    from controller.detect.shards import DetectShards

    shards = DetectShards(1, ShardSettings(), on_changes=lambda changes, opened: None, on_lost=lambda index: None)
    flushes: list[int] = []
    shards.flush = lambda: flushes.append(1)  # type: ignore[method-assign]  # no shard processes here
    shards._schedule_flush()  # a report: lingers
    await asyncio.sleep(0)
    assert flushes == []
    shards._schedule_flush(0.0)  # events: at once
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert flushes == [1]
    await asyncio.sleep(0.01)  # past the report linger: the brought-forward flush was the only one
    assert flushes == [1]
