"""The one registry of accelerator backends: built in, and plugins from the entry point group.

``--backend`` of the agent and of ``scan`` takes its choices from ``backend_names()``. A
plugin is a distribution that declares, in the ``starpulse.accelerators`` group, an entry
point whose object is a callable ``make(sink) -> AcceleratorBackend`` (a class will do); its
name is the ``--backend`` value. Entry points are listed without importing them, so a plugin
that fails to import cannot take any other backend down: it fails only when it is asked for,
and then in one line that names it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from agent.collectors.accel.base import AcceleratorBackend, BackendUnavailable
from agent.collectors.base import FindingSink

ENTRY_POINT_GROUP = "starpulse.accelerators"
SIM = "sim"  # the simulator: fakes at the hardware edge, picked by the factory, not here

Make = Callable[[FindingSink | None], AcceleratorBackend]


@dataclass(frozen=True)
class BackendSpec:
    """One backend: its ``--backend`` name, whose chips it reads, and how to build it here."""

    name: str
    vendor: str
    make: Make
    summary: str
    tool: str = ""  # what a "could not check" line names (NVML, amdsmi, npu-smi); "": the backend's name


def load_nvml() -> Any:
    """The real pynvml module, initialised; BackendUnavailable with one clear line otherwise."""
    import pynvml

    from agent.collectors.gpu import nvml_unavailable_reason

    reason = nvml_unavailable_reason(pynvml)
    if reason is not None:
        raise BackendUnavailable(reason)
    return pynvml


def _nvml(sink: FindingSink | None) -> AcceleratorBackend:
    from agent.collectors.gpu import NvmlGpuCollector

    return NvmlGpuCollector(load_nvml(), sink)


def _amd(sink: FindingSink | None) -> AcceleratorBackend:
    from agent.collectors.accel.amd import AmdGpuCollector, load_amdsmi

    return AmdGpuCollector(load_amdsmi(), sink)


def _ascend(sink: FindingSink | None) -> AcceleratorBackend:
    from agent.collectors.accel.ascend import AscendNpuCollector, load_hccn_tool, load_npu_smi, run_tool

    run = load_npu_smi()
    hccn = load_hccn_tool()
    if hccn is None:
        return AscendNpuCollector(run, sink)
    return AscendNpuCollector(run, sink, hccn=run_tool, hccn_tool=hccn)


BUILTIN: dict[str, BackendSpec] = {
    spec.name: spec
    for spec in (
        BackendSpec("nvml", "nvidia", _nvml, "NVIDIA GPUs through NVML (pynvml)", "NVML"),
        BackendSpec("amd", "amd", _amd, "AMD Instinct GPUs through AMD SMI (amdsmi, ROCm)", "amdsmi"),
        BackendSpec("ascend", "ascend", _ascend, "Huawei Ascend NPUs through npu-smi and hccn_tool", "npu-smi"),
    )
}


def plugin_entry_points() -> dict[str, metadata.EntryPoint]:
    """The installed plugins by name, not imported; a built-in name cannot be taken over."""
    found = metadata.entry_points(group=ENTRY_POINT_GROUP)
    return {ep.name: ep for ep in found if ep.name not in BUILTIN and ep.name != SIM}


def backend_names() -> tuple[str, ...]:
    """Every ``--backend`` choice: the built-in ones, the simulator, then installed plugins."""
    return (*BUILTIN, SIM, *sorted(plugin_entry_points()))


def backend(name: str) -> BackendSpec:
    """The spec of a hardware backend (not the simulator); a plugin is imported here, and only here."""
    if name in BUILTIN:
        return BUILTIN[name]
    ep = plugin_entry_points().get(name)
    if ep is None:
        raise ValueError(f"backend {name!r} is not one of {backend_names()}")
    try:
        make = ep.load()
    except Exception as exc:  # a plugin's import error is its own: one line, never the agent's traceback
        raise BackendUnavailable(f"accelerator plugin {name!r} ({ep.value}) failed to load: {exc!r}") from None
    if not callable(make):
        raise BackendUnavailable(f"accelerator plugin {name!r} ({ep.value}) is not callable")
    dist = ep.dist.name if ep.dist is not None else ep.value
    vendor = str(getattr(make, "vendor", name))
    return BackendSpec(name, vendor, make, f"plugin from {dist}", str(getattr(make, "tool", name)))


def vendor_and_tool(name: str) -> tuple[str, str]:
    """(vendor, tool) of a backend without building it; a plugin that fails to load is its own name."""
    spec = BUILTIN.get(name)
    if spec is not None:
        return spec.vendor, spec.tool
    ep = plugin_entry_points().get(name)
    if ep is None:
        return name, name
    try:
        make = ep.load()
    except Exception:  # already reported in one line by backend(); here only the names matter
        return name, name
    return str(getattr(make, "vendor", name)), str(getattr(make, "tool", name))


def build(name: str, sink: FindingSink | None) -> AcceleratorBackend:
    """The backend ``name`` built on this host's hardware; BackendUnavailable in one line otherwise."""
    spec = backend(name)
    try:
        made = spec.make(sink)
    except BackendUnavailable:
        raise
    except Exception as exc:  # a plugin's constructor failing is reported, not a traceback
        raise BackendUnavailable(f"backend {name!r} failed to start: {exc!r}") from None
    if not isinstance(made, AcceleratorBackend):
        raise BackendUnavailable(f"backend {name!r} made {type(made).__name__}, not an accelerator backend")
    return made
