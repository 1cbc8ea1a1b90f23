"""A fake ``npu-smi``: renders the text the real tool prints, from simulated Ascend chips.

The Ascend backend runs argv and parses stdout, so this fake answers the same argv in the layout
of each product line, as the recorded and public outputs show them
(``../shared/fixtures/vendors/ascend``, ``tests/fixtures/ascend/npu-smi/``):

    910B     A2 (910B4), one chip per NPU, ``Chip`` column (the default)
    910A     the older narrow table of a 910A training node
    A3       Atlas A3: two chips per NPU, ``Chip  Phy-ID``, the second chip's power ``-``
    310P     310P duo cards (Atlas 300I Duo): two chips per card on one bus id, ``Chip Device``,
             power ``NA``, ``Memory-Usage`` only
    310B     a 310B SoC (Atlas 200I/500 A2): bus id ``NA``, ``Memory-Usage`` only

plus ``npu-smi info -t health -i N -c C`` and ``-t hccs`` (which inference cards and SoCs do not
answer) (seven HCCS links of four lanes, as on
an 8-NPU 910B node). ``npus`` holds one entry per chip, in npu-smi's order (the backend's index);
injecting a fault code turns that chip's health to the grade given and lists the code, as the real
tool does; ``hccs_down`` takes one HCCS link's lanes down.

Run as a program it is an ``npu-smi`` on PATH for a real agent or ``starpulse scan --backend
ascend``: ``python -m agent.sim.fake_npu_smi --layout 310P --chips 4 --fault 3:80E18005 info``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

from agent.collectors.base import CollectorUnsupported

# Bus numbers of the eight 910B4 NPUs of an Atlas 800T A2, in npu-smi's order (as recorded).
ATLAS_800T_A2_BUSES = (0xC1, 0x01, 0xC2, 0x02, 0x81, 0x41, 0x82, 0x42)


@dataclass(frozen=True)
class Layout:
    """How one product line's ``npu-smi info`` looks: widths, column names, what it fills in."""

    model: str
    widths: tuple[int, int, int]
    chip_header: str
    usage: tuple[str, ...]  # the usage columns after AICore: "memory", "hbm"
    chips_per_npu: int = 1
    power: str = ""  # "" prints the reading; otherwise this word (310P: "NA")
    bus: bool = True  # False: the chip has no PCI address ("NA")
    phy_column: bool = False  # the chip row prints a second id (Phy-ID / Device)
    hbm_total_mb: int = 32768
    memory_used_mb: int = 0
    memory_total_mb: int = 0
    shared_bus: bool = False  # a duo card's chips sit behind one bus id
    hccs: bool = True  # False: npu-smi has no HCCS query for this chip (inference cards, SoCs)
    process_unit: str = "MB"


LAYOUTS: dict[str, Layout] = {
    "910B": Layout("910B4", (27, 15, 52), "Chip", ("memory", "hbm")),
    "910A": Layout(
        "910A", (22, 15, 52), "Chip", ("memory", "hbm"), memory_used_mb=938, memory_total_mb=15137, process_unit="B"
    ),
    "A3": Layout("Ascend910", (27, 15, 52), "Chip  Phy-ID", ("memory", "hbm"), 2, phy_column=True, hbm_total_mb=65536),
    "310P": Layout(
        "310P3",
        (31, 17, 54),
        "Chip    Device",
        ("memory",),
        2,
        power="NA",
        phy_column=True,
        memory_used_mb=1529,
        memory_total_mb=44280,
        shared_bus=True,
        hccs=False,
    ),
    "310B": Layout(
        "310B",
        (31, 17, 54),
        "Chip    Device",
        ("memory",),
        bus=False,
        phy_column=True,
        memory_used_mb=2376,
        memory_total_mb=11578,
        hccs=False,
    ),
}


@dataclass
class FakeNpu:
    """One chip as npu-smi lists it (an A3 or 310P NPU is two of these)."""

    npu_id: int
    bus: int
    model: str = "910B4"
    power_w: float = 85.0
    temperature_c: int = 36
    aicore_pct: int = 0
    hbm_used_mb: int = 2818
    hbm_total_mb: int = 32768
    health: str = "OK"
    codes: list[str] = field(default_factory=list)
    hccs_lanes: list[str] = field(default_factory=lambda: ["1111"] * 7)
    hccs_errors: list[int] = field(default_factory=lambda: [0] * 7)
    chip_id: int = 0
    phy_id: int = 0
    memory_used_mb: int = 0
    memory_total_mb: int = 0


