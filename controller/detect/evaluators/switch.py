"""Switch port rule kinds: a port down while meant up, a PFC watchdog storm, optics out of range.

A switch port is named as its cable when the fabric knows what it connects to, else as
the port itself (the engine's ``Names.port_component``).
"""

from __future__ import annotations

from abc import ABC
from typing import Any

from controller.detect.evaluators.base import Owned, SwitchPortEvaluator
from controller.detect.evaluators.params import EVENTS, Param, list_of, one_of
from controller.detect.model import Rule
from starpulse.v1 import telemetry_pb2 as tpb

OPTICS_CHECKS = ("temperature", "rx_power", "tx_power")


class _PortKind(SwitchPortEvaluator, ABC):
    """What the switch port kinds share: naming the port (or its cable) in what they say."""

    def bad_port(self, rule: Rule, nid: str, p: tpb.SwitchPortSample, message: str, now: int, **evidence: Any) -> None:
        comp, ctype, peer = self.names.port_component(nid, p.port)
        self.judge.bad(rule, comp, ctype, None, nid, message, port_evidence(nid, p, peer, **evidence), now)

    def good_port(self, owned: Owned, rule: Rule, nid: str, p: tpb.SwitchPortSample, now: int) -> None:
        self.judge.good(owned, rule, self.names.port_component(nid, p.port)[0], now)


class SwitchPortState(_PortKind):
    """A switch port operationally down while administratively up."""

    kind = "switch_port_state"
    params = {"events": EVENTS}

    def port(self, nid: str, p: tpb.SwitchPortSample, now: int, owned: Owned) -> None:
        if p.oper_status not in ("up", "down"):
            return  # not read: neither bad nor good
        bad = p.oper_status == "down" and p.admin_status == "up"  # admin down is an operator's choice
        for rule in self.rules:
            if bad:
                message = f"{nid} {p.port} oper down (admin up)"
                self.bad_port(rule, nid, p, message, now, oper_status=p.oper_status, admin_status=p.admin_status)
            elif owned:
                self.good_port(owned, rule, nid, p, now)


class PfcWatchdog(_PortKind):
    """A PFC watchdog queue in "stormed"."""

    kind = "switch_pfc_watchdog"
    params = {"events": EVENTS}

    def port(self, nid: str, p: tpb.SwitchPortSample, now: int, owned: Owned) -> None:
        stormed = [i for i, st in enumerate(p.pfc_wd_status) if st == "stormed"]
        for rule in self.rules:
            if stormed:
                message = f"{nid} {p.port}: PFC watchdog stormed on queue(s) {', '.join(map(str, stormed))}"
                self.bad_port(rule, nid, p, message, now, stormed_queues=stormed, deadlocks=p.pfc_wd_deadlocks)
            elif owned and p.pfc_wd_status:  # a port without a watchdog says nothing
                self.good_port(owned, rule, nid, p, now)


class SwitchOptics(_PortKind):
    """Transceiver DOM readings outside the module's own alarm thresholds."""

    kind = "switch_optics"
    params = {"checks": Param(list_of(one_of(OPTICS_CHECKS)), default=OPTICS_CHECKS)}

    def port(self, nid: str, p: tpb.SwitchPortSample, now: int, owned: Owned) -> None:
        if not (p.HasField("optic_temperature_c") or p.optic_rx_power_dbm or p.optic_tx_power_dbm):
            return  # no optic readings (a DAC cable, or not read): neither bad nor good
        for rule in self.rules:
            faults = optic_faults(p, rule.params["checks"])
            if faults:
                message = f"{nid} {p.port} optics out of range: " + "; ".join(f["text"] for f in faults)
                self.bad_port(rule, nid, p, message, now, faults=faults)
            elif owned:
                self.good_port(owned, rule, nid, p, now)


def port_evidence(switch: str, p: tpb.SwitchPortSample, peer: str | None, **extra: Any) -> dict[str, Any]:
    evidence: dict[str, Any] = {"switch": switch, "port": p.port}
    if peer is not None:
        evidence["peer"] = peer
    evidence.update(extra)
    return evidence


def optic_faults(p: tpb.SwitchPortSample, checks: tuple[str, ...]) -> list[dict[str, Any]]:
    """Readings outside the module's own alarm thresholds (a missing threshold is not checked)."""
    faults: list[dict[str, Any]] = []

    def check(what: str, value: float, lane: int | None, low: float | None, high: float | None, unit: str) -> None:
        where = what if lane is None else f"{what} lane {lane}"
        if high is not None and value > high:
            faults.append(
                {
                    "check": what,
                    "lane": lane,
                    "value": value,
                    "limit": high,
                    "unit": unit,
                    "text": f"{where} {value:g}{unit} above {high:g}{unit}",
                }
            )
        elif low is not None and value < low:
            faults.append(
                {
                    "check": what,
                    "lane": lane,
                    "value": value,
                    "limit": low,
                    "unit": unit,
                    "text": f"{where} {value:g}{unit} below {low:g}{unit}",
                }
            )

    def opt(fld: str) -> float | None:
        return getattr(p, fld) if p.HasField(fld) else None

    if "temperature" in checks and p.HasField("optic_temperature_c"):
        check(
            "temperature",
            p.optic_temperature_c,
            None,
            opt("optic_temp_low_alarm_c"),
            opt("optic_temp_high_alarm_c"),
            "C",
        )
    if "rx_power" in checks:
        low, high = opt("optic_rx_power_low_alarm_dbm"), opt("optic_rx_power_high_alarm_dbm")
        for lane, v in enumerate(p.optic_rx_power_dbm, start=1):
            check("rx_power", v, lane, low, high, "dBm")
    if "tx_power" in checks:
        low, high = opt("optic_tx_power_low_alarm_dbm"), opt("optic_tx_power_high_alarm_dbm")
        for lane, v in enumerate(p.optic_tx_power_dbm, start=1):
            check("tx_power", v, lane, low, high, "dBm")
    return faults
