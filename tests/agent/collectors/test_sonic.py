"""SonicSwitchCollector against a real redis-server holding SONiC's databases.

Two sources of switch state: the sonic-utilities mock tables (../shared/fixtures/sonic, real
field names and values, read in place; those tests skip where it is absent) and FakeSwitch
(synthetic, with fault injection), which covers the same collector behaviour in any clone.
Expected values of the recorded tables are read from their JSON by hand and written out literally.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from agent.collectors.base import Collector
from agent.collectors.sonic import (
    APPL_DB,
    CONFIG_DB,
    COUNTERS_DB,
    STATE_DB,
    SonicSwitchCollector,
    lldp_observations,
    parse_float,
    parse_u64,
)
from agent.sim.fake_switch import FakeSwitch, load_sonic_fixture
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb
from tests.helpers import free_port, shared_fixture

REDIS_SERVER = shutil.which("redis-server") or (
    "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
)

Factory = Callable[[int], redis.Redis]


@pytest.fixture(scope="module")
def redis_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A throwaway redis-server on 127.0.0.1, no persistence, killed at teardown."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server binary not found (apt-get install redis-server)")
    workdir = tmp_path_factory.mktemp("redis")
    port = free_port()
    proc = subprocess.Popen(
        [
            REDIS_SERVER,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            str(workdir),
            "--databases",
            "16",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=workdir,
    )
    try:
        client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1)
        deadline = time.monotonic() + 10
        while True:
            try:
                if client.ping():
                    break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start on port {port}") from None
                time.sleep(0.05)
        client.close()
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def factory(redis_port: int) -> Iterator[Factory]:
    """Clients per SONiC db id on the test server; every db is flushed first."""
    clients: dict[int, redis.Redis] = {}

    def make(db: int) -> redis.Redis:
        if db not in clients:
            clients[db] = redis.Redis(host="127.0.0.1", port=redis_port, db=db, decode_responses=True)
        return clients[db]

    make(0).flushall()
    yield make
    for c in clients.values():
        c.close()


@pytest.fixture
def recorded() -> Path:
    """The recorded SONiC databases (skips the test where ../shared is absent)."""
    return shared_fixture("sonic")


@pytest.fixture
def fixture_collector(factory: Factory, recorded: Path) -> Iterator[SonicSwitchCollector]:
    load_sonic_fixture(factory, recorded)
    c = SonicSwitchCollector(factory, "sonic-fixture")
    yield c
    c.close()


def _collect(c: SonicSwitchCollector) -> tuple[tpb.Report, dict[str, tpb.SwitchPortSample], list]:
    report = tpb.Report()
    findings = c.collect(report)
    return report, {s.port: s for s in report.switch_ports}, findings


def assert_bad_at_start_reported_once(c: SonicSwitchCollector) -> None:
    """Ethernet0 down while admin up, queue 3 of Ethernet0 and 4 of Ethernet8 stormed: found on the first cycle only."""
    _, _, findings = _collect(c)
    got = sorted((f.kind, f.component, f.severity, f.attributes.get("queue", "")) for f in findings)
    assert got == [
        ("pfc_storm", "Ethernet0", "critical", "3"),
        ("pfc_storm", "Ethernet8", "critical", "4"),
        ("switch_port_down", "Ethernet0", "critical", ""),
    ]
    assert all(f.source == "sonic" and f.attributes["switch"] == c.switch_name for f in findings)
    assert all(f.action == "check_link" for f in findings)
    _, _, again = _collect(c)
    assert again == []


class TestParsers:
    def test_u64_rejects_non_counters(self):
        """Counter parsing keeps non-negative integers and drops N/A, floats and negatives."""
        assert parse_u64("42") == 42
        assert parse_u64(" 7 ") == 7
        for bad in ("N/A", "", "1.5", "-3", None, str(1 << 64)):
            assert parse_u64(bad) is None

    def test_float_skips_non_finite(self):
        """DOM parsing keeps finite readings and drops N/A, -inf and nan."""
        assert parse_float("30.9258") == pytest.approx(30.9258)
        assert parse_float("-13.5067") == pytest.approx(-13.5067)
        for bad in ("N/A", "-inf", "inf", "nan", "", None):
            assert parse_float(bad) is None


class TestLoadSonicFixture:
    def test_loads_hashes_into_the_sonic_db_ids(self, factory, recorded):
        """Each dump lands in its SONiC db id with the JSON's field values."""
        counts = load_sonic_fixture(factory, recorded)
        assert counts == {
            "appl_db.json": 78,
            "counters_db.json": 366,
            "config_db.json": 618,
            "state_db.json": 192,
        }
        assert factory(COUNTERS_DB).hget("COUNTERS_PORT_NAME_MAP", "Ethernet0") == "oid:0x1000000000012"
        assert factory(STATE_DB).hget("TRANSCEIVER_DOM_SENSOR|Ethernet0", "temperature") == "30.9258"
        assert factory(APPL_DB).hget("PORT_TABLE:Ethernet0", "oper_status") == "down"

    def test_unwraps_dump_format_and_joins_lists(self, factory, recorded):
        """sonic-db-dump wrappers are unwrapped, lists are comma-joined, empty entries become NULL."""
        load_sonic_fixture(factory, recorded)
        config = factory(4)
        assert config.hget("ACL_TABLE|DATAACLV4V6", "policy_desc") == "DATAACLV4V6"
        assert config.hget("DHCP_RELAY|Vlan1000", "dhcpv6_servers") == "fc02:2000::1"
        assert factory(STATE_DB).hgetall("PORT_OPERR_TABLE|Ethernet72") == {"NULL": "NULL"}

    def test_loads_a_generated_dump(self, factory, tmp_path):
        """Plain and sonic-db-dump entries load alike; lists, flags and objects become text; non-hashes are skipped."""
        dumps = {
            "counters_db.json": {
                "COUNTERS_PORT_NAME_MAP": {"Ethernet0": "oid:0x1"},
                "COUNTERS:oid:0x1": {"SAI_PORT_STAT_IF_IN_ERRORS": 7},
            },
            "config_db.json": {
                "PORT|Ethernet0": {
                    "expireat": 1.0,
                    "ttl": -0.001,
                    "type": "hash",
                    "value": {"lanes": [0, 1, 2, 3], "admin_status": "up"},
                },
                "FLEX_COUNTER_TABLE|PORT": {"enabled": True, "poll": {"ms": 1000}},
                "VERSIONS": "not a hash",
            },
            "state_db.json": {"PORT_OPERR_TABLE|Ethernet0": {}},
        }
        for name, data in dumps.items():
            (tmp_path / name).write_text(json.dumps(data))
        assert load_sonic_fixture(factory, tmp_path) == {"counters_db.json": 2, "config_db.json": 2, "state_db.json": 1}
        assert factory(COUNTERS_DB).hget("COUNTERS:oid:0x1", "SAI_PORT_STAT_IF_IN_ERRORS") == "7"
        assert factory(CONFIG_DB).hgetall("PORT|Ethernet0") == {"lanes": "0,1,2,3", "admin_status": "up"}
        assert factory(CONFIG_DB).hgetall("FLEX_COUNTER_TABLE|PORT") == {"enabled": "true", "poll": '{"ms": 1000}'}
        assert not factory(CONFIG_DB).exists("VERSIONS")
        assert factory(STATE_DB).hgetall("PORT_OPERR_TABLE|Ethernet0") == {"NULL": "NULL"}
        assert factory(APPL_DB).dbsize() == 0  # no appl_db.json: that db is left alone

    def test_missing_directory_loads_nothing(self, factory, tmp_path):
        """An empty fixture directory is not an error."""
        assert load_sonic_fixture(factory, tmp_path) == {}


