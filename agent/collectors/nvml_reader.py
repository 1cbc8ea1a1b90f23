"""One NVML device's reads, each failure sorted the way ``nvml_errors`` says.

A metric the device or driver does not support is absent (None), never 0; a lost GPU or
one that needs a reset flags the reader, so the sample says so; other errors are logged
once per (GPU, function, code) through the collector's ``warn``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.collectors.nvml_errors import Outcome, sort_error
from starpulse.core import vocab

# (GpuSample NvLinkSample field, NVML_NVLINK_ERROR_DL_* counter)
_NVLINK_COUNTERS = tuple((name, counter) for counter, name in enumerate(vocab.NVLINK_ERROR_COUNTERS))


class DeviceReader:
    """Calls NVML for one device; a failed read is absent and sets the flags nvml_errors gives it."""

    def __init__(self, nvml: Any, handle: Any, index: int, warn: Callable[[int, str, BaseException], None]) -> None:
        self._nvml = nvml
        self._handle = handle
        self.index = index
        self._warn = warn
        self.lost = False
        self.reset_required = False

    def call(self, fn_name: str, *args: Any, link: bool = False) -> Any:
        """Result of ``nvml.<fn_name>(handle, *args)``, or None when the value is absent."""
        if self.lost:
            return None
        fn = getattr(self._nvml, fn_name, None)
        if fn is None:  # older bindings
            return None
        try:
            return fn(self._handle, *args)
        except self._nvml.NVMLError as err:
            self.failed(sort_error(err, link=link), fn_name, err)
        return None

    def failed(self, outcome: Outcome, what: str, err: BaseException) -> None:
        """Record one failed read: lost and reset-required flag the sample, other errors are logged."""
        if outcome is Outcome.LOST:
            self.lost = True
        elif outcome is Outcome.RESET_REQUIRED:
            self.reset_required = True
        elif outcome is Outcome.OTHER:
            self._warn(self.index, what, err)

    def link_counters(self, link: int) -> dict[str, Any]:
        """One link's _NVLINK_COUNTERS that NVML gives (NvLinkSample keyword arguments), as call() reads each.

        One loop over the function instead of a call() per counter: a full read asks for
        90 counters per GPU, and call()'s lookup per value was a measurable share of them.
        """
        out: dict[str, Any] = {}
        fn = getattr(self._nvml, "nvmlDeviceGetNvLinkErrorCounter", None)
        if fn is None:  # older bindings
            return out
        for attr, counter in _NVLINK_COUNTERS:
            if self.lost:
                break
            try:
                value = fn(self._handle, link, counter)
            except self._nvml.NVMLError as err:
                self.failed(sort_error(err, link=True), "nvmlDeviceGetNvLinkErrorCounter", err)
                continue
            if value is not None:
                out[attr] = int(value)
        return out
