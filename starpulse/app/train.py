"""A tiny stand-in for a training script (no GPUs): the starpulse job library end to end.

Shipped in the package so that an installed starpulse's demo has ranks that train (issue 28);
``examples/train.py`` runs this same script from a checkout.

    python -m starpulse.app.train --job NAME --steps N --step-time 0.2 \\
        --checkpoint-dir D --checkpoint-every 10 [--rank R --world-size W --socket PATH]

It resumes from the latest complete checkpoint, reports every step to the node's agent,
checkpoints every --checkpoint-every steps and whenever asked (SIGUSR1 or the agent's
socket message), and exits 0 after step N. SIGTERM/SIGINT: checkpoint, then exit 143/130.

Output lines (stdout, one per line, flushed; tests and the Slurm end-to-end test parse them,
so keep them stable):

    start job=NAME rank=R world_size=W pid=PID
    resumed from step K            # or: "fresh start" when there is no complete checkpoint
    step K                         # after each finished step, K from 1
    checkpoint step K path=PATH    # after each checkpoint is complete
    done step N                    # the last line of a run that finished
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from types import FrameType

from starpulse.job import StarpulseJob

_stop_signal: list[int] = []


def _on_stop(signum: int, frame: FrameType | None) -> None:
    _stop_signal.append(signum)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--job", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--step-time", type=float, default=0.2, help="seconds per simulated step")
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--checkpoint-every", type=int, default=10, help="0: only when asked")
    p.add_argument("--rank", type=int, default=int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))))
    p.add_argument(
        "--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1")))
    )
    p.add_argument("--socket", default=None, help="agent job socket (default: $STARPULSE_JOB_SOCKET or /run/...)")
    args = p.parse_args(argv)

    def say(line: str) -> None:
        print(line, flush=True)

    signal.signal(signal.SIGTERM, _on_stop)
    signal.signal(signal.SIGINT, _on_stop)
    job = StarpulseJob(
        args.job,
        rank=args.rank,
        world_size=args.world_size,
        checkpoint_dir=args.checkpoint_dir,
        socket_path=args.socket,
    )
    say(f"start job={args.job} rank={args.rank} world_size={args.world_size} pid={os.getpid()}")
    resumed = job.resume()
    step, loss = 0, 10.0
    if resumed is None:
        say("fresh start")
    else:
        step, state = resumed
        loss = float(state["loss"]) if isinstance(state, dict) else loss
        say(f"resumed from step {step}")
    job.register()

    def checkpoint() -> None:
        path = job.save_checkpoint(step, {"step": step, "loss": loss})
        say(f"checkpoint step {step} path={path}")

    while step < args.steps:
        started = time.monotonic()
        time.sleep(args.step_time)  # the "work"
        step += 1
        loss *= 0.99
        job.step(step, time.monotonic() - started)
        say(f"step {step}")
        if _stop_signal:
            checkpoint()
            job.close()
            return 128 + _stop_signal[0]
        if job.checkpoint_requested or (args.checkpoint_every and step % args.checkpoint_every == 0):
            checkpoint()
    if job.last_checkpoint is None or job.last_checkpoint[0] != step:
        checkpoint()
    say(f"done step {step}")
    job.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
