"""structlog setup shared by every entry point: JSON lines for services, console for people."""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

import structlog


def configure_logging(
    level: str = "info", fmt: Literal["json", "console"] = "json", stream: TextIO | None = None
) -> None:
    """Route structlog (and stdlib logging) to stdout, one JSON object a line by default.

    JSON on stdout is what journald and log shippers ingest without parsing rules.
    Commands whose stdout is their output (scan --json) log to stderr instead.
    """
    out = stream or sys.stdout
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ValueError(f"log level {level!r} is not one of debug, info, warning, error")
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=out.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=numeric, stream=out, format="%(name)s %(levelname)s %(message)s", force=True)
