"""Kernel log parsing, classification, tailing, and the fake kernel log."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.collectors.kmsg import KernelRecord, KmsgCollector, classify, parse_line, parse_lines, scan_file
from agent.sim.fake_kmsg import FakeKmsg
from starpulse.core.findings import Finding
from starpulse.v1 import telemetry_pb2 as tpb
from tests.helpers import shared_fixture

# Healthy lines of the kinds a GPU node's boot log holds (NVSwitch opens, CNI links, perf throttling).
BOOT_MESSAGES = [
    *(f"nvidia-nvswitch{i}: open (major=510)" for i in range(4)),
    "IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
    "IPv6: ADDRCONF(NETDEV_CHANGE): cali16b7bb8d9d5: link becomes ready",
    "perf: interrupt took too long (2509 > 2500), lowering kernel.perf_event_max_sample_rate to 79500",
    "Initializing XFRM netlink socket",
    "wireguard: WireGuard 1.0.0 loaded. See www.wireguard.com for information.",
]

XID_119 = (
    "NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for "
    "RPC response from GPU4 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8)."
)
FALLEN = "NVRM: GPU 0000:18:00.0: GPU has fallen off the bus."
SXID_NONFATAL = (
    "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)"
)
SXID_FATAL = "nvidia-nvswitch0: SXid (PCI:0000:07:00.0): 24007, Fatal, Link 31 sourcetrack TCEN0 crumbstore ECC"
MLX5_CMD = (
    "mlx5_core 0000:17:00.0: mlx5_cmd_out_err:838:(pid 4242): ACCESS_REG(0x805) op_mod(0x1) failed, "
    "status bad parameter(0x3), syndrome (0x6a8b2), err(-22)"
)
MLX5_HEALTH = "mlx5_core 0000:17:00.0: poll_health:805:(pid 0): device's health compromised - reached miss count"
MLX5_MODULE = "mlx5_core 0000:2a:00.0: Port module event[error]: module 0, Cable error, Bus stuck (I2C or data shorted)"
MLX5_LINK = "mlx5_core 0000:2a:00.0 ens2f0np0: Link down"
PEERMEM = "nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping further processing"


def as_kmsg(msg: str, seq: int = 7, usec: int = 123456789, prio: int = 4) -> str:
    return f"{prio},{seq},{usec},-;{msg}"


def as_dmesg(msg: str) -> str:
    return f"[  123.456789] {msg}"


def as_dmesg_t(msg: str) -> str:
    return f"[Mon Nov 30 06:30:41 2026] {msg}"


def as_journal(msg: str) -> str:
    return f"Nov 30 06:30:41 gpu-node-017 kernel: {msg}"


FORMATS: list[Callable[[str], str]] = [as_kmsg, as_dmesg, as_dmesg_t, as_journal]


def wait_for(cond: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


class TestParseLine:
    def test_kmsg_record(self):
        """A /dev/kmsg record yields seq, usec, syslog level and message."""
        assert parse_line("6,3964,206764307,-;nvidia-nvswitch2: open (major=510)") == KernelRecord(
            3964, 206764307, 6, "nvidia-nvswitch2: open (major=510)"
        )

    def test_kmsg_priority_is_the_level(self):
        """The facility bits of the prio field are dropped: the syslog level remains."""
        rec = parse_line("30,5,10,-,caller=T1;systemd[1]: hello")
        assert rec is not None and rec.priority == 6 and rec.message == "systemd[1]: hello"

    def test_continuation_lines_are_skipped(self):
        """/dev/kmsg dictionary lines (leading space) are not records."""
        assert parse_line(" SUBSYSTEM=pci") is None
        assert parse_line(" DEVICE=+pci:0000:17:00.0") is None
        assert parse_line("") is None

    def test_dmesg(self):
        """Plain dmesg gives the monotonic stamp in microseconds."""
        rec = parse_line("[  123.4567] mlx5_core 0000:17:00.0: hi")
        assert rec == KernelRecord(None, 123456700, None, "mlx5_core 0000:17:00.0: hi")

    def test_dmesg_raw_prefix(self):
        """dmesg -r's <level> prefix becomes the priority."""
        rec = parse_line("<3>[    5.000001] boom")
        assert rec == KernelRecord(None, 5000001, 3, "boom")

    def test_dmesg_t(self):
        """dmesg -T wall-clock stamps carry no usec."""
        rec = parse_line("[Mon Nov 30 06:30:41 2026] hello world")
        assert rec == KernelRecord(None, None, None, "hello world")

    def test_journal(self):
        """journalctl -k short lines keep only the kernel message."""
        rec = parse_line("Nov  3 06:30:41 node kernel: hello: x")
        assert rec == KernelRecord(None, None, None, "hello: x")

    def test_journal_iso_and_inner_stamp(self):
        """short-iso journal lines and syslog lines with the kernel stamp inside both parse."""
        assert parse_line("2026-11-30T06:30:41+0000 node kernel: a b").message == "a b"  # type: ignore[union-attr]
        rec = parse_line("Nov 30 06:30:41 node kernel: [   12.5] msg")
        assert rec == KernelRecord(None, 12500000, None, "msg")

    def test_journal_short_monotonic(self):
        """journalctl -o short-monotonic drops the "host kernel:" prefix."""
        assert parse_line("[  100.000001] node kernel: msg") == KernelRecord(None, 100000001, None, "msg")

    def test_unknown_shape_is_the_message(self):
        """A line in no known format is taken whole as the message."""
        assert parse_line(FALLEN) == KernelRecord(None, None, None, FALLEN)