class FakeNpuSmi:
    """Callable like the backend's runner: ``fake(["npu-smi", "info"])`` returns the tool's text.

    ``npu_count`` is the number of chips (the backend's accelerators); a two-chip layout groups
    them two per NPU id.
    """

    def __init__(
        self, npu_count: int = 8, version: str = "24.1.rc3", pci_buses: list[int] | None = None, layout: str = "910B"
    ) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"fake npu-smi layout {layout!r} is not one of {', '.join(LAYOUTS)}")
        self.version = version
        self.layout = LAYOUTS[layout]
        per = self.layout.chips_per_npu
        cards = (npu_count + per - 1) // per
        buses = pci_buses or [ATLAS_800T_A2_BUSES[i % 8] + i // 8 for i in range(npu_count)]
        # A duo card's chips share its first chip's bus; every other chip has its own.
        bus_of = [buses[i - i % per] if self.layout.shared_bus else buses[i] for i in range(npu_count)]
        self.npus = [self._chip(i, i // per, i % per, bus_of[i]) for i in range(npu_count)]
        self.npu_ids = cards
        self.calls: list[list[str]] = []

    def _chip(self, index: int, npu: int, chip: int, bus: int) -> FakeNpu:
        lay = self.layout
        hbm = "hbm" in lay.usage
        return FakeNpu(
            npu,
            bus,
            model=lay.model,
            hbm_used_mb=2818 if hbm else 0,
            hbm_total_mb=lay.hbm_total_mb if hbm else 0,
            chip_id=chip,
            phy_id=index,
            memory_used_mb=max(lay.memory_used_mb - 117 * chip, 0),
            memory_total_mb=lay.memory_total_mb,
            power_w=85.0 if lay.bus else 0.0,
        )

    def _at(self, argv: list[str]) -> FakeNpu:
        """The chip ``-i N -c C`` names (``-c`` left out: the NPU's first chip)."""
        npu = int(argv[argv.index("-i") + 1])
        chip = int(argv[argv.index("-c") + 1]) if "-c" in argv else 0
        for n in self.npus:
            if (n.npu_id, n.chip_id) == (npu, chip):
                return n
        raise ValueError(f"fake npu-smi has no chip -i {npu} -c {chip}")

    def inject(self, npu: int, code: str, health: str = "Alarm") -> None:
        """Raise DCMI fault ``code`` on chip ``npu`` (the backend's index); its health becomes ``health``."""
        self.npus[npu].codes.append(code.upper())
        self.npus[npu].health = health

    def clear(self, npu: int) -> None:
        self.npus[npu].codes.clear()
        self.npus[npu].health = "OK"

    def hccs_down(self, npu: int, link: int, errors: int = 0) -> None:
        """Take HCCS link ``link`` of one chip down (every lane off), counting ``errors`` on it."""
        self.npus[npu].hccs_lanes[link] = "0000"
        self.npus[npu].hccs_errors[link] += errors

    def hccs_up(self, npu: int, link: int) -> None:
        self.npus[npu].hccs_lanes[link] = "1111"

    def __call__(self, argv: list[str]) -> str:
        self.calls.append(list(argv))
        if argv[:2] != ["npu-smi", "info"]:
            raise ValueError(f"fake npu-smi does not answer {argv}")
        what = argv[argv.index("-t") + 1] if "-t" in argv else ""
        if what == "health":
            return self._health(self._at(argv))
        if what == "hccs":
            if not self.layout.hccs:
                raise CollectorUnsupported(f"{' '.join(argv)}: exit 2: This device does not support querying hccs.")
            return self._hccs(self._at(argv))
        if what:
            raise ValueError(f"fake npu-smi does not answer {argv}")
        return self.render_info()

    def _row(self, cells: tuple[str, str, str]) -> str:
        w0, w1, w2 = self.layout.widths
        return f"| {cells[0]:<{w0 - 1}}| {cells[1]:<{w1 - 1}}| {cells[2]:<{w2 - 1}}|"

    def _usage(self, n: FakeNpu) -> str:
        parts = []
        for name in self.layout.usage:
            used, total = (n.hbm_used_mb, n.hbm_total_mb) if name == "hbm" else (n.memory_used_mb, n.memory_total_mb)
            parts.append(f"{used:<5}/ {total:<11}")
        return "".join(parts).rstrip()

    def render_info(self) -> str:
        lay = self.layout
        w0, w1, w2 = lay.widths
        total = w0 + w1 + w2 + 2
        rule = "+" + "-" * w0 + "+" + "-" * w1 + "+" + "-" * w2 + "+"
        sep = "+" + "=" * w0 + "+" + "=" * w1 + "+" + "=" * w2 + "+"
        usage_names = "  ".join("HBM-Usage(MB)" if u == "hbm" else "Memory-Usage(MB)" for u in lay.usage)
        lines = [
            "+" + "-" * total + "+",
            f"| npu-smi {self.version:<24} Version: {self.version:<{total - 43}}|",
            rule,
            self._row(("NPU   Name", "Health", "Power(W)    Temp(C)           Hugepages-Usage(page)")),
            self._row((lay.chip_header, "Bus-Id", f"AICore(%)   {usage_names}")),
            sep,
        ]
        for n in self.npus:
            if lay.power:
                power = lay.power
            elif n.chip_id > 0:
                power = "-"  # an A3's second chip: the NPU's power is on its first
            else:
                power = f"{n.power_w:.1f}"
            first = (f"{n.npu_id:<5} {n.model}", n.health, f"{power:<11} {n.temperature_c:<17} 0    / 0")
            ids = f"{n.chip_id:<5} {n.phy_id}" if lay.phy_column else f"{n.chip_id}"
            bus = f"0000:{n.bus:02X}:00.0" if lay.bus else "NA"
            second = (ids, bus, f"{n.aicore_pct:<11} {self._usage(n)}")
            lines += [self._row(first), self._row(second)]
            last_of_npu = n.chip_id == lay.chips_per_npu - 1
            between = rule if lay.shared_bus else "+" + "-" * total + "+"  # a duo card keeps its columns
            lines.append(sep if last_of_npu else between)
        lines += [
            rule,
            self._row(("NPU     Chip", "Process id", f"Process name             | Process memory({lay.process_unit})")),
            sep,
        ]
        for npu in sorted({n.npu_id for n in self.npus}):
            lines += [f"| {'No running processes found in NPU ' + str(npu):<{total - 1}}|", sep]
        return "\n".join(lines) + "\n"

    def render_health(self, npu: int, chip: int = 0) -> str:
        """``npu-smi info -t health -i npu -c chip``."""
        return self._health(self._at(["-i", str(npu), "-c", str(chip)]))

    def render_hccs(self, npu: int, chip: int = 0) -> str:
        return self._hccs(self._at(["-i", str(npu), "-c", str(chip)]))

    @staticmethod
    def _health(n: FakeNpu) -> str:
        codes = " ".join(n.codes) or "NA"
        info = "injected fault" if n.codes else "NA"
        return (
            f"\tHealth Status                  : {n.health}\n"
            f"\tError Code                     : {codes}\n"
            f"\tError Information              : {info}\n"
        )

    @staticmethod
    def _hccs(n: FakeNpu) -> str:
        ok = all(lanes == "1111" for lanes in n.hccs_lanes)

        def row(key: str, values: list[str] | str) -> str:
            value = values if isinstance(values, str) else "[" + " ".join(values) + "]"
            return f"\t{key:<31}: {value}\n"

        links = len(n.hccs_lanes)
        return "".join(
            [
                row("hccs health status", "OK" if ok else "NOK"),
                row("hccs lane mode", ["4"] * links),
                row("hccs link lane list", n.hccs_lanes),
                row("hccs link speed", ["224" if lanes == "1111" else "0" for lanes in n.hccs_lanes]),
                row("hccs retry count", ["0"] * links),
                row("hccs error count", [str(e) for e in n.hccs_errors]),
            ]
        )


def main(argv: list[str] | None = None) -> int:
    """Answer one npu-smi command line in a layout, with faults given as ``INDEX:CODE[:HEALTH]``."""
    ap = argparse.ArgumentParser(prog="npu-smi", description="a fake npu-smi", allow_abbrev=False)
    ap.add_argument("--layout", default="910B", choices=sorted(LAYOUTS), help="the product line's table")
    ap.add_argument("--chips", type=int, default=8, help="how many chips the node has")
    ap.add_argument("--fault", action="append", default=[], metavar="INDEX:CODE[:HEALTH]", help="a chip's fault")
    args, rest = ap.parse_known_args(argv)
    fake = FakeNpuSmi(args.chips, layout=args.layout)
    try:
        for spec in args.fault:
            index, code, *health = spec.split(":")
            fake.inject(int(index), code, *health[:1])
        sys.stdout.write(fake(["npu-smi", *rest]))
    except (ValueError, IndexError, CollectorUnsupported) as exc:
        print(f"npu-smi: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
