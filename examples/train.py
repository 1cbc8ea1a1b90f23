#!/usr/bin/env python3
"""A tiny stand-in for a training script (no GPUs): the starpulse job library end to end.

    python examples/train.py --job NAME --steps N [--step-time 0.2] [--checkpoint-dir D] ...

The script itself ships in the package (``python -m starpulse.app.train``, what ``starpulse
demo`` runs per rank in every install); this file runs it from a checkout. Its options and
output lines are documented there.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from starpulse.app.train import main

if __name__ == "__main__":
    sys.exit(main())
