"""The series of a switch port's sample, beside the SONiC collector (``sonic``) that reads it.

Labels: ``node`` (the switch) and ``port``. SAI port counters are exported raw under their
own names (two with better Prometheus names), PFC frames per direction and priority,
optics (DOM) per lane, numbered from 1 as SONiC's ``rx1power`` is.
"""

from __future__ import annotations

import re

from agent.collectors.exposition import Families, metric_part
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

SWITCH_LABELS = ("node", "port")

# SONiC SAI_PORT_STAT_* counters with a better Prometheus name; PFC counters are
# exported per priority (below) instead of one series each.
SAI_RENAMES = {
    "SAI_PORT_STAT_IF_IN_OCTETS": "starpulse_switch_port_receive_bytes_total",
    "SAI_PORT_STAT_IF_OUT_OCTETS": "starpulse_switch_port_transmit_bytes_total",
}
_SAI_PFC_RE = re.compile(r"^SAI_PORT_STAT_PFC_\d+_(RX|TX)_PKTS$")
STORMED = "stormed"


def export(f: Families, node: str, report: tpb.Report, inventory: ipb.Inventory) -> None:
    """Every switch port of ``report``."""
    for sp in report.switch_ports:
        _switch_port(f, node, sp)


def _switch_port(f: Families, node: str, s: tpb.SwitchPortSample) -> None:
    lv = [node, s.port]
    L = SWITCH_LABELS
    if s.oper_status:
        f.gauge(
            "starpulse_switch_port_oper_up",
            "1 when the port's oper status is up.",
            L,
            lv,
            1 if s.oper_status == "up" else 0,
        )
    if s.admin_status:
        f.gauge(
            "starpulse_switch_port_admin_up",
            "1 when the port is admin up.",
            L,
            lv,
            1 if s.admin_status == "up" else 0,
        )
    if s.speed_mbps:
        f.gauge("starpulse_switch_port_speed_bytes_per_second", "Configured port speed.", L, lv, s.speed_mbps * 1e6 / 8)
    for key, value in sorted(s.counters.items()):
        if _SAI_PFC_RE.match(key):
            continue
        name = SAI_RENAMES.get(key) or f"starpulse_switch_port_{metric_part(key.removeprefix('SAI_PORT_STAT_'))}_total"
        f.counter(name, f"SONiC port counter {key} (raw).", L, lv, value)
    for direction, values in (("rx", s.pfc_rx), ("tx", s.pfc_tx)):
        for prio, value in enumerate(values):
            f.counter(
                "starpulse_switch_port_pfc_frames_total",
                "PFC frames, by direction and priority.",
                (*L, "direction", "priority"),
                [*lv, direction, str(prio)],
                value,
            )
    if s.pfc_wd_status:
        f.gauge(
            "starpulse_switch_port_pfc_watchdog_stormed_queues",
            "Queues the PFC watchdog currently reports as stormed.",
            L,
            lv,
            sum(1 for st in s.pfc_wd_status if st == STORMED),
        )
        f.counter(
            "starpulse_switch_port_pfc_watchdog_deadlocks_total",
            "PFC watchdog deadlocks detected, summed over the port's queues.",
            L,
            lv,
            s.pfc_wd_deadlocks,
        )
    f.counter(
        "starpulse_switch_port_queue_dropped_packets_total",
        "Packets dropped, summed over the port's queues.",
        L,
        lv,
        s.queue_drops,
    )
    f.counter(
        "starpulse_switch_port_ecn_marked_packets_total",
        "Packets ECN-marked by WRED, summed over the port's queues.",
        L,
        lv,
        s.ecn_marked,
    )
    if s.HasField("optic_temperature_c"):
        f.gauge(
            "starpulse_switch_port_optic_temperature_celsius",
            "Transceiver temperature (DOM).",
            L,
            lv,
            s.optic_temperature_c,
        )
    # Lanes are numbered from 1 as SONiC's rx1power..rx8power are.
    for direction, powers in (("rx", s.optic_rx_power_dbm), ("tx", s.optic_tx_power_dbm)):
        for lane, power in enumerate(powers, start=1):
            f.gauge(
                f"starpulse_switch_port_optic_{direction}_power_dbm",
                f"Transceiver {direction.upper()} optical power per lane (DOM), in dBm.",
                (*L, "lane"),
                [*lv, str(lane)],
                power,
            )
    for field, name, doc in (
        (
            "optic_temp_high_alarm_c",
            "starpulse_switch_port_optic_temperature_high_alarm_celsius",
            "Transceiver high-temperature alarm threshold.",
        ),
        (
            "optic_temp_low_alarm_c",
            "starpulse_switch_port_optic_temperature_low_alarm_celsius",
            "Transceiver low-temperature alarm threshold.",
        ),
        (
            "optic_rx_power_high_alarm_dbm",
            "starpulse_switch_port_optic_rx_power_high_alarm_dbm",
            "Transceiver RX power high alarm threshold, in dBm.",
        ),
        (
            "optic_rx_power_low_alarm_dbm",
            "starpulse_switch_port_optic_rx_power_low_alarm_dbm",
            "Transceiver RX power low alarm threshold, in dBm.",
        ),
        (
            "optic_tx_power_high_alarm_dbm",
            "starpulse_switch_port_optic_tx_power_high_alarm_dbm",
            "Transceiver TX power high alarm threshold, in dBm.",
        ),
        (
            "optic_tx_power_low_alarm_dbm",
            "starpulse_switch_port_optic_tx_power_low_alarm_dbm",
            "Transceiver TX power low alarm threshold, in dBm.",
        ),
    ):
        if s.HasField(field):
            f.gauge(name, doc, L, lv, getattr(s, field))
