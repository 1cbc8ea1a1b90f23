"""A fake ``pynvml`` found first on PYTHONPATH: the simulator's NVML with $FAKE_GPUS GPUs (default 0).

The real module is imported first (the fake reads its constants and error classes), then
this name is bound to the fake, so `starpulse scan --backend nvml` and a real agent process
read a node whose NVML answers for no GPU, or whose driver is missing ($FAKE_NVML_DRIVER=missing).
"""

import importlib
import os
import sys
import types

_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
del sys.modules[__name__]
real = importlib.import_module("pynvml")  # the real one, which the fake builds on

from agent.sim.fake_nvml import FakeNvml  # noqa: E402

fake = FakeNvml(
    gpu_count=int(os.environ.get("FAKE_GPUS", "0")), driver_missing=os.environ.get("FAKE_NVML_DRIVER") == "missing"
)
module = types.ModuleType(__name__, __doc__)
module.__dict__.update(real.__dict__)  # structs and constants as the real module has them
module.__dict__.update({name: getattr(fake, name) for name in dir(fake) if not name.startswith("_")})
sys.modules[__name__] = module
