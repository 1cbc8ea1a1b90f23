"""Progress on stderr for what takes more than a few seconds: only when stderr is a terminal.

Piped or redirected (CI logs, ``2>file``), nothing extra is written: the output a script reads
stays exactly what it was. On a terminal rich draws a spinner with the elapsed time, or a bar
over a known duration, and removes it when done (``transient``), so the screen keeps only the
result. rich follows ``NO_COLOR`` for its colours.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Iterator
from typing import TextIO, TypeVar

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

T = TypeVar("T")


def _console(stream: TextIO | None) -> Console | None:
    out = stream or sys.stderr
    return Console(file=out, highlight=False) if out.isatty() else None


@contextlib.contextmanager
def status(message: str, stream: TextIO | None = None) -> Iterator[None]:
    """A spinner with ``message`` and the elapsed time while the block runs (terminal only)."""
    console = _console(stream)
    if console is None:
        yield
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        progress.add_task(message, total=None)
        yield


async def timed(work: Awaitable[T], message: str, total_s: float, stream: TextIO | None = None) -> T:
    """Await ``work`` while a bar fills over ``total_s`` seconds of wall time (terminal only)."""
    console = _console(stream)
    if console is None or total_s <= 0:
        return await work
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f} s"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(message, total=total_s)
        started = time.monotonic()
        job = asyncio.ensure_future(work)
        while not job.done():
            progress.update(task, completed=min(total_s, time.monotonic() - started))
            await asyncio.wait({job}, timeout=0.25)
        return job.result()
