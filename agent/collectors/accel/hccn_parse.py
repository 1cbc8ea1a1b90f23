"""Parsers for what Huawei's ``hccn_tool`` prints about an Ascend NPU's own RoCE port.

On Ascend 910 servers each NPU has its own RoCE port inside the chip; the host's sysfs does
not show it, ``hccn_tool -i <device> -<what> -g`` does. The shapes (tests/fixtures/ascend/
README.md names the sources): ``-link -g`` prints ``link status: UP``; ``-net_health -g``
``net health status: Success``; ``-speed -g`` ``Speed: 200000 Mb/s``; ``-ip -g``
``ipaddr:…`` and ``netmask:…``; ``-stat -g`` ``packet statistics:`` then ``name:count``
lines; ``-link_stat -g`` lines prefixed ``[device N]`` (``[devid N]`` on newer drivers) with
the up count, on newer drivers the down count, and the change records; ``-optical -g``
``optical info:`` then ``Key : value unit`` lines; ``-lldp -g`` the lldpad layout, one
``… TLV`` line per TLV with its values indented under it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_PREFIX = re.compile(r"^\[dev(?:ice|id)\s*\d+\]\s?")
_RECORD = re.compile(r"^\s*(.+?\d{4})\s+LINK\s+(UP|DOWN)\s*$")
_SPEED = re.compile(r"Speed:\s*(\d+)\s*Mb/s")
_STAT = re.compile(r"^\s*([A-Za-z0-9_]+)\s*:\s*(\d+)\s*$")


def _value_after(text: str, key: str) -> str:
    """The value of the first ``key: value`` line (case-insensitive key), or ""."""
    wanted = key.lower()
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip().lower() == wanted:
            return value.strip()
    return ""


def parse_link(text: str) -> str:
    """``UP``, ``DOWN`` or "" (the line is not there) from ``-link -g``."""
    return _value_after(text, "link status").upper()


def parse_net_health(text: str) -> str:
    """The word of ``-net_health -g``: Success, Init, Fault, Socket fail, Receive timeout, …"""
    return _value_after(text, "net health status")


def parse_speed_mbps(text: str) -> int | None:
    """The port speed in Mb/s from ``-speed -g``; None where it prints none (a port down: ``Unknown!``)."""
    m = _SPEED.search(text)
    return int(m.group(1)) if m else None


def parse_ip(text: str) -> tuple[str, str]:
    """(address, netmask) from ``-ip -g``; empty strings where none is set."""
    return _value_after(text, "ipaddr"), _value_after(text, "netmask")


def parse_stat(text: str) -> dict[str, int]:
    """Every ``name:count`` counter of ``-stat -g`` (cumulative since the driver loaded)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = _STAT.match(line)
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


@dataclass
class LinkStat:
    """``-link_stat -g``: link-up count, the down count where the driver prints it, the records."""

    up_count: int = 0
    down_count: int | None = None
    records: list[tuple[str, str]] = field(default_factory=list)  # (time as printed, "UP" | "DOWN"), newest first

    @property
    def downs(self) -> int:
        """How many times the link went down: the printed count, else one per up after the first."""
        if self.down_count is not None:
            return self.down_count
        return max(self.up_count - 1, 0)


def parse_link_stat(text: str) -> LinkStat:
    stat = LinkStat()
    for raw in text.splitlines():
        line = _PREFIX.sub("", raw, count=1)
        name, sep, value = line.partition(":")
        key = name.strip().lower()
        if sep and key == "link up count" and value.strip().isdigit():
            stat.up_count = int(value)
        elif sep and key == "link down count" and value.strip().isdigit():
            stat.down_count = int(value)
        elif (m := _RECORD.match(line)) is not None:
            stat.records.append((m.group(1).strip(), m.group(2)))
    return stat


@dataclass
class Optical:
    """``-optical -g``: whether a module is seated, its powers in mW, and the loss-of-signal flags."""

    present: bool | None = None
    tx_power_mw: float | None = None
    rx_power_mw: float | None = None
    rx_los: int | None = None  # per-lane bit mask; non-zero: a lane sees no light
    tx_los: int | None = None
    fields: dict[str, str] = field(default_factory=dict)


def _number(value: str) -> float | None:
    try:
        return float(value.split(maxsplit=1)[0])
    except (ValueError, IndexError):
        return None  # "NA", "not supported"


def _flag(value: str) -> int | None:
    try:
        return int(value.split(maxsplit=1)[0], 0)
    except (ValueError, IndexError):
        return None


def parse_optical(text: str) -> Optical:
    out = Optical()
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if not sep or not value.strip():
            continue
        key, value = name.strip(), value.strip()
        out.fields[key] = value
        if key == "present":
            out.present = value.lower() == "present"
        elif key == "Tx Power":
            out.tx_power_mw = _number(value)
        elif key == "Rx Power":
            out.rx_power_mw = _number(value)
        elif key == "Rx Los Flag":
            out.rx_los = _flag(value)
        elif key == "Tx Los Flag":
            out.tx_los = _flag(value)
    return out


@dataclass
class LldpPeer:
    """The switch port at the far end of the NPU's cable, from ``-lldp -g``."""

    chassis_id: str = ""
    port_id: str = ""
    port_description: str = ""
    system_name: str = ""
    management_address: str = ""

    @property
    def known(self) -> bool:
        return bool(self.system_name or self.chassis_id) and bool(self.port_id)


def _tlvs(text: str) -> dict[str, list[str]]:
    """TLV name -> its value lines (stripped, non-empty), in the lldpad layout."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for raw in text.splitlines():
        if raw and not raw[0].isspace() and raw.rstrip().endswith(" TLV"):
            current = out.setdefault(raw.strip()[: -len(" TLV")], [])
        elif current is not None and raw.strip():
            current.append(raw.strip())
    return out


def _tagged(lines: list[str]) -> str:
    """The value of the first ``Tag: value`` line ("MAC: …", "Ifname: …", "IPv4: …"), or the line itself."""
    if not lines:
        return ""
    tag, sep, value = lines[0].partition(":")
    return value.strip() if sep and tag.strip().isalnum() else lines[0]


def parse_lldp(text: str) -> LldpPeer:
    tlvs = _tlvs(text)
    mgmt = [v for v in tlvs.get("Management Address", []) if v.lower().startswith(("ipv4:", "ipv6:"))]
    return LldpPeer(
        chassis_id=_tagged(tlvs.get("Chassis ID", [])),
        port_id=_tagged(tlvs.get("Port ID", [])),
        port_description=(tlvs.get("Port Description") or [""])[0],
        system_name=(tlvs.get("System Name") or [""])[0],
        management_address=_tagged(mgmt),
    )