class TestSonicSwitchCollectorOnFixture:
    def test_is_a_collector_named_switch(self, fixture_collector):
        """The collector satisfies the protocol and is supported when COUNTERS_DB has a port map."""
        assert isinstance(fixture_collector, Collector)
        assert fixture_collector.name == "switch"
        assert fixture_collector.supported()

    def test_unsupported_without_port_map(self, factory):
        """An empty Redis is not a SONiC switch."""
        assert not SonicSwitchCollector(factory, "x").supported()

    def test_unsupported_when_redis_unreachable(self):
        """No Redis at all means unsupported, not an exception."""

        def dead(db: int) -> redis.Redis:
            return redis.Redis(
                host="127.0.0.1", port=free_port(), db=db, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)
            )

        assert not SonicSwitchCollector(dead, "x").supported()

    def test_one_sample_per_counters_port(self, fixture_collector):
        """Ports come from COUNTERS_PORT_NAME_MAP, in natural order."""
        report, _, _ = _collect(fixture_collector)
        assert [s.port for s in report.switch_ports] == ["Ethernet0", "Ethernet4", "Ethernet8"]

    def test_port_counters_and_pfc(self, fixture_collector):
        """SAI_PORT_STAT_* become int counters; PFC per priority fills pfc_rx/pfc_tx."""
        _, ports, _ = _collect(fixture_collector)
        e0, e8 = ports["Ethernet0"], ports["Ethernet8"]
        assert e0.counters["SAI_PORT_STAT_IF_IN_ERRORS"] == 10
        assert e0.counters["SAI_PORT_STAT_IF_IN_DISCARDS"] == 100
        assert e8.counters["SAI_PORT_STAT_IF_IN_ERRORS"] == 100
        assert not any(k.startswith("EST_") for k in e0.counters)
        assert list(e0.pfc_rx) == [1200, 201, 202, 203, 204, 205, 206, 207]
        assert list(e0.pfc_tx) == [1210, 211, 212, 213, 214, 215, 216, 217]
        assert list(ports["Ethernet4"].pfc_rx)[:2] == [1400, 401]

    def test_queue_sums_and_watchdog(self, fixture_collector):
        """Queue drops, ECN marks and watchdog deadlocks are summed; watchdog status listed per queue."""
        _, ports, _ = _collect(fixture_collector)
        e0, e4, e8 = ports["Ethernet0"], ports["Ethernet4"], ports["Ethernet8"]
        assert list(e0.pfc_wd_status) == ["stormed"]
        assert list(e4.pfc_wd_status) == ["operational"]
        assert (e0.pfc_wd_deadlocks, e4.pfc_wd_deadlocks, e8.pfc_wd_deadlocks) == (1, 2, 3)
        assert (e0.queue_drops, e0.ecn_marked) == (1088, 1088)
        assert (e8.queue_drops, e8.ecn_marked) == (1261, 1261)

    def test_port_status_and_speed(self, fixture_collector):
        """Status from APPL_DB PORT_TABLE, with CONFIG_DB PORT as the fallback for admin state and speed."""
        _, ports, _ = _collect(fixture_collector)
        e0, e4 = ports["Ethernet0"], ports["Ethernet4"]
        assert (e0.oper_status, e0.admin_status, e0.speed_mbps) == ("down", "up", 25000)
        assert (e4.oper_status, e4.admin_status, e4.speed_mbps) == ("", "up", 40000)

    def test_transceiver_dom_and_thresholds(self, fixture_collector):
        """DOM readings and alarm thresholds fill the optic fields; N/A readings are skipped."""
        _, ports, _ = _collect(fixture_collector)
        e0, e8 = ports["Ethernet0"], ports["Ethernet8"]
        assert e0.optic_temperature_c == pytest.approx(30.9258)
        assert list(e0.optic_rx_power_dbm) == pytest.approx([0.3802, -0.4871, -0.0860, 0.3830])
        assert list(e0.optic_tx_power_dbm) == []  # all "N/A"
        assert e0.optic_temp_high_alarm_c == pytest.approx(75.0)
        assert e0.optic_temp_low_alarm_c == pytest.approx(-5.0)
        assert e0.optic_rx_power_low_alarm_dbm == pytest.approx(-13.5067)
        assert e0.optic_rx_power_high_alarm_dbm == pytest.approx(3.4001)
        assert not e0.HasField("optic_tx_power_low_alarm_dbm")
        assert e8.optic_temperature_c == pytest.approx(44.9883)
        assert len(e8.optic_rx_power_dbm) == 8
        assert e8.optic_tx_power_low_alarm_dbm == pytest.approx(-10.5012)
        assert not ports["Ethernet4"].HasField("optic_temperature_c")

    def test_first_cycle_reports_state_already_bad(self, fixture_collector):
        """Ethernet0 down while admin up and the two stormed queues are reported on the first cycle only."""
        assert_bad_at_start_reported_once(fixture_collector)

    def test_describe_lists_front_panel_ports(self, fixture_collector):
        """Inventory ports are APPL_DB PORT_TABLE plus CONFIG_DB PORT, without internal ports."""
        inv = ipb.Inventory()
        fixture_collector.describe(inv)
        by_name = {p.name: p for p in inv.switch_ports}
        assert by_name["Ethernet0"].speed_mbps == 25000
        assert by_name["Ethernet0"].alias == "Ethernet0"
        assert by_name["Ethernet0"].lanes == 1
        assert (by_name["Ethernet4"].alias, by_name["Ethernet4"].lanes, by_name["Ethernet4"].speed_mbps) == (
            "etp2",
            4,
            40000,
        )
        assert "Ethernet-IB0" not in by_name
        assert "Ethernet200" in by_name
        assert len(inv.lldp_neighbors) == 0  # the fixture has no LLDP_ENTRY_TABLE

    def test_missing_tables_are_not_fatal(self, factory):
        """A port in the name map with no counters, state or DOM yields an empty sample, not an error."""
        factory(COUNTERS_DB).hset("COUNTERS_PORT_NAME_MAP", mapping={"Ethernet0": "oid:0x1"})
        factory(COUNTERS_DB).hset("COUNTERS:oid:0x1", mapping={"SAI_PORT_STAT_IF_IN_ERRORS": "garbage"})
        c = SonicSwitchCollector(factory, "bare")
        _, ports, findings = _collect(c)
        assert ports["Ethernet0"].oper_status == ""
        assert dict(ports["Ethernet0"].counters) == {}
        assert list(ports["Ethernet0"].pfc_rx) == []
        assert findings == []


