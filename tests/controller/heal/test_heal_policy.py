"""Self-healing policy: loading, validation errors, decisions, escalation."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from controller.detect.model import Incident
from controller.heal.ladder import RepairPolicy
from controller.heal.policy import (
    ALERT_ONLY,
    NEVER_EVICT_KINDS,
    Policy,
    PolicyError,
    SqliteHealHistory,
    load_policy,
    parse_policy,
    target_node,
)
from controller.heal.states import NodeHealState, RemediationStore
from starpulse.core.clock import FakeClock

S = NodeHealState
H = 3600  # s


def incident(
    kind: str = "gpu_fault",
    root: str = "node-003/gpu-5",
    *,
    id: str = "inc-000001",
    severity: str = "critical",
    action: str = "reset_gpu",
    rules: tuple[str, ...] = (),
    xid: int | None = None,
    ctype: str | None = None,
    nodes: list[str] | None = None,
) -> Incident:
    evidence: list[dict[str, Any]] = [{"rule": r, "evidence": {}} for r in rules]
    if xid is not None:
        evidence.append({"rule": "gpu.xid.reboot", "evidence": {"xid": xid}})
    types = {"gpu_fault": "gpu", "nic_fault": "nic", "switch_fault": "switch", "link_fault": "link"}
    fields: dict[str, Any] = {
        "id": id,
        "kind": kind,
        "root_cause": root,
        "component_type": ctype or types.get(kind, "network" if kind == "partition" else "node"),
        "affected_nodes": nodes if nodes is not None else ([root.split("/", maxsplit=1)[0]] if root else []),
        "affected_jobs": ["job-1"],
        "severity": severity,
        "action": action,
        "evidence": evidence,
        "opened_ms": 0,
    }
    return Incident(**fields)


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(10 * 86_400_000)


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> RemediationStore:
    return RemediationStore(sqlite3.connect(str(tmp_path / "c.db"), isolation_level=None), clock)


@pytest.fixture
def history(store: RemediationStore) -> SqliteHealHistory:
    return SqliteHealHistory(store, store.clock)


# -- defaults ------------------------------------------------------------------------------

DEFAULT_CASES = [
    # (kind, root, severity, action, rules, xid) -> (action, checkpoint_first)
    (("gpu_fault", "node-003/gpu-5", "critical", "reset_gpu", ("gpu.remap_pending",), None), ("reset_gpu", True)),
    (("gpu_fault", "node-003/gpu-5", "fatal", "reboot", ("gpu.lost",), None), ("reboot", False)),
    (("gpu_fault", "node-003/gpu-5", "fatal", "reboot", (), 79), ("reboot", False)),
    (("gpu_fault", "node-003/gpu-5", "warning", "restart_app", (), None), (ALERT_ONLY, False)),
    (("gpu_fault", "node-003/gpu-5", "info", "none", (), None), (ALERT_ONLY, False)),
    (("gpu_fault", "node-003/gpu-5", "critical", "contact_support", (), None), ("rma", True)),
    (("gpu_fault", "node-003/gpu-5", "critical", "investigate", (), None), ("evict", True)),
    (("node_fault", "node-003", "fatal", "reboot", (), None), ("reboot", False)),
    (("node_fault", "node-003", "critical", "investigate", (), None), ("evict", False)),
    (("node_fault", "node-003", "info", "none", (), None), (ALERT_ONLY, False)),
    (("node_fault", "node-003", "info", "investigate", (), None), (ALERT_ONLY, False)),
    (("node_fault", "node-003", "warning", "restart_app", (), None), (ALERT_ONLY, False)),
    (("nic_fault", "node-003/nic-2", "warning", "investigate", (), None), ("evict", True)),
    (("straggler", "node-003", "warning", "investigate", (), None), ("evict", True)),
    (("straggler", "node-003", "info", "investigate", (), None), (ALERT_ONLY, False)),
    (("host_fault", "node-003", "critical", "investigate", (), None), ("cordon", False)),
    (("switch_fault", "leaf-b0-r3", "fatal", "investigate_switch", (), None), (ALERT_ONLY, False)),
    (("link_fault", "node-003/nic-5<->leaf-b0-r5", "critical", "check_link", (), None), (ALERT_ONLY, False)),
    (("partition", "", "fatal", "investigate_network", (), None), (ALERT_ONLY, False)),
    (("node_down", "node-003", "critical", "investigate", (), None), (ALERT_ONLY, False)),
    (("other", "node-003", "critical", "investigate", (), None), (ALERT_ONLY, False)),
    (("brand_new_kind", "node-003", "fatal", "reboot", (), None), (ALERT_ONLY, False)),
]


@pytest.mark.parametrize(("given", "want"), DEFAULT_CASES, ids=[f"{g[0]}-{g[3]}-{g[2]}" for g, _ in DEFAULT_CASES])
def test_default_policy_decisions(policy: Policy, given: tuple[Any, ...], want: tuple[str, bool]) -> None:
    kind, root, sev, action, rules, xid = given
    d = policy.decide(incident(kind, root, severity=sev, action=action, rules=rules, xid=xid))
    assert (d.action, d.checkpoint_first) == want, d.reason
    assert not d.escalated


def test_target_node() -> None:
    assert target_node(incident("gpu_fault", "node-003/gpu-5")) == "node-003"
    assert target_node(incident("straggler", "node-007", ctype="node")) == "node-007"
    assert target_node(incident("partition", "", nodes=["a", "b", "c"])) is None
    assert target_node(incident("switch_fault", "leaf-b0-r3", nodes=["node-001", "node-002"])) is None


@pytest.mark.parametrize("kind", sorted(NEVER_EVICT_KINDS))
def test_network_kinds_never_evict_whatever_the_history(policy: Policy, history: SqliteHealHistory, kind: str) -> None:
    for i in range(5):
        d = policy.decide(incident(kind, "node-003", id=f"inc-{i}", severity="fatal", action="reboot"), history)
        assert d.action == ALERT_ONLY and not d.evicts


# -- escalation ----------------------------------------------------------------------------


def test_same_gpu_escalates_to_rma_after_three_in_24h(
    policy: Policy, history: SqliteHealHistory, clock: FakeClock
) -> None:
    def decide(i: int, gpu: str = "node-003/gpu-5") -> Any:
        return policy.decide(incident(root=gpu, id=f"inc-{i}", severity="critical", action="reset_gpu"), history)

    assert decide(1).action == "reset_gpu"
    clock.advance(5 * H)
    assert decide(1).action == "reset_gpu"  # the same incident again counts once
    assert decide(2).action == "reset_gpu"
    assert decide(3, gpu="node-003/gpu-6").action == "reset_gpu"  # another GPU has its own count
    clock.advance(5 * H)
    d = decide(4)
    assert d.action == "rma" and d.escalated and "hardware inspection" in d.reason


def test_same_gpu_escalation_window_expires(policy: Policy, history: SqliteHealHistory, clock: FakeClock) -> None:
    for i in range(2):
        policy.decide(incident(id=f"inc-{i}"), history)
    clock.advance(25 * H)  # both fell out of the 24 h window
    assert policy.decide(incident(id="inc-9"), history).action == "reset_gpu"


def test_same_gpu_escalation_ignores_minor_faults(policy: Policy, history: SqliteHealHistory) -> None:
    for i in range(5):
        d = policy.decide(incident(id=f"inc-{i}", severity="warning", action="restart_app"), history)
    assert d.action == ALERT_ONLY and not d.escalated


def test_escalation_counts_survive_restart(tmp_path: Path, policy: Policy, clock: FakeClock) -> None:
    def hist() -> SqliteHealHistory:
        return SqliteHealHistory(
            RemediationStore(sqlite3.connect(str(tmp_path / "c.db"), isolation_level=None), clock), clock
        )

    policy.decide(incident(id="inc-1"), hist())
    policy.decide(incident(id="inc-2"), hist())
    assert policy.decide(incident(id="inc-3"), hist()).action == "rma"


def test_repair_loop_cap_sends_to_rma(policy: Policy, store: RemediationStore, history: SqliteHealHistory) -> None:
    for loop in range(3):
        d = policy.decide(incident("node_fault", "node-003", id=f"inc-{loop}", action="investigate"), history)
        if loop < 2:
            assert d.action == "evict" and not d.escalated
        else:
            assert d.action == "rma" and d.escalated and "2 repair loops" in d.reason
        for st in (S.CORDONED, S.DRAINING, S.EVICTED, S.REPAIRING, S.VALIDATING, S.SPARE, S.IN_SERVICE):
            store.transition("node-003", st, "loop", f"inc-{loop}")
    # a fault the policy only alerts on does not escalate
    assert policy.decide(incident(id="inc-x", severity="warning", action="restart_app"), history).action == ALERT_ONLY


def test_agent_command_not_allowed_degrades_to_evict(policy: Policy) -> None:
    text = Path(policy.source).read_text().replace("agent_commands: [reset_gpu, reboot]", "agent_commands: [reset_gpu]")
    p = parse_policy(text, "custom.yaml")
    d = p.decide(incident("node_fault", "node-003", severity="fatal", action="reboot"))
    assert d.action == "evict" and "not in agent_commands" in d.reason


# -- loading errors ------------------------------------------------------------------------


GPU = "version: 1\nkinds: {gpu_fault: {action: evict}}\n"


def _errors(text: str) -> str:
    with pytest.raises(PolicyError) as err:
        parse_policy(text, "p.yaml")
    return str(err.value)


@pytest.mark.parametrize("kind", ["switch_fault", "partition", "link_fault", "node_down", "other"])
def test_refuses_eviction_for_non_evictable_kinds(kind: str) -> None:
    msg = _errors(f"version: 1\nkinds:\n  {kind}: {{action: evict}}\n")
    assert f"p.yaml: kinds.{kind}: {kind} may only be alert_only" in msg and "evict" in msg


def test_refuses_hidden_eviction_through_overrides() -> None:
    msg = _errors("version: 1\nkinds:\n  switch_fault: {action: alert_only, by_action: {reboot: cordon}}\n")
    assert "switch_fault may only be alert_only" in msg and "cordon" in msg


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("version: 2\nkinds: {gpu_fault: {action: evict}}\n", "version: must be one of 1, got 2"),
        ("version: 1\n", "kinds: is required"),
        (
            "version: 1\nkinds: {gpu_fault: {action: explode}}\n",
            "kinds.gpu_fault.action: must be one of alert_only, cordon, evict, reset_gpu, reboot, rma, got 'explode'",
        ),
        ("version: 1\nkinds: {gpu_fault: {}}\n", "kinds.gpu_fault.action: is required"),
        ("version: 1\nkinds: {gpu_fault: {action: evict, colour: red}}\n", "kinds.gpu_fault.colour: unknown key"),
        (
            "version: 1\nkinds: {gpu_fault: {action: evict, min_severity: loud}}\n",
            "min_severity: must be one of info, warning, critical, fatal, got 'loud'",
        ),
        (
            "version: 1\nkinds: {gpu_fault: {action: evict, by_xid: {abc: reboot}}}\n",
            "kinds.gpu_fault.by_xid.abc: must be an Xid number or 'unknown'",
        ),
        (
            "version: 1\nkinds: {gpu_fault: {action: evict, checkpoint_first: maybe}}\n",
            "checkpoint_first: must be true, false or a mapping, got 'maybe'",
        ),
        (GPU + "agent_commands: [rm_rf]\n", "agent_commands[0]: must be one of reset_gpu, reboot, got 'rm_rf'"),
        (
            GPU + "escalation: {same_gpu_fatal_xid: {count: 0, window: 24h}}\n",
            "escalation.same_gpu_fatal_xid.count: must be an integer >= 1, got 0",
        ),
        (
            GPU + "escalation: {same_gpu_fatal_xid: {count: 3, window: 5kg}}\n",
            "same_gpu_fatal_xid.window:",
        ),
        (GPU + "escalation: {max_repair_loops: -1}\n", "max_repair_loops"),
        ("version: 1\nkinds: [\n", "p.yaml: not valid YAML at line"),
        ("- a list\n", "expected a mapping"),
    ],
)
def test_load_errors_name_file_key_and_problem(text: str, expect: str) -> None:
    msg = _errors(text)
    assert expect in msg and msg.startswith("p.yaml")


def test_all_errors_reported_at_once() -> None:
    e = PolicyError([])
    with pytest.raises(PolicyError) as err:
        parse_policy("version: 1\nkinds: {gpu_fault: {action: x}, partition: {action: evict}}\n", "p.yaml")
    assert len(err.value.errors) == 2 and isinstance(e, ValueError)


def test_load_policy_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read policy file"):
        load_policy(tmp_path / "nope.yaml")


def test_load_policy_from_path(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("version: 1\nkinds:\n  gpu_fault: {action: cordon}\nescalation: {max_repair_loops: 5}\n")
    p = load_policy(f)
    assert p.escalation.max_repair_loops == 5 and p.escalation.same_gpu_count == 3
    assert p.decide(incident()).action == "cordon"
    assert p.decide(incident("nic_fault", "node-003/nic-1")).action == ALERT_ONLY  # no entry: alert only


def test_the_spare_pool_is_a_share_of_the_fleet_by_default() -> None:
    """Issue 28 item 6: 1.2 % of the fleet's compute nodes, rounded up, at least one; measured."""
    repair = load_policy().repair
    assert repair.spare_target is None and repair.spare_share_pct == 1.2
    assert [repair.spare_target_for(n) for n in (1, 16, 83, 84, 256, 2048, 10000)] == [1, 1, 1, 2, 4, 25, 120]
    assert RepairPolicy(spare_share_pct=0.0).spare_target_for(2048) == 0  # 0 %: no pool


@pytest.mark.parametrize(
    ("repair", "nodes", "want"),
    [
        ("repair: {spare_target: 1}\n", 2048, 1),  # a file from before spare_share keeps its meaning
        ("repair: {spare_target: 0}\n", 2048, 0),
        ("repair: {spare_share: 2%}\n", 256, 6),
        ("repair: {spare_share: 2%, spare_target: 4}\n", 256, 4),  # the absolute count wins
    ],
)
def test_a_policy_file_sets_the_spare_target_as_a_count_or_a_share(repair: str, nodes: int, want: int) -> None:
    assert parse_policy(GPU + repair, "p.yaml").repair.spare_target_for(nodes) == want


@pytest.mark.parametrize(
    ("value", "expect"),
    [("1", "expected a percentage"), ("120%", "repair.spare_share"), ("3m", "is a time")],
)
def test_a_bad_spare_share_names_the_key(value: str, expect: str) -> None:
    with pytest.raises(PolicyError, match=expect):
        parse_policy(GPU + f"repair: {{spare_share: {value}}}\n", "p.yaml")
