"""A fake kernel log: appends /dev/kmsg-format records to a file that KmsgCollector tails.

The records look exactly like the kernel's (``prio,seq,usec,-;message``, increasing
seq and monotonic usec), so the real parser and classifier run unchanged in the sim.
"""

from __future__ import annotations

import os
import threading
import time

# syslog levels used by the messages we fake
KERN_ERR = 3
KERN_WARNING = 4
KERN_INFO = 6


class FakeKmsg:
    """Appends kernel records to ``path`` (created if missing). Thread-safe."""

    def __init__(self, path: str, start_seq: int = 1000, start_usec: int | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._seq = start_seq
        self._t0 = time.monotonic()
        self._usec0 = start_usec if start_usec is not None else 3_600_000_000  # an hour after "boot"
        self._last_usec = self._usec0 - 1
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        with open(path, "a"):
            pass

    def line(self, text: str, priority: int = KERN_INFO) -> str:
        """Append one record with ``text`` as its message; returns the record as written."""
        with self._lock:
            usec = self._usec0 + int((time.monotonic() - self._t0) * 1_000_000)
            usec = max(usec, self._last_usec + 1)
            self._last_usec = usec
            rec = f"{priority},{self._seq},{usec},-;{text}"
            self._seq += 1
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(rec + "\n")
            return rec

    def xid(self, pci: str, xid: int, message: str = "", pid: int = 4242, process: str = "python3") -> str:
        """An NVRM Xid line; ``pci`` is written as given (the driver prints "0000:9b:00")."""
        text = f"NVRM: Xid (PCI:{pci}): {xid}, pid={pid}, name={process}"
        if message:
            text += f", {message}"
        return self.line(text, KERN_WARNING)

    def fallen_off_bus(self, pci: str, with_xid: bool = False) -> str:
        """The driver's "GPU has fallen off the bus" line (optionally preceded by its Xid 79)."""
        if with_xid:
            short = pci.rsplit(".", 1)[0] if pci.count(":") == 2 and "." in pci else pci
            self.xid(short, 79, "GPU has fallen off the bus.", pid=0, process="<unknown>")
        return self.line(f"NVRM: GPU {pci}: GPU has fallen off the bus.", KERN_ERR)

    def mlx5_error(self, pci: str, text: str) -> str:
        """An mlx5_core line for the NIC at ``pci`` ("0000:17:00.0"), e.g. "Port module event[error]: …"."""
        return self.line(f"mlx5_core {pci}: {text}", KERN_ERR)

    @property
    def next_seq(self) -> int:
        """The seq the next record will carry."""
        return self._seq
