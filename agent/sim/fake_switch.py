"""A SONiC switch's Redis databases, for tests and the simulator.

Two ways in, both writing the real key layout into a real redis-server so the real
``SonicSwitchCollector`` runs unchanged:

* ``load_sonic_fixture`` loads the JSON dumps of APPL/COUNTERS/CONFIG/STATE_DB that
  sonic-utilities' test suite uses (real field names and shapes, odd values included).
* ``FakeSwitch`` writes a synthetic N-port switch whose counters grow with ``advance``
  and which takes faults: a port going down, a PFC storm, a degrading optic.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import redis
import structlog

from agent.collectors.sonic import APPL_DB, CONFIG_DB, COUNTERS_DB, STATE_DB

log = structlog.get_logger(__name__)

ClientFactory = Callable[[int], "redis.Redis"]

FIXTURE_FILES: dict[str, int] = {
    "appl_db.json": APPL_DB,
    "counters_db.json": COUNTERS_DB,
    "config_db.json": CONFIG_DB,
    "state_db.json": STATE_DB,
}
_WRAPPER_KEYS = frozenset({"expireat", "ttl", "type", "value"})


def _unwrap(value: Any) -> Any:
    """``{"expireat":…, "ttl":…, "type":"hash", "value":{…}}`` (sonic-db-dump) -> the inner dict."""
    if isinstance(value, Mapping) and "value" in value and set(value) <= _WRAPPER_KEYS:
        return value["value"]
    return value


def _field_value(value: Any) -> str:
    """Redis stores strings: lists the way swsscommon joins them, everything else as text."""
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if isinstance(value, Mapping):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _hset(target: Any, key: str, mapping: Mapping[str, str]) -> None:
    """HSET of a str mapping on a client or pipeline (redis-py's stubs want a wider key type)."""
    target.hset(key, mapping=dict(mapping))


def load_sonic_fixture(client_factory: ClientFactory, fixture_dir: str | Path, flush: bool = True) -> dict[str, int]:
    """Load the four SONiC DB dumps in ``fixture_dir`` into Redis as hashes; returns keys loaded per file.

    A field-less entry becomes ``{"NULL": "NULL"}``, as SONiC stores it (Redis has no
    empty hashes). Missing files are skipped; entries that are not objects are skipped.
    """
    loaded: dict[str, int] = {}
    for filename, db in FIXTURE_FILES.items():
        path = Path(fixture_dir) / filename
        if not path.is_file():
            log.info("sonic_fixture_missing", path=str(path))
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        client = client_factory(db)
        if flush:
            client.flushdb()
        pipe = client.pipeline(transaction=False)
        count = 0
        for key, raw in data.items():
            value = _unwrap(raw)
            if not isinstance(value, Mapping):
                log.debug("sonic_fixture_skip", file=filename, key=key, reason="not a hash")
                continue
            mapping = {str(f): _field_value(v) for f, v in value.items()} or {"NULL": "NULL"}
            _hset(pipe, key, mapping)
            count += 1
        pipe.execute()
        loaded[filename] = count
    counts = {k.removesuffix(".json"): v for k, v in loaded.items()}
    log.info("sonic_fixture_loaded", dir=str(fixture_dir), **counts)
    return loaded


class FakeSwitch:
    """A synthetic SONiC switch in Redis: ports Ethernet0, 4, 8, … with growing counters.

    Call ``install()`` once, then ``advance(dt_s)`` to move time and the fault methods to
    change state; each call writes through to Redis immediately.
    """

    DOM_RX_OK_DBM = -1.5
    DOM_TX_OK_DBM = 0.5
    RX_LOW_ALARM_DBM = -10.0
    DEGRADED_RX_DBM = -14.5

    def __init__(
        self,
        client_factory: ClientFactory,
        name: str = "leaf-b0-r0",
        *,
        ports: int = 8,
        speed_mbps: int = 400_000,
        queues: int = 8,
        lossless_queues: tuple[int, ...] = (3, 4),
        load: float = 0.5,
    ) -> None:
        if ports < 1 or queues < 1:
            raise ValueError("a fake switch needs at least one port and one queue")
        self._factory = client_factory
        self.name = name
        self.ports = [f"Ethernet{4 * i}" for i in range(ports)]
        self.speed_mbps = speed_mbps
        self.queues = queues
        self.lossless_queues = tuple(q for q in lossless_queues if q < queues)
        self.load = load
        self._oid = {p: f"oid:0x10000000000{i:03x}" for i, p in enumerate(self.ports)}
        self._qoid = {
            (p, q): f"oid:0x150000000{i * queues + q:05x}" for i, p in enumerate(self.ports) for q in range(queues)
        }
        self._oper = dict.fromkeys(self.ports, "up")
        self._storm: dict[str, int | None] = dict.fromkeys(self.ports)
        self._degraded: set[str] = set()
        self._port_ctr: dict[str, dict[str, float]] = {p: self._zero_port_counters() for p in self.ports}
        self._queue_ctr: dict[tuple[str, int], dict[str, float]] = {
            k: {
                "SAI_QUEUE_STAT_PACKETS": 0.0,
                "SAI_QUEUE_STAT_BYTES": 0.0,
                "SAI_QUEUE_STAT_DROPPED_PACKETS": 0.0,
                "SAI_QUEUE_STAT_DROPPED_BYTES": 0.0,
                "SAI_QUEUE_STAT_WRED_ECN_MARKED_PACKETS": 0.0,
                "PFC_WD_QUEUE_STATS_DEADLOCK_DETECTED": 0.0,
                "PFC_WD_QUEUE_STATS_DEADLOCK_RESTORED": 0.0,
            }
            for k in self._qoid
        }

    @staticmethod
    def _zero_port_counters() -> dict[str, float]:
        names = [
            "SAI_PORT_STAT_IF_IN_OCTETS",
            "SAI_PORT_STAT_IF_OUT_OCTETS",
            "SAI_PORT_STAT_IF_IN_UCAST_PKTS",
            "SAI_PORT_STAT_IF_OUT_UCAST_PKTS",
            "SAI_PORT_STAT_IF_IN_ERRORS",
            "SAI_PORT_STAT_IF_OUT_ERRORS",
            "SAI_PORT_STAT_IF_IN_DISCARDS",
            "SAI_PORT_STAT_IF_OUT_DISCARDS",
            "SAI_PORT_STAT_IF_IN_FEC_CORRECTABLE_FRAMES",
            "SAI_PORT_STAT_IF_IN_FEC_NOT_CORRECTABLE_FRAMES",
            "SAI_PORT_STAT_IF_IN_FEC_SYMBOL_ERRORS",
            "SAI_PORT_STAT_DOT3_STATS_FCS_ERRORS",
        ]
        names += [f"SAI_PORT_STAT_PFC_{p}_{d}_PKTS" for p in range(8) for d in ("RX", "TX")]
        return dict.fromkeys(names, 0.0)

    def _client(self, db: int) -> redis.Redis:
        return self._factory(db)

    # -- writing ---------------------------------------------------------------------------

    def install(self) -> None:
        """Write every table: name maps, counters, port state, DOM, config. Overwrites."""
        counters = self._client(COUNTERS_DB).pipeline(transaction=False)
        _hset(counters, "COUNTERS_PORT_NAME_MAP", self._oid)
        qoids = self._qoid.items()
        _hset(counters, "COUNTERS_QUEUE_NAME_MAP", {f"{p}:{q}": oid for (p, q), oid in qoids})
        _hset(counters, "COUNTERS_QUEUE_INDEX_MAP", {oid: str(q) for (_, q), oid in qoids})
        _hset(counters, "COUNTERS_QUEUE_PORT_MAP", {oid: self._oid[p] for (p, _), oid in qoids})
        _hset(counters, "COUNTERS_QUEUE_TYPE_MAP", dict.fromkeys(self._qoid.values(), "SAI_QUEUE_TYPE_UNICAST"))
        counters.execute()
        config = self._client(CONFIG_DB).pipeline(transaction=False)
        _hset(config, "DEVICE_METADATA|localhost", {"hostname": self.name, "hwsku": "starpulse-fake"})
        for i, port in enumerate(self.ports):
            _hset(
                config,
                f"PORT|{port}",
                {
                    "admin_status": "up",
                    "alias": f"etp{i + 1}",
                    "index": str(i),
                    "lanes": ",".join(str(4 * i + k) for k in range(4)),
                    "speed": str(self.speed_mbps),
                    "mtu": "9100",
                },
            )
            _hset(
                config,
                f"PFC_WD|{port}",
                {"action": "drop", "detection_time": "200", "restoration_time": "200"},
            )
        config.execute()
        for port in self.ports:
            self._write_port(port)

    def _write_port(self, port: str) -> None:
        i = self.ports.index(port)
        appl = self._client(APPL_DB)
        _hset(
            appl,
            f"PORT_TABLE:{port}",
            {
                "admin_status": "up",
                "oper_status": self._oper[port],
                "speed": str(self.speed_mbps),
                "alias": f"etp{i + 1}",
                "index": str(i),
                "lanes": ",".join(str(4 * i + k) for k in range(4)),
                "mtu": "9100",
            },
        )
        state = self._client(STATE_DB).pipeline(transaction=False)
        _hset(
            state,
            f"PORT_TABLE|{port}",
            {"state": "ok", "netdev_oper_status": self._oper[port], "speed": str(self.speed_mbps)},
        )
        rx = self.DEGRADED_RX_DBM if port in self._degraded else self.DOM_RX_OK_DBM
        dom: dict[str, str] = {"temperature": "41.5", "voltage": "3.30"}
        for lane in range(1, 5):
            dom[f"rx{lane}power"] = f"{rx:.4f}"
            dom[f"tx{lane}power"] = f"{self.DOM_TX_OK_DBM:.4f}"
            dom[f"tx{lane}bias"] = "6.7500"
        _hset(state, f"TRANSCEIVER_DOM_SENSOR|{port}", dom)
        _hset(
            state,
            f"TRANSCEIVER_DOM_THRESHOLD|{port}",
            {
                "temphighalarm": "75.0000",
                "templowalarm": "-5.0000",
                "rxpowerhighalarm": "3.4000",
                "rxpowerlowalarm": f"{self.RX_LOW_ALARM_DBM:.4f}",
                "txpowerhighalarm": "3.4000",
                "txpowerlowalarm": "-8.0000",
            },
        )
        state.execute()
        self._write_counters(port)

    def _write_counters(self, port: str) -> None:
        pipe = self._client(COUNTERS_DB).pipeline(transaction=False)
        port_values = {k: str(int(v)) for k, v in self._port_ctr[port].items()}
        _hset(pipe, f"COUNTERS:{self._oid[port]}", port_values)
        for q in range(self.queues):
            values: dict[str, str] = {k: str(int(v)) for k, v in self._queue_ctr[(port, q)].items()}
            if q in self.lossless_queues:
                values["PFC_WD_STATUS"] = "stormed" if self._storm[port] == q else "operational"
                values["PFC_WD_ACTION"] = "drop"
            else:
                for k in [k for k in values if k.startswith("PFC_WD_")]:
                    del values[k]
            _hset(pipe, f"COUNTERS:{self._qoid[(port, q)]}", values)
        pipe.execute()

    # -- time and faults -------------------------------------------------------------------

    def advance(self, dt_s: float) -> None:
        """Move time forward: traffic on up ports, errors on degraded optics, pauses in a storm."""
        if dt_s < 0:
            raise ValueError("time only moves forward")
        for port in self.ports:
            c = self._port_ctr[port]
            if self._oper[port] == "up":
                octets = self.speed_mbps * 1e6 / 8 * self.load * dt_s
                for d in ("IN", "OUT"):
                    c[f"SAI_PORT_STAT_IF_{d}_OCTETS"] += octets
                    c[f"SAI_PORT_STAT_IF_{d}_UCAST_PKTS"] += octets / 4096
                c["SAI_PORT_STAT_IF_IN_FEC_CORRECTABLE_FRAMES"] += 2 * dt_s
                for q in self.lossless_queues:
                    qc = self._queue_ctr[(port, q)]
                    qc["SAI_QUEUE_STAT_PACKETS"] += octets / 4096 / len(self.lossless_queues)
                    qc["SAI_QUEUE_STAT_BYTES"] += octets / len(self.lossless_queues)
                    qc["SAI_QUEUE_STAT_WRED_ECN_MARKED_PACKETS"] += 5 * dt_s
                if port in self._degraded:
                    c["SAI_PORT_STAT_IF_IN_ERRORS"] += 50 * dt_s
                    c["SAI_PORT_STAT_DOT3_STATS_FCS_ERRORS"] += 50 * dt_s
                    c["SAI_PORT_STAT_IF_IN_FEC_CORRECTABLE_FRAMES"] += 50_000 * dt_s
                    c["SAI_PORT_STAT_IF_IN_FEC_NOT_CORRECTABLE_FRAMES"] += 20 * dt_s
                    c["SAI_PORT_STAT_IF_IN_FEC_SYMBOL_ERRORS"] += 100_000 * dt_s
            storm_q = self._storm[port]
            if storm_q is not None:
                c[f"SAI_PORT_STAT_PFC_{storm_q}_RX_PKTS"] += 50_000 * dt_s
                self._queue_ctr[(port, storm_q)]["SAI_QUEUE_STAT_DROPPED_PACKETS"] += 10_000 * dt_s
            self._write_counters(port)

    def _check(self, port: str) -> None:
        if port not in self._oid:
            raise KeyError(f"{self.name} has no port {port!r} (ports: {self.ports[0]}..{self.ports[-1]})")

    def port_down(self, port: str) -> None:
        """The link drops (cable pulled, optic dead): oper_status down in APPL_DB and STATE_DB."""
        self._check(port)
        self._oper[port] = "down"
        self._write_port(port)

    def port_up(self, port: str) -> None:
        self._check(port)
        self._oper[port] = "up"
        self._write_port(port)

    def pfc_storm(self, port: str, on: bool = True, queue: int | None = None) -> None:
        """The PFC watchdog sees a storm on ``queue`` (first lossless queue by default), or it ends."""
        self._check(port)
        q = queue if queue is not None else (self.lossless_queues[0] if self.lossless_queues else 0)
        if q not in self.lossless_queues:
            raise ValueError(f"queue {q} has no PFC watchdog (lossless queues: {self.lossless_queues})")
        current = self._storm[port]
        if on and current != q:
            self._storm[port] = q
            self._queue_ctr[(port, q)]["PFC_WD_QUEUE_STATS_DEADLOCK_DETECTED"] += 1
        elif not on and current is not None:
            self._queue_ctr[(port, current)]["PFC_WD_QUEUE_STATS_DEADLOCK_RESTORED"] += 1
            self._storm[port] = None
        self._write_counters(port)

    def optics_degraded(self, port: str, on: bool = True) -> None:
        """Receive power falls below the low alarm; errors then grow with ``advance``."""
        self._check(port)
        if on:
            self._degraded.add(port)
        else:
            self._degraded.discard(port)
        self._write_port(port)

    def set_lldp_neighbor(self, port: str, system: str, remote_port: str) -> None:
        """What lldpd on the switch would publish for ``port`` (APPL_DB LLDP_ENTRY_TABLE)."""
        self._check(port)
        _hset(
            self._client(APPL_DB),
            f"LLDP_ENTRY_TABLE:{port}",
            {
                "lldp_rem_sys_name": system,
                "lldp_rem_port_id": remote_port,
                "lldp_rem_port_id_subtype": "7",
                "lldp_rem_port_desc": remote_port,
                "lldp_rem_chassis_id": "00:00:00:00:00:00",
            },
        )

    def clear_lldp_neighbor(self, port: str) -> None:
        self._check(port)
        self._client(APPL_DB).delete(f"LLDP_ENTRY_TABLE:{port}")
