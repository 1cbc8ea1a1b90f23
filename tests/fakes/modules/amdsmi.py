"""A fake ``amdsmi`` found first on PYTHONPATH: the simulator's AMD SMI with $FAKE_GPUS GPUs (default 0).

`starpulse scan --backend amd` and a real agent process import it by its real name and read a
node whose AMD SMI answers for no GPU, or whose driver is not loaded ($FAKE_AMD_DRIVER=missing).
"""

import os
import sys

from agent.sim.fake_amdsmi import FakeAmdSmi

sys.modules[__name__] = FakeAmdSmi(  # type: ignore[assignment]
    gpu_count=int(os.environ.get("FAKE_GPUS", "0")), driver_missing=os.environ.get("FAKE_AMD_DRIVER") == "missing"
)
