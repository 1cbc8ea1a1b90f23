#!/usr/bin/env python3
"""examples/train.py with ranks that truly wait on each other: a rendezvous every step.

    python examples/train_ranks.py --job NAME --rank R --world-size W --rendezvous HOST:PORT \\
        --steps N [--step-time 0.1] [--checkpoint-dir D] [--socket PATH] \\
        [--hang-rank R[,R...] --hang-step K --hang-where after_barrier|before_barrier]

Every step each rank works (sleeps ``--step-time``), then meets every other rank in a barrier
(rank 0 serves it over TCP: each rank sends ``step K`` and blocks until all W arrived, as an
all-reduce blocks), then reports the step to its node's agent through ``starpulse.job``. No
torch: the point is a real wait between real processes, so a rank that stops makes the
others stop where an NCCL collective would hold them.

``--hang-rank`` makes one rank spin in ``stuck_in_data_loader`` at ``--hang-step``: before the
barrier (its peers wait for it inside the barrier of that step, everyone at the same step)
or after it (its peers finish the step and wait in the next barrier: it is behind).

Output lines (stdout, flushed): ``start rank=R pid=PID``, ``step K``, and for the odd rank
``hang step=K where=W at=UNIX_TIME`` just before it spins.
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from starpulse.job import StarpulseJob


def serve_barrier(listener: socket.socket, world: int) -> None:
    """Rank 0's barrier: collect one ``step K`` line from every rank, then answer ``go`` to all."""
    conns = [listener.accept()[0] for _ in range(world)]
    files = [c.makefile("rwb") for c in conns]
    while True:
        for f in files:
            if not f.readline():
                return  # a rank left
        for f in files:
            f.write(b"go\n")
            f.flush()


def wait_for_peers(link: socket.socket, reader: object, step: int) -> None:
    """The collective: tell rank 0 this rank reached ``step`` and block until every rank did."""
    link.sendall(f"step {step}\n".encode())
    if not reader.readline():  # type: ignore[attr-defined]
        raise SystemExit("barrier closed")


def stuck_in_data_loader() -> None:
    """The odd rank's hang: never returns (a deadlocked data loader, a stuck file read)."""
    while True:
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--job", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--rendezvous", required=True, help="HOST:PORT rank 0 listens on")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--step-time", type=float, default=0.1)
    p.add_argument("--checkpoint-dir", default="checkpoints")
    p.add_argument("--socket", default=None)
    p.add_argument("--hang-rank", default="", help="rank(s) that hang, comma-separated")
    p.add_argument("--hang-step", type=int, default=0)
    p.add_argument("--hang-where", choices=("before_barrier", "after_barrier"), default="after_barrier")
    args = p.parse_args(argv)
    host, _, port = args.rendezvous.rpartition(":")
    if args.rank == 0:
        listener = socket.create_server((host, int(port)))
        threading.Thread(target=serve_barrier, args=(listener, args.world_size), daemon=True).start()
    deadline = time.monotonic() + 30
    while True:
        try:
            link = socket.create_connection((host, int(port)))
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    reader = link.makefile("rb")
    job = StarpulseJob(
        args.job,
        rank=args.rank,
        world_size=args.world_size,
        checkpoint_dir=args.checkpoint_dir,
        socket_path=args.socket,
        signal_number=None,
        reconnect_interval_s=0.5,
    )
    job.register()
    print(f"start rank={args.rank} pid={__import__('os').getpid()}", flush=True)
    odd = str(args.rank) in args.hang_rank.split(",")
    for step in range(1, args.steps + 1):
        started = time.monotonic()
        time.sleep(args.step_time)
        if odd and step == args.hang_step and args.hang_where == "before_barrier":
            print(f"hang step={step} where=before_barrier at={time.time():.3f}", flush=True)
            stuck_in_data_loader()
        wait_for_peers(link, reader, step)
        if odd and step == args.hang_step and args.hang_where == "after_barrier":
            print(f"hang step={step} where=after_barrier at={time.time():.3f}", flush=True)
            stuck_in_data_loader()
        job.step(step, time.monotonic() - started)
        print(f"step {step}", flush=True)
    job.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
