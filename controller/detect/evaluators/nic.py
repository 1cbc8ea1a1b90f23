"""NIC rule kinds: a port's state, its counter rates, a rail slower than the others, and a
port of the inventory absent from the report."""

from __future__ import annotations

from collections.abc import Mapping
from operator import attrgetter
from typing import Any

from controller.detect.evaluators import counters
from controller.detect.evaluators.base import (
    Derived,
    NicCounterEvaluator,
    NicEvaluator,
    NicPort,
    NicSetEvaluator,
    Owned,
    Setup,
)
from controller.detect.evaluators.params import (
    EVENTS,
    THRESHOLD,
    WINDOW,
    Param,
    boolean,
    list_of,
    one_of,
    quantity,
    text,
)
from controller.detect.model import Defaults, Rule
from controller.detect.rates import RateSample
from starpulse.v1 import telemetry_pb2 as tpb

NIC_SOURCES = ("counters", "hw_counters", "ethtool_stats", "netdev_stats")
PORT_STATES = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}
_ACTIVE = PORT_STATES["ACTIVE"]
# How an operator lets a saturated IBA port counter count again.
_CLEAR_PORT = "clear the port counters (perfquery -R / reset)"


class NicState(NicEvaluator):
    """An RDMA port whose state is not the expected one (ACTIVE)."""

    kind = "nic_state"
    params = {"expect": Param(text, default="ACTIVE"), "events": EVENTS}

    @classmethod
    def reads(cls, rule: Rule) -> tuple[str, ...]:
        return ("state_code",)

    def __init__(self, rules: tuple[Rule, ...], setup: Setup) -> None:
        super().__init__(rules, setup)
        self._code = setup.nic_fields["state_code"]
        self._expect = tuple((r, PORT_STATES.get(str(r.params["expect"]).upper(), _ACTIVE)) for r in rules)

    def nics(self, nid: str, ports: list[NicPort], now: int, owned: Owned) -> None:
        code_at = self._code
        judge = self.judge
        for rule, expect in self._expect:
            for port in ports:
                code = port[3][code_at]
                if code == expect:
                    if owned:
                        judge.good(owned, rule, port[0], now)
                    continue
                if not code:
                    continue  # 0: the state was not read, neither bad nor good
                comp, local, s, _, _ = port
                evidence = self.names.nic_evidence(
                    comp, s, state=s.state, state_code=code, phys_state=s.phys_state, operstate=s.netdev_operstate
                )
                self.bad_on(
                    nid, rule, comp, "nic", f"{comp} ({local}) is {s.state or code} / {s.phys_state}", evidence, now
                )


class NicCounter(NicCounterEvaluator):
    """NIC counters from one source, as a rate or a count in a window."""

    kind = "nic_counter"
    params = {
        "source": Param(one_of(NIC_SOURCES), required=True),
        "counters": Param(list_of(text), required=True),
        "threshold": THRESHOLD,
        "window": WINDOW,
        "saturated_fires": Param(boolean),
    }

    @classmethod
    def prepare(cls, params: dict[str, Any], defaults: Defaults, where: str, errors: list[str]) -> Derived:
        keys = tuple(f"{params['source']}/{c}" for c in params["counters"])
        return counters.prepare_threshold(params, where, errors, keys)

    def __init__(self, rules: tuple[Rule, ...], setup: Setup) -> None:
        super().__init__(rules, setup)
        self._rates = setup.rates
        self._defaults = setup.defaults

    def nic_counters(
        self, nid: str, comp: str, s: tpb.NicSample, samples: Mapping[str, RateSample] | None, now: int, owned: Owned
    ) -> None:
        if samples is None and not (owned and any((r.id, comp) in owned for r in self.rules)):
            return  # nothing moved and nothing open: no verdict can change
        for rule in self.rules:
            worst: tuple[float, bool, bool, str] | None = None
            stuck: str | None = None
            for key in rule.counter_keys:
                sample = samples.get(key) if samples else None
                measured = counters.measure(self._rates, rule, comp, key, sample, now)
                if measured is None:
                    continue
                if worst is None or counters.worse(measured, worst):
                    worst = (*measured, key)
                if measured[2] and stuck is None:
                    stuck = key
            window = None if rule.threshold_is_rate else (comp, rule.counter_keys)
            if worst is not None and counters.exceeds(rule, self._defaults, worst[:3]):
                value, saturated, _, counter = worst
                self.bad_on(
                    nid,
                    rule,
                    comp,
                    "nic",
                    counters.threshold_message(rule, f"{comp} {counter}", value, saturated),
                    self.names.nic_evidence(comp, s, **counters.threshold_evidence(rule, counter, value, saturated)),
                    now,
                    window=window,
                )
            elif stuck is not None:
                self._stuck(nid, rule, comp, s, stuck, now, window)
            elif owned and (rule.id, comp) in owned and rule.threshold_is_rate:
                self.judge.good(owned, rule, comp, now)
            # count rules resolve when their window empties (tick), not on one quiet report

    def _stuck(
        self,
        nid: str,
        rule: Rule,
        comp: str,
        s: tpb.NicSample,
        counter: str,
        now: int,
        window: tuple[str, tuple[str, ...]] | None,
    ) -> None:
        """A counter at its maximum since before the window: the info note, not the rule's verdict."""
        saturation = self._rates.saturation_of(counter)
        self.bad_on(
            nid,
            rule,
            comp,
            "nic",
            counters.stuck_message(f"{comp} {counter}", saturation, _CLEAR_PORT),
            self.names.nic_evidence(
                comp, s, **counters.stuck_evidence(counter, self._rates.last(comp, counter), saturation)
            ),
            now,
            severity=counters.STUCK_SEVERITY,
            action=counters.STUCK_ACTION,
            window=window,
        )