class TestRecordedLogs:
    def test_nvswitch_log_parses_every_line(self):
        """Every line of the recorded NVSwitch log is a record with the right fields."""
        lines = shared_fixture("kmsg/kmsg.nvswitch.log").read_text().splitlines()
        recs = list(parse_lines(lines))
        assert len(recs) == len(lines) == 47
        assert all(r.seq is not None and r.usec is not None and r.priority == 6 for r in recs)
        assert recs[0] == KernelRecord(3964, 206764307, 6, "nvidia-nvswitch2: open (major=510)")
        assert recs[-1].seq == 4010 and recs[-1].usec == 57631398464
        assert [r.seq for r in recs] == list(range(3964, 4011))

    def test_nvswitch_log_has_no_findings(self):
        """Device opens, link-ready and perf lines are not faults."""
        assert scan_file(str(shared_fixture("kmsg/kmsg.nvswitch.log"))) == []

    def test_peermem_log(self):
        """Every peermem ERROR line is a "kernel" finding; the trailing "test" line is not."""
        path = shared_fixture("kmsg/kmsg.peermem.log")
        recs = list(parse_lines(path.read_text().splitlines()))
        assert len(recs) == 8
        assert recs[0] == KernelRecord(3973, 227996636, 6, PEERMEM)
        assert recs[-1] == KernelRecord(3973, 227996662, 6, "test")
        findings = scan_file(str(path))
        assert len(findings) == 7
        assert {(f.kind, f.severity, f.action, f.source) for f in findings} == {
            ("kernel", "warning", "investigate", "kmsg")
        }
        assert findings[0].attributes["kmsg_seq"] == "3973"
        assert findings[0].attributes["kernel_usec"] == "227996636"


def _seq_usec(record: str) -> tuple[int, int]:
    """The seq and usec fields of a record as FakeKmsg wrote it."""
    _, seq, usec = record.split(";", 1)[0].split(",")[:3]
    return int(seq), int(usec)