@pytest.fixture
def fake(factory: Factory) -> FakeSwitch:
    sw = FakeSwitch(factory, "leaf-b0-r3", ports=4)
    sw.install()
    return sw


class TestFakeSwitch:
    def test_healthy_switch_has_no_findings(self, factory, fake):
        """A freshly installed fake switch is all up, operational and quiet."""
        c = SonicSwitchCollector(factory, fake.name)
        _, ports, findings = _collect(c)
        assert findings == []
        assert list(ports) == ["Ethernet0", "Ethernet4", "Ethernet8", "Ethernet12"]
        e0 = ports["Ethernet0"]
        assert (e0.oper_status, e0.admin_status, e0.speed_mbps) == ("up", "up", 400_000)
        assert list(e0.pfc_wd_status) == ["operational", "operational"]
        assert e0.optic_rx_power_low_alarm_dbm == pytest.approx(FakeSwitch.RX_LOW_ALARM_DBM)

    def test_counters_grow_with_time(self, factory, fake):
        """advance() grows traffic and ECN counters by the elapsed time."""
        c = SonicSwitchCollector(factory, fake.name)
        _, before, _ = _collect(c)
        fake.advance(10.0)
        _, after, _ = _collect(c)
        octets = 400_000 * 1e6 / 8 * 0.5 * 10
        assert after["Ethernet0"].counters["SAI_PORT_STAT_IF_IN_OCTETS"] == int(octets)
        assert after["Ethernet0"].ecn_marked > before["Ethernet0"].ecn_marked
        assert after["Ethernet0"].counters["SAI_PORT_STAT_IF_IN_ERRORS"] == 0

    def test_port_down_then_up_reported_once_each(self, factory, fake):
        """port_down gives one critical switch_port_down; port_up gives one info switch_port_up."""
        c = SonicSwitchCollector(factory, fake.name)
        _collect(c)
        fake.port_down("Ethernet4")
        _, ports, findings = _collect(c)
        assert ports["Ethernet4"].oper_status == "down"
        assert [(f.kind, f.component, f.severity, f.action) for f in findings] == [
            ("switch_port_down", "Ethernet4", "critical", "check_link")
        ]
        assert findings[0].message == "leaf-b0-r3 Ethernet4 oper status down"
        assert _collect(c)[2] == []
        fake.port_up("Ethernet4")
        _, _, findings = _collect(c)
        assert [(f.kind, f.component, f.severity) for f in findings] == [("switch_port_up", "Ethernet4", "info")]
        assert _collect(c)[2] == []

    def test_pfc_storm_reported_once(self, factory, fake):
        """A watchdog storm gives one critical pfc_storm with the queue; its end gives one info finding."""
        c = SonicSwitchCollector(factory, fake.name)
        _collect(c)
        fake.pfc_storm("Ethernet8", on=True)
        fake.advance(1.0)
        _, ports, findings = _collect(c)
        assert [(f.kind, f.component, f.severity, f.attributes["queue"]) for f in findings] == [
            ("pfc_storm", "Ethernet8", "critical", "3")
        ]
        e8 = ports["Ethernet8"]
        assert list(e8.pfc_wd_status) == ["stormed", "operational"]
        assert e8.pfc_wd_deadlocks == 1
        assert e8.pfc_rx[3] == 50_000
        assert e8.queue_drops == 10_000
        assert _collect(c)[2] == []
        fake.pfc_storm("Ethernet8", on=False)
        _, _, findings = _collect(c)
        assert [(f.kind, f.severity) for f in findings] == [("pfc_storm", "info")]

    def test_optics_degraded(self, factory, fake):
        """A degraded optic reads below the rx low alarm and grows input/FEC errors."""
        c = SonicSwitchCollector(factory, fake.name)
        fake.optics_degraded("Ethernet0")
        fake.advance(2.0)
        _, ports, findings = _collect(c)
        e0 = ports["Ethernet0"]
        assert findings == []
        assert all(p < e0.optic_rx_power_low_alarm_dbm for p in e0.optic_rx_power_dbm)
        assert len(e0.optic_rx_power_dbm) == 4
        assert e0.counters["SAI_PORT_STAT_IF_IN_ERRORS"] == 100
        assert e0.counters["SAI_PORT_STAT_IF_IN_FEC_NOT_CORRECTABLE_FRAMES"] == 40
        assert ports["Ethernet4"].counters["SAI_PORT_STAT_IF_IN_ERRORS"] == 0

    def test_lldp_neighbours_in_inventory_and_updates(self, factory, fake):
        """LLDP_ENTRY_TABLE fills the inventory and report.lldp, the latter only when it changes."""
        fake.set_lldp_neighbor("Ethernet12", "node-003", "nic-3")
        c = SonicSwitchCollector(factory, fake.name)
        inv = ipb.Inventory()
        c.describe(inv)
        assert lldp_observations(inv.lldp_neighbors) == [("Ethernet12", "node-003", "nic-3")]
        assert len(inv.switch_ports) == 4
        first, _, _ = _collect(c)
        assert first.HasField("lldp") and len(first.lldp.neighbors) == 1
        second, _, _ = _collect(c)
        assert not second.HasField("lldp")
        fake.clear_lldp_neighbor("Ethernet12")
        third, _, _ = _collect(c)
        assert third.HasField("lldp") and len(third.lldp.neighbors) == 0

    def test_unknown_port_is_rejected(self, fake):
        """Fault injection on a port the switch does not have fails loudly."""
        with pytest.raises(KeyError, match="Ethernet99"):
            fake.port_down("Ethernet99")
        with pytest.raises(ValueError, match="no PFC watchdog"):
            fake.pfc_storm("Ethernet0", queue=0)


