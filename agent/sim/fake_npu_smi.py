"""A fake ``npu-smi``: renders the text the real tool prints, from simulated Ascend chips.

The Ascend backend runs argv and parses stdout, so this fake answers the same argv with the
layout of the recorded outputs (``../shared/fixtures/vendors/ascend``): the two-row-per-chip
``npu-smi info`` table, ``npu-smi info -t health`` and ``npu-smi info -t hccs`` (the layout of
``tests/fixtures/ascend/npu-smi/``: seven HCCS links of four lanes, as on an 8-NPU 910B node).
Injecting a fault code turns the chip's health to the grade given and lists the code, as the
real tool does; ``hccs_down`` takes one HCCS link's lanes down.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Bus numbers of the eight 910B4 NPUs of an Atlas 800T A2, in npu-smi's order (as recorded).
ATLAS_800T_A2_BUSES = (0xC1, 0x01, 0xC2, 0x02, 0x81, 0x41, 0x82, 0x42)
_RULE = "+" + "-" * 27 + "+" + "-" * 15 + "+" + "-" * 52 + "+"
_SEP = "+" + "=" * 27 + "+" + "=" * 15 + "+" + "=" * 52 + "+"


@dataclass
class FakeNpu:
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


class FakeNpuSmi:
    """Callable like the backend's runner: ``fake(["npu-smi", "info"])`` returns the tool's text."""

    def __init__(self, npu_count: int = 8, version: str = "24.1.rc3", pci_buses: list[int] | None = None) -> None:
        self.version = version
        buses = pci_buses or [ATLAS_800T_A2_BUSES[i % 8] + i // 8 for i in range(npu_count)]
        self.npus = [FakeNpu(i, buses[i]) for i in range(npu_count)]
        self.calls: list[list[str]] = []

    def inject(self, npu: int, code: str, health: str = "Alarm") -> None:
        """Raise DCMI fault ``code`` on one NPU; its health becomes ``health``."""
        self.npus[npu].codes.append(code.upper())
        self.npus[npu].health = health

    def clear(self, npu: int) -> None:
        self.npus[npu].codes.clear()
        self.npus[npu].health = "OK"

    def hccs_down(self, npu: int, link: int, errors: int = 0) -> None:
        """Take HCCS link ``link`` of one NPU down (every lane off), counting ``errors`` on it."""
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
            return self.render_health(int(argv[argv.index("-i") + 1]))
        if what == "hccs":
            return self.render_hccs(int(argv[argv.index("-i") + 1]))
        if what:
            raise ValueError(f"fake npu-smi does not answer {argv}")
        return self.render_info()

    def render_info(self) -> str:
        head = f"| npu-smi {self.version:<24} Version: {self.version:<46}|"
        lines = [
            "+" + "-" * 96 + "+",
            head,
            _RULE,
            "| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|",
            "| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |",
            _SEP,
        ]
        for n in self.npus:
            first = (
                f"| {n.npu_id:<5} {n.model:<19} | {n.health:<13} | {n.power_w:<11.1f} {n.temperature_c:<17} 0    / 0"
            )
            second = (
                f"| 0                         | 0000:{n.bus:02X}:00.0  | {n.aicore_pct:<11} 0    / 0"
                f"          {n.hbm_used_mb:<5}/ {n.hbm_total_mb}"
            )
            lines += [f"{first:<97}|", f"{second:<97}|", _SEP]
        lines.append(_RULE)
        return "\n".join(lines) + "\n"

    def render_health(self, npu: int) -> str:
        n = self.npus[npu]
        codes = " ".join(n.codes) or "NA"
        info = "injected fault" if n.codes else "NA"
        return (
            f"\tHealth Status                  : {n.health}\n"
            f"\tError Code                     : {codes}\n"
            f"\tError Information              : {info}\n"
        )

    def render_hccs(self, npu: int) -> str:
        n = self.npus[npu]
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
