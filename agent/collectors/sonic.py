"""SONiC switch ports from the switch's own Redis databases.

On a SONiC switch every counter the ASIC exposes is already polled into Redis by
orchagent/syncd (port counters every 1 s, queue counters every 10 s), so the agent
reads Redis instead of the CLI: one pipelined round trip per database per cycle, no
subprocesses. Counters are shipped raw and cumulative (the controller computes rates);
the only local judgement is a port leaving or re-entering oper "up" and a PFC watchdog
queue becoming "stormed", the two things worth an immediate event.

Key layout (``database_config.json``): APPL_DB 0 and COUNTERS_DB 2 use ``:``,
CONFIG_DB 4 and STATE_DB 6 use ``|``.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis
import structlog

from starpulse.core import vocab
from starpulse.core.findings import Finding
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

SOURCE = "sonic"
APPL_DB = 0
COUNTERS_DB = 2
CONFIG_DB = 4
STATE_DB = 6
SEPARATOR = {APPL_DB: ":", COUNTERS_DB: ":", CONFIG_DB: "|", STATE_DB: "|"}
REDIS_SOCKET = "/var/run/redis/redis.sock"

PFC_PRIORITIES = 8
DOM_LANES = 8
STORMED = "stormed"
_U64_MAX = (1 << 64) - 1
# APPL_DB PORT_TABLE also holds these markers, which are not ports.
_PORT_TABLE_MARKERS = frozenset({"PortConfigDone", "PortInitDone", "PortInitCompleted"})
# Ports SONiC's CLI hides: inband, recirculation and internal (ASIC-to-ASIC) ports.
_INTERNAL_ROLES = frozenset({"Int", "Inb", "Rec"})
_NUM_RE = re.compile(r"(\d+)")
_DOM_TABLES = ("TRANSCEIVER_DOM_SENSOR", "TRANSCEIVER_DOM_THRESHOLD")

RedisFactory = Callable[[int], "redis.Redis"]


def default_redis_factory(db: int) -> redis.Redis:
    """A client for SONiC database ``db``: the unix socket when present, else 127.0.0.1:6379."""
    common: dict[str, Any] = {"db": db, "decode_responses": True, "socket_timeout": 5.0}
    if os.path.exists(REDIS_SOCKET):
        return redis.Redis(unix_socket_path=REDIS_SOCKET, **common)
    return redis.Redis(host="127.0.0.1", port=6379, **common)


def port_sort_key(name: str) -> tuple[Any, ...]:
    """Natural order: Ethernet4 before Ethernet12."""
    return tuple(int(p) if p.isdigit() else p for p in _NUM_RE.split(name))


def _s(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _hash(raw: Any) -> dict[str, str]:
    """A HGETALL result as str -> str, whatever the client's decode setting."""
    if not isinstance(raw, Mapping):
        return {}
    return {_s(k): _s(v) for k, v in raw.items()}


def parse_u64(value: str | None) -> int | None:
    """A counter value as a non-negative int; None for anything else ("N/A", "", floats)."""
    if value is None:
        return None
    try:
        n = int(value.strip())
    except (ValueError, AttributeError):
        return None
    return n if 0 <= n <= _U64_MAX else None


def parse_float(value: str | None) -> float | None:
    """A DOM reading; None for "N/A", "-inf", "nan" and other non-finite or unparsable values."""
    if value is None:
        return None
    try:
        f = float(value)
    except (ValueError, TypeError):
        return None
    return f if math.isfinite(f) else None


def _lane_count(lanes: str | None) -> int:
    if not lanes:
        return 0
    return len([x for x in lanes.split(",") if x.strip()])


@dataclass(frozen=True)
class _PortState:
    oper: str
    admin: str