class TestGeneratedLogs:
    def test_boot_log_parses_every_line(self, tmp_path):
        """Every line of a FakeKmsg boot log is an info record with consecutive seq and rising usec."""
        fk = FakeKmsg(str(tmp_path / "kmsg.boot.log"), start_seq=3964)
        written = [fk.line(m) for m in BOOT_MESSAGES]
        lines = Path(fk.path).read_text().splitlines()
        recs = list(parse_lines(lines))
        assert len(recs) == len(lines) == len(BOOT_MESSAGES)
        assert all(r.seq is not None and r.usec is not None and r.priority == 6 for r in recs)
        assert recs[0] == KernelRecord(*_seq_usec(written[0]), 6, "nvidia-nvswitch0: open (major=510)")
        assert [r.message for r in recs] == BOOT_MESSAGES
        assert [r.seq for r in recs] == list(range(3964, 3964 + len(BOOT_MESSAGES)))
        usecs = [r.usec or 0 for r in recs]
        assert usecs == sorted(set(usecs))

    def test_boot_log_has_no_findings(self, tmp_path):
        """Device opens, link-ready and perf lines are not faults."""
        fk = FakeKmsg(str(tmp_path / "kmsg.boot.log"))
        for m in BOOT_MESSAGES:
            fk.line(m)
        assert scan_file(fk.path) == []

    def test_peermem_log(self, tmp_path):
        """Every peermem ERROR line is a "kernel" finding carrying its seq and usec; a "test" line is not."""
        fk = FakeKmsg(str(tmp_path / "kmsg.peermem.log"))
        written = [fk.line(PEERMEM) for _ in range(7)]
        fk.line("test")
        recs = list(parse_lines(Path(fk.path).read_text().splitlines()))
        assert len(recs) == 8 and recs[-1].message == "test"
        findings = scan_file(fk.path)
        assert len(findings) == 7
        assert {(f.kind, f.severity, f.action, f.source) for f in findings} == {
            ("kernel", "warning", "investigate", "kmsg")
        }
        seq, usec = _seq_usec(written[0])
        assert findings[0].attributes["kmsg_seq"] == str(seq)
        assert findings[0].attributes["kernel_usec"] == str(usec)


