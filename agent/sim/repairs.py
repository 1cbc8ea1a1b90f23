"""What a simulated node does when the controller repairs it: the hardware edge of the repair loop.

A real node resets a GPU with ``nvidia-smi -r`` and reboots with ``systemctl reboot``; a
simulated one has fake GPUs in this process, so its agent answers those two commands here
(``CommandHandler.local``): a reset ends the faults injected on its GPUs, a reboot drops the
agent's stream for a few seconds, ends every fault and comes back with a new boot id, the
way a real agent comes back after a reboot. Faults must be injected through ``inject`` so
the node knows which are active.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Protocol

import structlog

from agent.sim.node import SimNode

log = structlog.get_logger(__name__)


class RepairableAgent(Protocol):
    """The parts of an ``agent.runtime.Agent`` a simulated repair touches (sim sits below runtime)."""

    boot_id: str

    @property
    def commands(self) -> Any: ...  # CommandHandler: its ``local`` actions
    @property
    def link(self) -> Any: ...  # ControllerLink: set_blocked


class SimRepairs:
    def __init__(self, agent: RepairableAgent, sim: SimNode, reboot_s: float = 3.0) -> None:
        self.agent = agent
        self.sim = sim
        self.reboot_s = reboot_s
        self.active: list[tuple[str, str, dict[str, Any]]] = []
        self.resets = 0
        self.reboots = 0
        self._tasks: set[asyncio.Task[None]] = set()
        agent.commands.local.update(gpu_reset=self.gpu_reset, reboot=self.reboot)

    def inject(self, kind: str, target: str, **params: Any) -> None:
        self.sim.inject(kind, target, **params)
        self.active.append((kind, target, dict(params)))

    def clear(self, kind: str, target: str, **params: Any) -> bool:
        """End a fault if it is still active (a repair may have ended it first); True when it was."""
        item = (kind, target, dict(params))
        if item not in self.active:
            return False
        self.active.remove(item)
        self.sim.clear(kind, target, **params)
        return True

    def _clear(self, only_gpus: bool) -> int:
        done = [f for f in self.active if not only_gpus or f[1].startswith("gpu-")]
        for kind, target, params in done:
            self.clear(kind, target, **params)
        return len(done)

    async def gpu_reset(self, args: dict[str, str]) -> tuple[bool, str]:
        self.resets += 1
        n = self._clear(only_gpus=True)
        return True, f"sim GPU reset ({'all GPUs' if 'gpu' not in args else 'gpu ' + args['gpu']}): {n} fault(s) ended"

    async def reboot(self, args: dict[str, str]) -> tuple[bool, str]:
        self.reboots += 1
        task = asyncio.create_task(self._reboot())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True, f"sim reboot in {self.reboot_s:g}s"

    async def _reboot(self) -> None:
        await asyncio.sleep(0.3)  # let the answer go out first, as a real agent's would before systemd stops it
        self.agent.link.set_blocked(True)
        await asyncio.sleep(self.reboot_s)
        n = self._clear(only_gpus=False)
        self.agent.boot_id = str(uuid.uuid4())
        log.info("sim_rebooted", node=self.sim.node_id, faults_ended=n, boot_id=self.agent.boot_id)
        self.agent.link.set_blocked(False)
