"""The CLI's tables, drawn by ``rich``: a header row, columns sized to their content, colour on a terminal.

Colour follows the conventions every terminal tool shares: on when stdout is a terminal (or
``FORCE_COLOR`` is set), off when it is piped, and off whenever ``NO_COLOR`` is set (no escape
codes at all, bold included). Piped output is plain text, one line per row and never wrapped,
so ``grep``, ``awk`` and ``column`` keep working; a terminal gets the table at its width.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

PIPED_WIDTH = 100_000  # piped: never wrap a row

# Styles by a cell's own text, shared by every table that shows the word.
WORD_STYLES = {
    "fatal": "bold red",
    "critical": "red",
    "warning": "yellow",
    "info": "cyan",
    "online": "green",
    "unreachable": "bold red",
    "offline": "red",
    "open": "red",
    "resolved": "green",
    "yes": "green",
    "no": "red",
    "in_service": "green",
    "repairing": "yellow",
    "validating": "yellow",
    "evicted": "magenta",
    "retired": "dim",
    "running": "green",
    "restarting": "yellow",
}


@dataclass(frozen=True)
class Col:
    """One column: its header, alignment, and whether its cells take ``WORD_STYLES`` (``styled``)."""

    header: str
    justify: Literal["left", "right"] = "left"
    styled: bool = False
    style: str | None = None  # one style for the whole column


def colour_wanted(out: TextIO | None = None) -> bool:
    """Whether to draw with colour: a terminal (or FORCE_COLOR), and never with NO_COLOR."""
    if os.environ.get("NO_COLOR"):
        return False
    console = Console(file=out or sys.stdout)
    return console.is_terminal and console.color_system is not None


def render(cols: Sequence[Col], rows: Iterable[Sequence[object]], *, colour: bool, width: int | None = None) -> str:
    """The table as text (with ANSI styles when ``colour``); lines carry no trailing blanks."""
    table = Table(
        box=None,
        pad_edge=False,
        show_edge=False,
        padding=(0, 1),
        header_style="bold" if colour else None,
        highlight=False,
    )
    for c in cols:
        table.add_column(c.header, justify=c.justify, style=c.style if colour else None, overflow="fold")
    for row in rows:
        cells: list[Text] = []
        for c, value in zip(cols, row, strict=True):
            text = str(value)
            style = WORD_STYLES.get(text, "") if colour and c.styled else ""
            cells.append(Text(text, style=style))
        table.add_row(*cells)
    buf = io.StringIO()
    console = Console(
        file=buf,
        width=width or PIPED_WIDTH,
        force_terminal=colour,
        no_color=not colour,
        color_system="standard" if colour else None,
        highlight=False,
        emoji=False,
        markup=False,
    )
    console.print(table, soft_wrap=width is None)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines())


def print_table(cols: Sequence[Col], rows: Iterable[Sequence[object]], out: TextIO | None = None) -> None:
    """Print a table to ``out`` (stdout): coloured and fitted to a terminal, plain and unwrapped when piped."""
    stream = out or sys.stdout
    colour = colour_wanted(stream)
    width = Console(file=stream).width if colour and stream.isatty() else None
    text = render(cols, rows, colour=colour, width=width)
    print(text, file=stream, flush=True)