class TestClassify:
    @pytest.mark.parametrize(
        ("xid", "action", "severity"),
        [
            (79, "reboot", "fatal"),
            (95, "reset_gpu", "critical"),
            (13, "restart_app", "warning"),
            (119, "reset_gpu", "critical"),
        ],
    )
    @pytest.mark.parametrize("fmt", FORMATS)
    def test_xid_actions(self, xid, action, severity, fmt):
        """Xid lines in every format map to the catalog's action, with the PCI string as given."""
        msg = f"NVRM: Xid (PCI:0000:9b:00): {xid}, pid=1234, name=python3, details here"
        rec = parse_line(fmt(msg))
        assert rec is not None
        f = classify(rec.message)
        assert f is not None
        assert (f.kind, f.xid, f.action, f.severity) == ("xid", xid, action, severity)
        assert f.pci == "0000:9b:00" and f.attributes["pci"] == "0000:9b:00"
        assert f.component == "gpu@0000:9b:00"
        assert f.attributes["pid"] == "1234" and f.attributes["process"] == "python3"

    def test_xid_without_pci_prefix(self):
        """gpud's regex also accepts a bare bus id."""
        f = classify("NVRM: Xid (0000:3b:00): 48, pid=1, name=x, An uncorrectable double bit error")
        assert f is not None and f.pci == "0000:3b:00" and f.xid == 48 and f.severity == "critical"

    def test_xid_119_example(self):
        """The reference's Xid 119 line is a critical reset_gpu finding."""
        f = classify(XID_119)
        assert f is not None and f.xid == 119 and f.action == "reset_gpu"
        assert f.to_event().kind == tpb.EventKind.Value("EVENT_KIND_XID")

    def test_unknown_xid_is_investigated(self):
        """An Xid outside the catalog is a warning to investigate."""
        f = classify("NVRM: Xid (PCI:0000:9b:00): 999, pid=1, name=x, new")
        assert f is not None and (f.action, f.severity) == ("investigate", "warning")

    @pytest.mark.parametrize("fmt", FORMATS)
    def test_fallen_off_the_bus(self, fmt):
        """ "GPU has fallen off the bus" is gpu_lost, Xid 79, reboot, fatal."""
        rec = parse_line(fmt(FALLEN))
        assert rec is not None
        f = classify(rec.message)
        assert f is not None
        got = (f.kind, f.xid, f.action, f.severity, f.pci)
        assert got == ("gpu_lost", 79, "reboot", "fatal", "0000:18:00.0")

    @pytest.mark.parametrize("fmt", FORMATS)
    def test_sxid(self, fmt):
        """SXid lines are sxid findings, fatal only when the line says Fatal."""
        rec = parse_line(fmt(SXID_NONFATAL))
        assert rec is not None
        f = classify(rec.message)
        assert f is not None
        assert (f.kind, f.xid, f.severity, f.pci) == ("sxid", 12028, "warning", "0000:05:00.0")
        assert f.attributes["link"] == "32" and f.attributes["nvswitch"] == "nvidia-nvswitch3"
        fatal = classify(SXID_FATAL)
        assert fatal is not None and (fatal.severity, fatal.xid, fatal.action) == ("fatal", 24007, "reboot")

    @pytest.mark.parametrize("fmt", FORMATS)
    @pytest.mark.parametrize(
        ("msg", "action", "severity", "pci"),
        [
            (MLX5_CMD, "investigate", "warning", "0000:17:00.0"),
            # a firmware health failure is a fatal device error (issue 17: NVIDIA's mlx5 docs)
            (MLX5_HEALTH, "reboot", "critical", "0000:17:00.0"),
            (MLX5_MODULE, "check_link", "warning", "0000:2a:00.0"),
            (MLX5_LINK, "check_link", "warning", "0000:2a:00.0"),
        ],
    )
    def test_mlx5_errors(self, fmt, msg, action, severity, pci):
        """mlx5 errors are nic_driver_error findings carrying the PCI address."""
        rec = parse_line(fmt(msg))
        assert rec is not None
        f = classify(rec.message)
        assert f is not None
        assert (f.kind, f.severity, f.action, f.pci, f.attributes["pci"]) == (
            "nic_driver_error",
            severity,
            action,
            pci,
            pci,
        )

    def test_mlx5_link_down_names_the_netdev(self):
        """When the driver names the netdev, it is the component."""
        f = classify(MLX5_LINK)
        assert f is not None and f.component == "ens2f0np0" and f.attributes["netdev"] == "ens2f0np0"

    @pytest.mark.parametrize("fmt", FORMATS)
    def test_peermem(self, fmt):
        """nvidia-peermem ERROR lines are kernel warnings to investigate."""
        rec = parse_line(fmt(PEERMEM))
        assert rec is not None
        f = classify(rec.message)
        assert f is not None and (f.kind, f.severity, f.action) == ("kernel", "warning", "investigate")

    @pytest.mark.parametrize(
        "msg",
        [
            "nvidia-nvswitch2: open (major=510)",
            "mlx5_core 0000:17:00.0 ens1f0np0: Link up",
            "mlx5_core 0000:17:00.0: E-Switch: Total vports 2, per vport: max uc(128) max mc(2048)",
            "IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
            "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07",
        ],
    )
    def test_ordinary_lines(self, msg):
        """Ordinary kernel lines are not findings."""
        assert classify(msg) is None


class TestScanFile:
    def test_mixed_formats(self, tmp_path):
        """scan_file reads a whole file in any format and keeps line order."""
        p = tmp_path / "dmesg.txt"
        lines = [as_dmesg("hello"), as_dmesg(XID_119), as_journal(FALLEN), as_kmsg(MLX5_LINK)]
        p.write_text("\n".join(lines))
        kinds = [f.kind for f in scan_file(str(p))]
        assert kinds == ["xid", "gpu_lost", "nic_driver_error"]


class _Sink:
    def __init__(self) -> None:
        self.items: list[Finding] = []
        self.lock = threading.Lock()

    def __call__(self, f: Finding) -> None:
        with self.lock:
            self.items.append(f)

    def kinds(self) -> list[str]:
        with self.lock:
            return [f.kind for f in self.items]


