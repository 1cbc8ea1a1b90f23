"""structlog setup shared by every entry point: JSON lines for services, console for people."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any, Literal, TextIO

import structlog
from structlog.typing import EventDict, Processor


def configure_logging(
    level: str = "info",
    fmt: Literal["json", "console"] = "json",
    stream: TextIO | None = None,
    fields: Mapping[str, str] | None = None,
) -> None:
    """Route structlog (and stdlib logging) to stdout, one JSON object a line by default.

    JSON on stdout is what journald and log shippers ingest without parsing rules.
    Commands whose stdout is their output (scan --json) log to stderr instead.
    ``fields`` go on every line (an agent's ``node``): a line such as ``rdma_link_down
    port=mlx5_3/1`` is useless in a fleet's log store without the node it came from, and
    contextvars do not reach the collectors' own threads.
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
            _with_fields(dict(fields or {})),
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


def _with_fields(fields: dict[str, str]) -> Processor:
    """A processor adding ``fields`` to every event that does not carry them already."""

    def add(_logger: Any, _method: str, event: EventDict) -> EventDict:
        for key, value in fields.items():
            event.setdefault(key, value)
        return event

    return add
