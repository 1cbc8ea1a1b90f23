"""nic.missing: an RDMA port of the node's inventory absent from its report.

One definition for the controller (the inventory the node registered with) and for
`starpulse scan --expect` (that inventory plus the ports the file names; through the CLI in
tests/app/cli/test_scan_verdict.py)."""

from __future__ import annotations

from starpulse.app.nodecheck import Expected, judge
from tests.support.conditions import NODE, compute_node, good_report, make_engine, opened, resolved

KEY = ("nic.missing", f"{NODE}/nic-5")


def _without_nic5(ts: int):  # type: ignore[no-untyped-def]
    r = good_report(ts)
    del r.nics[5]
    r.collectors.add(name="nic", supported=True, ok=True)
    return r


def test_a_port_gone_from_the_report_opens_and_coming_back_resolves() -> None:
    engine, clock = make_engine()
    node = compute_node()
    changes = engine.on_report(node, _without_nic5(clock.time_ms()))
    assert opened(changes) == [KEY]
    cond = engine.get(*KEY)
    assert cond is not None and (cond.severity, cond.category) == ("critical", "nic_errors")
    assert "in the inventory but not in the report (7 of 8 ports)" in cond.message
    clock.advance(5)
    assert resolved(engine.on_report(node, good_report(clock.time_ms()))) == [KEY]


def test_a_failed_nic_collector_is_unknown_not_missing() -> None:
    engine, clock = make_engine()
    node = compute_node()
    r = good_report(clock.time_ms())
    del r.nics[:]
    r.collectors.add(name="nic", supported=True, ok=False, error="sysfs unreadable")
    assert not [k for k in opened(engine.on_report(node, r)) if k[0] == "nic.missing"]


def test_a_report_without_nic_data_says_nothing_about_nics() -> None:
    engine, clock = make_engine()
    node = compute_node()
    r = good_report(clock.time_ms())
    del r.nics[:]
    assert not [k for k in opened(engine.on_report(node, r)) if k[0] == "nic.missing"]


def test_scan_names_the_expected_port_by_the_same_rule() -> None:
    """The expected inventory adds the port; the controller's rule says it is missing."""
    node = compute_node()
    reports = [good_report(1_700_000_000_000), good_report(1_700_000_002_000)]
    for r in reports:
        r.collectors.add(name="nic", supported=True, ok=True)
    verdict = judge(NODE, node.inventory, reports, [], Expected(nics=("mlx5_0/1", "mlx5_9/1")))
    assert [(c.rule, c.evidence["port"]) for c in verdict.conditions] == [("nic.missing", "mlx5_9/1")]
    assert verdict.conditions[0].component.startswith(f"{NODE}/")  # named as the controller names it
    assert verdict.missing == ["nic mlx5_9/1"] and verdict.exit_code == 1
    assert judge(NODE, node.inventory, reports, [], Expected(nics=("mlx5_0/1",))).exit_code == 0


def test_a_new_inventory_is_read_again_after_re_registration() -> None:
    """The ports a report is compared with are the node's current inventory: a node that
    registers again with one more port has that port missing from its next report."""
    engine, clock = make_engine()
    node = compute_node()
    healthy = good_report(clock.time_ms())
    healthy.collectors.add(name="nic", supported=True, ok=True)
    assert not [k for k in opened(engine.on_report(node, healthy)) if k[0] == "nic.missing"]
    node.inventory.nics.add(rdma_device="mlx5_9", port=1, netdev="eth9")
    node.stream_token += 1  # a new stream: the engine names the node anew
    clock.advance(5)
    again = good_report(clock.time_ms())
    again.collectors.add(name="nic", supported=True, ok=True)
    missing = [k for k in opened(engine.on_report(node, again)) if k[0] == "nic.missing"]
    assert len(missing) == 1
    cond = engine.get(*missing[0])
    assert cond is not None and cond.evidence["port"] == "mlx5_9/1"


def test_an_open_condition_is_still_resolved_when_every_port_is_back() -> None:
    """The fast path (every port reported) is taken only while nothing is open on the node."""
    engine, clock = make_engine()
    node = compute_node()
    engine.on_report(node, _without_nic5(clock.time_ms()))
    clock.advance(5)
    back = good_report(clock.time_ms())
    back.collectors.add(name="nic", supported=True, ok=True)
    assert resolved(engine.on_report(node, back)) == [KEY]
