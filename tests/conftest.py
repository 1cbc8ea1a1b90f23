"""Fixtures every test gets."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog


def pytest_configure(config: pytest.Config) -> None:
    """Tracebacks in test logs as plain text.

    Unconfigured, structlog renders an exception with rich, every frame's locals included:
    an in-process agent's ``log.exception`` took 16 s of CPU on a loaded machine, and the
    event loop it shares with the test (the other agents, the test's own waits) stood still
    that long (tests/ha/test_failover_e2e.py timed out waiting for the new leader). The
    services log plain tracebacks too (``starpulse.core.logs`` formats exc_info first).
    """
    processors = [
        structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback)
        if isinstance(p, structlog.dev.ConsoleRenderer)
        else p
        for p in structlog.get_config()["processors"]
    ]
    structlog.configure(processors=processors)


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """Undo a test's logging configuration when it ends.

    A test that runs a command or a benchmark in-process has it call ``configure_logging``,
    which points structlog and the stdlib root logger at that test's captured stdout. pytest
    closes that stream when the test ends, and every later test on the same worker whose
    code logs (a collector's thread, the agent's buffer) then fails with "I/O operation on
    closed file", far from the cause.
    """
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    structlog.configure(**saved)
    root.handlers[:] = handlers
    root.setLevel(level)