class SonicSwitchCollector:
    """Port, queue, PFC-watchdog and transceiver telemetry of one SONiC switch.

    ``redis_factory(db_id)`` returns a client for that database; it is the seam tests
    use to point the collector at a real local redis-server. Clients are created once.
    """

    name = "switch"

    def __init__(self, redis_factory: RedisFactory | None = None, switch_name: str = "") -> None:
        self._factory = redis_factory or default_redis_factory
        self.switch_name = switch_name
        self._clients: dict[int, redis.Redis] = {}
        self._ports: dict[str, _PortState] = {}
        self._wd: dict[tuple[str, str], str] = {}
        self._lldp_last: list[bytes] | None = None

    # -- plumbing --------------------------------------------------------------------------

    def _db(self, db: int) -> redis.Redis:
        client = self._clients.get(db)
        if client is None:
            client = self._factory(db)
            self._clients[db] = client
        return client

    def _hgetall_many(self, db: int, keys: list[str]) -> list[dict[str, str]]:
        """HGETALL of many keys in one round trip; a missing key gives {}."""
        if not keys:
            return []
        pipe = self._db(db).pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(key)
        return [_hash(r) for r in pipe.execute()]

    def _hgetall(self, db: int, key: str) -> dict[str, str]:
        return _hash(self._db(db).hgetall(key))

    def _table_keys(self, db: int, table: str) -> list[str]:
        """Entry names of ``table`` (the part after ``TABLE<sep>``), naturally sorted."""
        prefix = table + SEPARATOR[db]
        names = {_s(k)[len(prefix) :] for k in self._db(db).scan_iter(match=prefix + "*", count=1000)}
        return sorted(names, key=port_sort_key)

    # -- Collector protocol ----------------------------------------------------------------

    def supported(self) -> bool:
        """A SONiC COUNTERS_DB is reachable and has a port name map."""
        try:
            return bool(self._db(COUNTERS_DB).exists("COUNTERS_PORT_NAME_MAP"))
        except (redis.RedisError, OSError) as exc:
            log.info("sonic_unsupported", switch=self.switch_name, error=str(exc))
            return False

    def describe(self, inventory: ipb.Inventory) -> None:
        """Front-panel ports (APPL_DB PORT_TABLE, CONFIG_DB PORT as fallback) and LLDP neighbours."""
        appl_names = [n for n in self._table_keys(APPL_DB, "PORT_TABLE") if n not in _PORT_TABLE_MARKERS]
        config_names = self._table_keys(CONFIG_DB, "PORT")
        names = sorted(set(appl_names) | set(config_names), key=port_sort_key)
        appl = dict(zip(names, self._hgetall_many(APPL_DB, [f"PORT_TABLE:{n}" for n in names]), strict=True))
        config = dict(zip(names, self._hgetall_many(CONFIG_DB, [f"PORT|{n}" for n in names]), strict=True))
        for name in names:
            a, c = appl[name], config[name]
            if (a.get("role") or c.get("role")) in _INTERNAL_ROLES:
                continue
            speed = parse_u64(a.get("speed")) or parse_u64(c.get("speed")) or 0
            inventory.switch_ports.append(
                ipb.SwitchPortInfo(
                    name=name,
                    speed_mbps=speed,
                    alias=a.get("alias") or c.get("alias") or "",
                    lanes=_lane_count(a.get("lanes")) or _lane_count(c.get("lanes")),
                )
            )
        inventory.lldp_neighbors.extend(self._lldp_neighbors())

    def collect(self, report: tpb.Report) -> list[Finding]:
        """One SwitchPortSample per port in COUNTERS_PORT_NAME_MAP; findings for transitions."""
        port_oids = self._hgetall(COUNTERS_DB, "COUNTERS_PORT_NAME_MAP")
        ports = sorted(port_oids, key=port_sort_key)
        queues = self._queues_by_port()

        port_counters = self._hgetall_many(COUNTERS_DB, [f"COUNTERS:{port_oids[p]}" for p in ports])
        queue_keys = [(p, idx, oid) for p in ports for idx, oid in queues.get(p, [])]
        queue_counters = self._hgetall_many(COUNTERS_DB, [f"COUNTERS:{oid}" for _, _, oid in queue_keys])
        appl = self._hgetall_many(APPL_DB, [f"PORT_TABLE:{p}" for p in ports])
        state_keys = [f"{table}|{p}" for p in ports for table in ("PORT_TABLE", *_DOM_TABLES)]
        state = self._hgetall_many(STATE_DB, state_keys)
        config = self._hgetall_many(CONFIG_DB, [f"PORT|{p}" for p in ports])

        by_port_queues: dict[str, list[tuple[str, dict[str, str]]]] = {}
        for (port, idx, _oid), values in zip(queue_keys, queue_counters, strict=True):
            by_port_queues.setdefault(port, []).append((idx, values))

        findings: list[Finding] = []
        for i, port in enumerate(ports):
            sample = report.switch_ports.add(port=port)
            st_port, dom, thresholds = state[3 * i], state[3 * i + 1], state[3 * i + 2]
            oper, admin = self._fill_status(sample, appl[i], st_port, config[i])
            self._fill_counters(sample, port_counters[i])
            wd = self._fill_queues(sample, by_port_queues.get(port, []))
            self._fill_dom(sample, dom, thresholds)
            findings += self._port_transition(port, oper, admin)
            findings += self._wd_transitions(port, wd)

        gone = set(self._ports) - set(ports)
        for port in gone:
            del self._ports[port]
        self._wd = {k: v for k, v in self._wd.items() if k[0] not in gone}

        neighbours = self._lldp_neighbors()
        fingerprint = [n.SerializeToString(deterministic=True) for n in neighbours]
        if fingerprint != self._lldp_last:
            report.lldp.SetInParent()
            report.lldp.neighbors.extend(neighbours)
            self._lldp_last = fingerprint
        return findings

    def close(self) -> None:
        """Close the Redis connections. Idempotent."""
        clients, self._clients = self._clients, {}
        for client in clients.values():
            with contextlib.suppress(redis.RedisError, OSError):
                client.close()

    # -- pieces of a sample ----------------------------------------------------------------

    def _queues_by_port(self) -> dict[str, list[tuple[str, str]]]:
        """COUNTERS_QUEUE_NAME_MAP ("Ethernet0:3" -> oid) grouped by port, queues in index order."""
        out: dict[str, list[tuple[str, str]]] = {}
        for name, oid in self._hgetall(COUNTERS_DB, "COUNTERS_QUEUE_NAME_MAP").items():
            port, sep, idx = name.rpartition(":")
            if sep and idx.isdigit():
                out.setdefault(port, []).append((idx, oid))
        for entries in out.values():
            entries.sort(key=lambda e: int(e[0]))
        return out

    @staticmethod
    def _fill_status(
        sample: tpb.SwitchPortSample, appl: dict[str, str], state: dict[str, str], config: dict[str, str]
    ) -> tuple[str, str]:
        oper = appl.get("oper_status") or state.get("oper_status") or state.get("netdev_oper_status") or ""
        admin = appl.get("admin_status") or state.get("admin_status") or config.get("admin_status") or ""
        sample.oper_status = oper
        sample.admin_status = admin
        speed = next((v for d in (appl, state, config) if (v := parse_u64(d.get("speed")))), None)
        if speed:
            sample.speed_mbps = speed
        return oper, admin

    @staticmethod
    def _fill_counters(sample: tpb.SwitchPortSample, counters: dict[str, str]) -> None:
        parsed: dict[str, int] = {}
        for key, raw in counters.items():
            if key.startswith("SAI_PORT_STAT_"):
                value = parse_u64(raw)
                if value is not None:
                    parsed[key] = value
        sample.counters.update(parsed)
        rx = [parsed.get(f"SAI_PORT_STAT_PFC_{p}_RX_PKTS") for p in range(PFC_PRIORITIES)]
        tx = [parsed.get(f"SAI_PORT_STAT_PFC_{p}_TX_PKTS") for p in range(PFC_PRIORITIES)]
        if any(v is not None for v in rx):
            sample.pfc_rx.extend(v or 0 for v in rx)
        if any(v is not None for v in tx):
            sample.pfc_tx.extend(v or 0 for v in tx)

    @staticmethod
    def _fill_queues(sample: tpb.SwitchPortSample, queues: list[tuple[str, dict[str, str]]]) -> dict[str, str]:
        """Queue sums into the sample; returns queue index -> PFC watchdog status."""
        drops = ecn = deadlocks = 0
        wd: dict[str, str] = {}
        for idx, values in queues:
            drops += parse_u64(values.get("SAI_QUEUE_STAT_DROPPED_PACKETS")) or 0
            ecn += parse_u64(values.get("SAI_QUEUE_STAT_WRED_ECN_MARKED_PACKETS")) or 0
            deadlocks += parse_u64(values.get("PFC_WD_QUEUE_STATS_DEADLOCK_DETECTED")) or 0
            status = values.get("PFC_WD_STATUS")
            if status:
                wd[idx] = status
                sample.pfc_wd_status.append(status)
        sample.queue_drops = min(drops, _U64_MAX)
        sample.ecn_marked = min(ecn, _U64_MAX)
        sample.pfc_wd_deadlocks = min(deadlocks, _U64_MAX)
        return wd

    @staticmethod
    def _fill_dom(sample: tpb.SwitchPortSample, dom: dict[str, str], thresholds: dict[str, str]) -> None:
        temp = parse_float(dom.get("temperature"))
        if temp is not None:
            sample.optic_temperature_c = temp
        for lane in range(1, DOM_LANES + 1):
            rx = parse_float(dom.get(f"rx{lane}power"))
            if rx is not None:
                sample.optic_rx_power_dbm.append(rx)
            tx = parse_float(dom.get(f"tx{lane}power"))
            if tx is not None:
                sample.optic_tx_power_dbm.append(tx)
        for field, key in (
            ("optic_temp_high_alarm_c", "temphighalarm"),
            ("optic_temp_low_alarm_c", "templowalarm"),
            ("optic_rx_power_high_alarm_dbm", "rxpowerhighalarm"),
            ("optic_rx_power_low_alarm_dbm", "rxpowerlowalarm"),
            ("optic_tx_power_high_alarm_dbm", "txpowerhighalarm"),
            ("optic_tx_power_low_alarm_dbm", "txpowerlowalarm"),
        ):
            value = parse_float(thresholds.get(key))
            if value is not None:
                setattr(sample, field, value)

    # -- transitions -----------------------------------------------------------------------

    def _finding(self, kind: str, port: str, severity: str, action: str, message: str, **attrs: str) -> Finding:
        attributes = {"switch": self.switch_name, **attrs} if self.switch_name else dict(attrs)
        return Finding(
            kind=kind,
            component=port,
            severity=severity,
            action=action,
            message=message,
            source=SOURCE,
            attributes=attributes,
        )

    def _port_transition(self, port: str, oper: str, admin: str) -> list[Finding]:
        """Oper up->down / down->up; a port first seen down while admin up is reported too.

        A port an operator shut (admin down) is reported as info: it is intended.
        """
        if oper not in ("up", "down"):
            return []  # unknown this cycle: keep the previous state
        prev = self._ports.get(port)
        self._ports[port] = _PortState(oper, admin)
        who = f"{self.switch_name} {port}" if self.switch_name else port
        if oper == "down" and ((prev is not None and prev.oper == "up") or (prev is None and admin == "up")):
            if admin == "down":
                return [
                    self._finding("switch_port_down", port, "info", vocab.ACTION_NONE, f"{who} administratively down")
                ]
            log.warning("switch_port_down", switch=self.switch_name, port=port)
            return [
                self._finding("switch_port_down", port, "critical", vocab.ACTION_CHECK_LINK, f"{who} oper status down")
            ]
        if oper == "up" and prev is not None and prev.oper == "down":
            log.info("switch_port_up", switch=self.switch_name, port=port)
            return [self._finding("switch_port_up", port, "info", vocab.ACTION_NONE, f"{who} oper status up")]
        return []

    def _wd_transitions(self, port: str, wd: dict[str, str]) -> list[Finding]:
        """A queue entering "stormed" (or already stormed when first seen), and its restore."""
        out: list[Finding] = []
        who = f"{self.switch_name} {port}" if self.switch_name else port
        for idx, status in wd.items():
            prev = self._wd.get((port, idx))
            self._wd[(port, idx)] = status
            if status == STORMED and prev != STORMED:
                log.warning("pfc_storm", switch=self.switch_name, port=port, queue=idx)
                out.append(
                    self._finding(
                        "pfc_storm",
                        port,
                        "critical",
                        vocab.ACTION_CHECK_LINK,
                        f"{who} queue {idx}: PFC watchdog detected a storm",
                        queue=idx,
                    )
                )
            elif prev == STORMED and status != STORMED:
                log.info("pfc_storm_restored", switch=self.switch_name, port=port, queue=idx)
                out.append(
                    self._finding(
                        "pfc_storm",
                        port,
                        "info",
                        vocab.ACTION_NONE,
                        f"{who} queue {idx}: PFC storm over ({status})",
                        queue=idx,
                    )
                )
        return out

    # -- LLDP ------------------------------------------------------------------------------

    def _lldp_neighbors(self) -> list[ipb.LldpNeighbor]:
        """APPL_DB LLDP_ENTRY_TABLE, one neighbour per local port; [] when lldp is not running."""
        names = self._table_keys(APPL_DB, "LLDP_ENTRY_TABLE")
        entries = self._hgetall_many(APPL_DB, [f"LLDP_ENTRY_TABLE:{n}" for n in names])
        return [
            ipb.LldpNeighbor(
                local_interface=name,
                chassis_name=e.get("lldp_rem_sys_name", ""),
                chassis_id=e.get("lldp_rem_chassis_id", ""),
                port_id=e.get("lldp_rem_port_id", ""),
                port_description=e.get("lldp_rem_port_desc", ""),
                management_address=e.get("lldp_rem_man_addr", ""),
            )
            for name, e in zip(names, entries, strict=True)
            if e
        ]


def lldp_observations(neighbours: Iterable[ipb.LldpNeighbor]) -> list[tuple[str, str, str]]:
    """(local port, remote system, remote port) triples, the form fabric reconcile takes."""
    return [(n.local_interface, n.chassis_name, n.port_id) for n in neighbours]