class NicRate(NicEvaluator):
    """An active NIC slower than nominal or than the node's fastest other rail."""

    kind = "nic_rate"
    params = {
        "nominal": Param(quantity("bandwidth", positive=True)),
        "compare_rails": Param(boolean, default=True),
    }

    @classmethod
    def prepare(cls, params: dict[str, Any], defaults: Defaults, where: str, errors: list[str]) -> Derived:
        if params.get("nominal") is None and not params.get("compare_rails", True):
            errors.append(f"{where}: kind 'nic_rate' needs 'nominal', 'compare_rails: true', or both")
        return Derived()

    @classmethod
    def reads(cls, rule: Rule) -> tuple[str, ...]:
        return ("state_code", "rate_gbps")

    def __init__(self, rules: tuple[Rule, ...], setup: Setup) -> None:
        super().__init__(rules, setup)
        self._code = setup.nic_fields["state_code"]
        self._rate = setup.nic_fields["rate_gbps"]

    def nics(self, nid: str, ports: list[NicPort], now: int, owned: Owned) -> None:
        code_at, rate_at = self._code, self._rate
        top = 0.0  # the fastest active rail (a port paired to a GPU rail)
        for port in ports:
            st = port[3]
            if port[4] and st[code_at] == _ACTIVE and st[rate_at] > top:
                top = st[rate_at]
        for rule in self.rules:
            nominal_q = rule.params.get("nominal")
            nominal = nominal_q.value if nominal_q is not None else 0.0
            compare = rule.params.get("compare_rails", True)
            for comp, _, s, st, on_rail in ports:
                if not on_rail:
                    continue
                code, rate = st[code_at], st[rate_at]
                bad = code == _ACTIVE and rate > 0 and ((nominal and rate < nominal) or (compare and rate < top))
                if bad:
                    expected = max(nominal, top if compare else 0.0)
                    self.bad_on(
                        nid,
                        rule,
                        comp,
                        "nic",
                        f"{comp} negotiated {rate:g} Gb/s, expected {expected:g} Gb/s",
                        self.names.nic_evidence(
                            comp,
                            s,
                            rate_gbps=rate,
                            nominal_gbps=nominal or None,
                            max_rail_gbps=top if compare else None,
                            unit="Gb/s",
                        ),
                        now,
                    )
                elif owned:
                    self.judge.good(owned, rule, comp, now)


class NicMissing(NicSetEvaluator):
    """An RDMA port of the node's inventory absent from the report (the NIC or its driver gone).

    The inventory is what the node registered with; ``starpulse scan --expect`` adds the ports
    it is expected to have, so one rule says "missing" for both."""

    kind = "nic_missing"

    def __init__(self, rules: tuple[Rule, ...], setup: Setup) -> None:
        super().__init__(rules, setup)
        # node -> (its inventory mapping, the same ports as (rdma_device, port) keys)
        self._ports: dict[str, tuple[Mapping[str, str], frozenset[tuple[str, int]]]] = {}
        self._shared: dict[frozenset[tuple[str, int]], frozenset[tuple[str, int]]] = {}

    def nic_set(self, nid: str, inventory: Mapping[str, str], report: tpb.Report, now: int, owned: Owned) -> None:
        nics = report.nics
        if not owned and self._inventory_keys(nid, inventory) <= set(map(_PORT_KEY, nics)):
            # Every port reported and nothing open to resolve: no verdict can change, whatever
            # the collector's status says. Asked first, with one C-level read per port, since it
            # is the answer for nearly every report (issue 31: the formatted names and the
            # status lookup below were ~5 % of a shard's time).
            return
        status = next((c for c in report.collectors if c.name == "nic"), None)
        if status is not None and status.supported and not status.ok:
            return  # the collector failed: absent ports are unknown, not missing (no RDMA tree at all: missing)
        if not nics and status is None:
            return  # a report without NIC data says nothing about NICs
        reported = {f"{n.rdma_device}/{n.port}" for n in nics}
        if not owned and inventory.keys() <= reported:
            return  # every port reported and nothing open to resolve: no verdict can change
        present = len(inventory.keys() & reported)
        for rule in self.rules:
            for local, comp in inventory.items():
                if local not in reported:
                    self.bad_on(
                        nid,
                        rule,
                        comp,
                        "nic",
                        f"{comp} ({local}): in the inventory but not in the report "
                        f"({present} of {len(inventory)} ports)",
                        {"port": local, "reported_ports": present, "inventory_ports": len(inventory)},
                        now,
                    )
                elif owned:
                    self.judge.good(owned, rule, comp, now)

    def _inventory_keys(self, nid: str, inventory: Mapping[str, str]) -> frozenset[tuple[str, int]]:
        """The inventory's ports as report keys, once per inventory (a new one after re-registration)."""
        cached = self._ports.get(nid)
        if cached is not None and cached[0] is inventory:
            return cached[1]
        keys = frozenset(_split_port(local) for local in inventory)
        keys = self._shared.setdefault(keys, keys)  # one set for every node with the same ports
        self._ports[nid] = (inventory, keys)
        return keys


_PORT_KEY = attrgetter("rdma_device", "port")


def _split_port(local: str) -> tuple[str, int]:
    """``"mlx5_0/1"`` -> ``("mlx5_0", 1)``; a name that is not one never matches a report's port."""
    device, _, port = local.rpartition("/")
    return (device, int(port)) if port.isdigit() else (local, -1)
