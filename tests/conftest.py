"""Fixtures every test gets."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog


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
