"""PCI topology helpers: pair each RDMA NIC with the GPU behind the same PCIe switch.

GPUDirect RDMA traffic of GPU i goes through the NIC on its switch (its "rail"), so a
NIC fault hits exactly that GPU's collectives. The pairing comes from the sysfs device
paths: two endpoints behind one switch share the path down to that switch's ports.
"""

from __future__ import annotations

import os
import re

import structlog

from starpulse.core import vocab

log = structlog.get_logger(__name__)

PCI_ADDR_RE = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


def pci_device_path(sysfs_root: str, addr: str) -> str | None:
    """Real sysfs path of a PCI device (``bus/pci/devices/<addr>`` resolved), None if absent."""
    link = os.path.join(sysfs_root, "bus", "pci", "devices", vocab.canonical_pci(addr))
    if not os.path.exists(link):
        return None
    return os.path.realpath(link)


def _pci_components(path: str) -> list[str]:
    return [c for c in path.split(os.sep) if c]


def _shared_pci_depth(a: list[str], b: list[str]) -> int:
    """Number of PCI-device components the two paths share (host bridges do not count)."""
    depth = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        if PCI_ADDR_RE.fullmatch(x):
            depth += 1
    return depth


def pair_nics_with_gpus(sysfs_root: str, nic_pci_by_key: dict[str, str], gpu_pci: dict[int, str]) -> dict[str, int]:
    """Map NIC key -> GPU index for NICs that share a PCIe switch with exactly one closest GPU.

    The closest GPU is the one whose device path shares the most PCI bridges with the
    NIC's. Sharing only a host bridge (no common bridge) is not a pairing; a tie
    between GPUs leaves the NIC unpaired rather than guessing.
    """
    gpu_paths: dict[int, list[str]] = {}
    for idx, bus_id in gpu_pci.items():
        p = pci_device_path(sysfs_root, bus_id)
        if p is None:
            log.debug("pci_gpu_path_missing", gpu=idx, bus_id=bus_id)
            continue
        gpu_paths[idx] = _pci_components(p)
    out: dict[str, int] = {}
    for key, nic_addr in nic_pci_by_key.items():
        if not nic_addr:
            continue
        p = pci_device_path(sysfs_root, nic_addr)
        if p is None:
            log.debug("pci_nic_path_missing", nic=key, pci=nic_addr)
            continue
        nic_parts = _pci_components(p)
        best_depth = 0
        best: list[int] = []
        for idx, gparts in gpu_paths.items():
            d = _shared_pci_depth(nic_parts, gparts)
            if d > best_depth:
                best_depth, best = d, [idx]
            elif d == best_depth and d > 0:
                best.append(idx)
        if len(best) == 1:
            out[key] = best[0]
        elif len(best) > 1:
            log.info("pci_pairing_ambiguous", nic=key, gpus=sorted(best))
    return out