class TestSonicSwitchCollectorOnFakeSwitch:
    """The recorded-table cases on a generated switch, so they run where ../shared is absent."""

    def test_one_sample_per_counters_port_in_natural_order(self, factory):
        """Ports come from COUNTERS_PORT_NAME_MAP in natural order, whatever order Redis returns them in."""
        sw = FakeSwitch(factory, "leaf-b0-r3", ports=12)
        sw.install()
        counters = factory(COUNTERS_DB)
        name_map = counters.hgetall("COUNTERS_PORT_NAME_MAP")
        counters.delete("COUNTERS_PORT_NAME_MAP")
        counters.hset("COUNTERS_PORT_NAME_MAP", mapping=dict(reversed(list(name_map.items()))))
        report, _, _ = _collect(SonicSwitchCollector(factory, sw.name))
        assert [s.port for s in report.switch_ports] == [f"Ethernet{4 * i}" for i in range(12)]

    def test_port_counters_and_pfc(self, factory, fake):
        """SAI_PORT_STAT_* become int counters, other fields are left out; PFC per priority fills pfc_rx/pfc_tx."""
        fake.pfc_storm("Ethernet0")
        fake.advance(2.0)
        oid = factory(COUNTERS_DB).hget("COUNTERS_PORT_NAME_MAP", "Ethernet0")
        factory(COUNTERS_DB).hset(f"COUNTERS:{oid}", "EST_PORT_STAT_RX_BYTES", "5")
        _, ports, _ = _collect(SonicSwitchCollector(factory, fake.name))
        e0, e4 = ports["Ethernet0"], ports["Ethernet4"]
        assert e0.counters["SAI_PORT_STAT_IF_IN_OCTETS"] == int(400_000 * 1e6 / 8 * 0.5 * 2)
        assert e0.counters["SAI_PORT_STAT_IF_IN_ERRORS"] == 0
        assert not any(k.startswith("EST_") for k in e0.counters)
        assert list(e0.pfc_rx) == [0, 0, 0, 100_000, 0, 0, 0, 0]
        assert list(e0.pfc_tx) == [0] * 8
        assert list(e4.pfc_rx) == [0] * 8

    def test_queue_sums_and_watchdog(self, factory, fake):
        """Queue drops, ECN marks and watchdog deadlocks are summed; watchdog status listed per queue."""
        fake.pfc_storm("Ethernet0")
        fake.pfc_storm("Ethernet8", queue=4)
        fake.pfc_storm("Ethernet8", on=False)
        fake.pfc_storm("Ethernet8", queue=4)  # a second deadlock on the same queue
        fake.advance(10.0)
        _, ports, _ = _collect(SonicSwitchCollector(factory, fake.name))
        e0, e4, e8 = ports["Ethernet0"], ports["Ethernet4"], ports["Ethernet8"]
        assert list(e0.pfc_wd_status) == ["stormed", "operational"]
        assert list(e4.pfc_wd_status) == ["operational", "operational"]
        assert list(e8.pfc_wd_status) == ["operational", "stormed"]
        assert (e0.pfc_wd_deadlocks, e4.pfc_wd_deadlocks, e8.pfc_wd_deadlocks) == (1, 0, 2)
        # 10,000 drops/s on the stormed queue; 5 ECN marks/s on each of the two lossless queues
        assert (e0.queue_drops, e0.ecn_marked) == (100_000, 100)
        assert (e4.queue_drops, e4.ecn_marked) == (0, 100)

    def test_port_status_falls_back_to_config_db(self, factory, fake):
        """Without APPL_DB and STATE_DB entries a port takes its admin state and speed from CONFIG_DB PORT."""
        factory(APPL_DB).delete("PORT_TABLE:Ethernet4")
        factory(STATE_DB).delete("PORT_TABLE|Ethernet4")
        factory(CONFIG_DB).hset("PORT|Ethernet4", "speed", "100000")
        _, ports, _ = _collect(SonicSwitchCollector(factory, fake.name))
        e0, e4 = ports["Ethernet0"], ports["Ethernet4"]
        assert (e0.oper_status, e0.admin_status, e0.speed_mbps) == ("up", "up", 400_000)
        assert (e4.oper_status, e4.admin_status, e4.speed_mbps) == ("", "up", 100_000)

    def test_transceiver_dom_and_thresholds(self, factory, fake):
        """DOM readings and alarm thresholds fill the optic fields; unreadable readings are skipped."""
        state = factory(STATE_DB)
        state.hset("TRANSCEIVER_DOM_SENSOR|Ethernet0", mapping={f"tx{lane}power": "N/A" for lane in range(1, 5)})
        state.hset("TRANSCEIVER_DOM_SENSOR|Ethernet0", "rx2power", "-inf")
        state.hdel("TRANSCEIVER_DOM_THRESHOLD|Ethernet0", "txpowerlowalarm")
        state.delete("TRANSCEIVER_DOM_SENSOR|Ethernet4", "TRANSCEIVER_DOM_THRESHOLD|Ethernet4")
        _, ports, _ = _collect(SonicSwitchCollector(factory, fake.name))
        e0, e8 = ports["Ethernet0"], ports["Ethernet8"]
        assert e0.optic_temperature_c == pytest.approx(41.5)
        assert list(e0.optic_rx_power_dbm) == pytest.approx([FakeSwitch.DOM_RX_OK_DBM] * 3)
        assert list(e0.optic_tx_power_dbm) == []  # all "N/A"
        assert e0.optic_temp_high_alarm_c == pytest.approx(75.0)
        assert e0.optic_temp_low_alarm_c == pytest.approx(-5.0)
        assert e0.optic_rx_power_low_alarm_dbm == pytest.approx(FakeSwitch.RX_LOW_ALARM_DBM)
        assert e0.optic_rx_power_high_alarm_dbm == pytest.approx(3.4)
        assert not e0.HasField("optic_tx_power_low_alarm_dbm")
        assert list(e8.optic_tx_power_dbm) == pytest.approx([FakeSwitch.DOM_TX_OK_DBM] * 4)
        assert e8.optic_tx_power_low_alarm_dbm == pytest.approx(-8.0)
        assert not ports["Ethernet4"].HasField("optic_temperature_c")

    def test_first_cycle_reports_state_already_bad(self, factory, fake):
        """A port down while admin up and two stormed queues, there before the collector starts, are reported once."""
        fake.port_down("Ethernet0")
        fake.pfc_storm("Ethernet0")
        fake.pfc_storm("Ethernet8", queue=4)
        assert_bad_at_start_reported_once(SonicSwitchCollector(factory, fake.name))

    def test_describe_lists_front_panel_ports(self, factory, fake):
        """Inventory ports are APPL_DB PORT_TABLE plus CONFIG_DB PORT, without internal ports."""
        factory(APPL_DB).hset(
            "PORT_TABLE:Ethernet-IB0", mapping={"alias": "Ethernet-IB0", "role": "Int", "lanes": "4", "speed": "25000"}
        )
        factory(CONFIG_DB).hset("PORT|Ethernet200", mapping={"alias": "etp51", "lanes": "200,201", "speed": "100000"})
        inv = ipb.Inventory()
        SonicSwitchCollector(factory, fake.name).describe(inv)
        by_name = {p.name: p for p in inv.switch_ports}
        assert list(by_name) == ["Ethernet0", "Ethernet4", "Ethernet8", "Ethernet12", "Ethernet200"]
        assert (by_name["Ethernet0"].alias, by_name["Ethernet0"].lanes, by_name["Ethernet0"].speed_mbps) == (
            "etp1",
            4,
            400_000,
        )
        assert (by_name["Ethernet200"].alias, by_name["Ethernet200"].lanes, by_name["Ethernet200"].speed_mbps) == (
            "etp51",
            2,
            100_000,
        )
        assert len(inv.lldp_neighbors) == 0  # no LLDP_ENTRY_TABLE until a neighbour is set
