"""Every rule kind, listed once, in order.

The order is that of the rules file's "expected one of" texts and of evaluation within a
component (a GPU's kinds are asked in this order, then its links'). A kind listed twice is
an error when this module is imported. To add a kind: write its evaluator in the module of
its family and add one line here.
"""

from __future__ import annotations

from controller.detect.evaluators.base import Registry
from controller.detect.evaluators.events import EventRule
from controller.detect.evaluators.fields import GpuField, NicField
from controller.detect.evaluators.gpu import (
    GpuClockReasons,
    GpuFlag,
    GpuMissing,
    GpuRecoveryAction,
    NvLinkDown,
    NvLinkErrors,
)
from controller.detect.evaluators.host import HostDisk, HostMemory
from controller.detect.evaluators.nic import NicCounter, NicMissing, NicRate, NicState
from controller.detect.evaluators.presence import Heartbeat, SwitchSilent
from controller.detect.evaluators.switch import PfcWatchdog, SwitchOptics, SwitchPortState

REGISTRY = Registry(
    (
        EventRule,
        GpuFlag,
        GpuRecoveryAction,
        GpuClockReasons,
        GpuField,
        GpuMissing,
        NvLinkDown,
        NvLinkErrors,
        NicState,
        NicField,
        NicCounter,
        NicRate,
        NicMissing,
        SwitchPortState,
        PfcWatchdog,
        SwitchOptics,
        HostDisk,
        HostMemory,
        Heartbeat,
        SwitchSilent,
    )
)