class TestKmsgCollector:
    def test_tails_appended_lines(self, tmp_path):
        """A line appended after start reaches the sink; lines already there are skipped."""
        p = tmp_path / "kmsg"
        p.write_text(as_kmsg(XID_119, seq=1) + "\n")
        sink = _Sink()
        c = KmsgCollector(str(p), sink, poll_interval_s=0.02)
        try:
            assert c.supported()
            c.start()
            assert c.wait_ready()
            with p.open("a") as fh:
                fh.write(as_kmsg(FALLEN, seq=2) + "\n")
            assert wait_for(lambda: sink.kinds() == ["gpu_lost"])
            assert c.collect(tpb.Report()) == []
        finally:
            c.close()
        assert not c.running

    def test_from_start(self, tmp_path):
        """from_start=True also delivers what the file already holds."""
        p = tmp_path / "kmsg"
        p.write_text(as_kmsg(XID_119, seq=1) + "\n" + as_kmsg("ordinary", seq=2) + "\n")
        sink = _Sink()
        c = KmsgCollector(str(p), sink, from_start=True, poll_interval_s=0.02)
        try:
            c.start()
            assert wait_for(lambda: sink.kinds() == ["xid"])
            assert wait_for(lambda: c.records_read == 2)
        finally:
            c.close()

    def test_partial_line_waits_for_newline(self, tmp_path):
        """A half-written line is delivered once its newline arrives."""
        p = tmp_path / "kmsg"
        p.write_text("")
        sink = _Sink()
        c = KmsgCollector(str(p), sink, poll_interval_s=0.02)
        try:
            c.start()
            assert c.wait_ready()
            full = as_kmsg(XID_119)
            with p.open("a") as fh:
                fh.write(full[:30])
            time.sleep(0.15)  # a negative check needs a little time: several poll intervals
            assert sink.kinds() == []
            with p.open("a") as fh:
                fh.write(full[30:] + "\n")
            assert wait_for(lambda: sink.kinds() == ["xid"])
        finally:
            c.close()

    def test_survives_truncation(self, tmp_path):
        """After the file is truncated, new lines are still delivered."""
        p = tmp_path / "kmsg"
        p.write_text("\n".join(as_kmsg(f"line {i}", seq=i) for i in range(50)) + "\n")
        sink = _Sink()
        c = KmsgCollector(str(p), sink, poll_interval_s=0.02)
        try:
            c.start()
            assert c.wait_ready()
            p.write_text("")  # truncate; what follows is shorter than what was there
            with p.open("a") as fh:
                fh.write(as_kmsg(MLX5_LINK, seq=100) + "\n")
            assert wait_for(lambda: sink.kinds() == ["nic_driver_error"])
        finally:
            c.close()

    def test_survives_rotation(self, tmp_path):
        """A file replaced by a new one (rotation) is followed from the new file's start."""
        p = tmp_path / "kmsg"
        p.write_text("")
        sink = _Sink()
        c = KmsgCollector(str(p), sink, poll_interval_s=0.02)
        try:
            c.start()
            assert c.wait_ready()
            os.rename(p, tmp_path / "kmsg.1")
            p.write_text(as_kmsg(FALLEN) + "\n")
            assert wait_for(lambda: sink.kinds() == ["gpu_lost"])
        finally:
            c.close()

    def test_sink_errors_do_not_stop_the_tail(self, tmp_path):
        """A sink that raises loses that finding only; later lines still arrive."""
        p = tmp_path / "kmsg"
        p.write_text(as_kmsg(XID_119) + "\n" + as_kmsg(FALLEN) + "\n")
        got: list[str] = []

        def sink(f: Finding) -> None:
            if f.kind == "xid":
                raise RuntimeError("sink down")
            got.append(f.kind)

        c = KmsgCollector(str(p), sink, from_start=True, poll_interval_s=0.02)
        try:
            c.start()
            assert wait_for(lambda: got == ["gpu_lost"])
        finally:
            c.close()

    def test_without_sink_collect_returns_findings(self, tmp_path):
        """With no sink, collect() hands over the queued findings once."""
        p = tmp_path / "kmsg"
        p.write_text(as_kmsg(XID_119) + "\n")
        c = KmsgCollector(str(p), from_start=True, poll_interval_s=0.02)
        try:
            got: list[Finding] = []

            def drained() -> bool:
                got.extend(c.collect(tpb.Report()))
                return bool(got)

            assert wait_for(drained)
            assert [f.kind for f in got] == ["xid"]
            assert c.collect(tpb.Report()) == []
        finally:
            c.close()

    def test_idle_tail_wakes_on_news_not_on_a_timer(self, tmp_path):
        """With an hour's poll interval an appended line still arrives at once (inotify), and close()
        wakes the tail: were it to wait out the poll, the test would hang to pytest's timeout."""
        p = tmp_path / "kmsg"
        p.write_text("")
        sink = _Sink()
        c = KmsgCollector(str(p), sink, poll_interval_s=3600.0)
        try:
            c.start()
            assert c.wait_ready()
            with p.open("a") as fh:
                fh.write(as_kmsg(FALLEN, seq=2) + "\n")
            assert wait_for(lambda: sink.kinds() == ["gpu_lost"], timeout_s=5.0)
            nxt = tmp_path / "kmsg.next"
            nxt.write_text(as_kmsg(XID_119, seq=3) + "\n")
            os.replace(nxt, p)  # rotated in one step: the next file is read from its start
            assert wait_for(lambda: len(sink.kinds()) == 2, timeout_s=5.0)
        finally:
            c.close()
        assert not c.running

    def test_missing_path_is_unsupported(self, tmp_path):
        """A path that does not exist is unsupported, and close() is idempotent."""
        c = KmsgCollector(str(tmp_path / "nope"), _Sink())
        assert not c.supported()
        c.close()
        c.close()

    @pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="/dev/kmsg not readable here")
    def test_reads_the_real_device(self):
        """On a host with a readable /dev/kmsg, the device tail reads records from the start."""
        c = KmsgCollector("/dev/kmsg", _Sink(), from_start=True, poll_interval_s=0.02)
        try:
            c.start()
            assert wait_for(lambda: c.records_read > 0)
        finally:
            c.close()


