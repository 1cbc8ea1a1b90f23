"""No credential reaches a log through aiohttp's own logging.

aiohttp logs a request it cannot parse ("Error handling request", with the parser's
exception) before any middleware runs: an over-long query line carries its ``?token=``, an
over-long or malformed header its ``Authorization: Bearer`` or ``starpulse_token`` cookie, as
the parser quoted them. ``redact`` removes those from every record of aiohttp's loggers
(message, arguments and the formatted exception), and ``install`` puts the filter on them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

REDACTED = "<redacted>"
AIOHTTP_LOGGERS = ("aiohttp.server", "aiohttp.web", "aiohttp.access", "aiohttp.internal")

# A credential after its name, up to what ends it in a URL, header, cookie or Python repr.
_PATTERNS = (
    re.compile(r"(?i)([?&;]token=)[^&\s'\"\\]*"),
    re.compile(r"(?i)(bearer\s+)[^\s'\"\\]*"),
    re.compile(r"(?i)(starpulse_token=)[^;\s'\"\\]*"),
    re.compile(r"(?i)(authorization:\s*)[^\r\n'\"\\]*"),
    re.compile(r"(?i)(cookie:\s*)[^\r\n'\"\\]*"),
)
MIN_SECRET_PREFIX = 8  # a quoted line cut short may end in the first part of a token


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` without credentials: named ones by pattern, configured ones (and their first
    MIN_SECRET_PREFIX+ characters where a quote was cut off) wherever they appear."""
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
    for secret in secrets:
        if secret and secret in text:
            text = text.replace(secret, REDACTED)
        elif len(secret) > MIN_SECRET_PREFIX:
            for n in range(len(secret) - 1, MIN_SECRET_PREFIX - 1, -1):
                cut = secret[:n]
                if cut in text:
                    text = text.replace(cut, REDACTED)
                    break
    return text


class CredentialFilter(logging.Filter):
    """Rewrites a record so that neither its message nor its traceback holds a credential."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.exc_info and record.exc_info[0] is not None:
            # The parser's exception quotes the raw bytes: keep its type and redacted text only.
            exc = record.exc_info[1]
            message = f"{message}: {type(exc).__name__}: {exc}"
            record.exc_info = None
            record.exc_text = None
        record.msg = redact(message, self.secrets)
        record.args = None
        return True


def install(secrets: Iterable[str] = ()) -> CredentialFilter:
    """Put one ``CredentialFilter`` on each of aiohttp's loggers (again: replaced, not stacked)."""
    flt = CredentialFilter(secrets)
    for name in AIOHTTP_LOGGERS:
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, CredentialFilter)]:
            logger.removeFilter(old)
        logger.addFilter(flt)
    return flt