class TestFakeKmsg:
    def test_records_are_increasing_and_classified(self, tmp_path):
        """FakeKmsg writes kmsg records with increasing seq/usec that classify as intended."""
        fk = FakeKmsg(str(tmp_path / "kmsg"))
        fk.xid("0000:9b:00", 95, "Uncontained memory error")
        fk.fallen_off_bus("0000:18:00.0")
        fk.mlx5_error("0000:17:00.0", "Port module event[error]: module 0, Cable error")
        fk.line("ordinary")
        recs = list(parse_lines((tmp_path / "kmsg").read_text().splitlines()))
        assert len(recs) == 4
        seqs = [r.seq or 0 for r in recs]
        usecs = [r.usec or 0 for r in recs]
        assert seqs == sorted(seqs) and len(set(seqs)) == 4
        assert usecs == sorted(usecs) and len(set(usecs)) == 4
        kinds = [f.kind for f in scan_file(str(tmp_path / "kmsg"))]
        assert kinds == ["xid", "gpu_lost", "nic_driver_error"]
        assert scan_file(str(tmp_path / "kmsg"))[0].pci == "0000:9b:00"

    def test_fallen_off_bus_with_xid(self, tmp_path):
        """with_xid also writes the driver's Xid 79 line with the short PCI form."""
        fk = FakeKmsg(str(tmp_path / "kmsg"))
        fk.fallen_off_bus("0000:18:00.0", with_xid=True)
        found = scan_file(str(tmp_path / "kmsg"))
        got = [(f.kind, f.xid, f.pci) for f in found]
        assert got == [("xid", 79, "0000:18:00"), ("gpu_lost", 79, "0000:18:00.0")]

    def test_collector_tails_fake(self, tmp_path):
        """The collector delivers what FakeKmsg appends after start."""
        fk = FakeKmsg(str(tmp_path / "kmsg"))
        fk.line("before start")
        sink = _Sink()
        c = KmsgCollector(fk.path, sink, poll_interval_s=0.02)
        try:
            c.start()
            assert c.wait_ready()
            fk.xid("0000:9b:00", 13)
            assert wait_for(lambda: sink.kinds() == ["xid"])
        finally:
            c.close()
