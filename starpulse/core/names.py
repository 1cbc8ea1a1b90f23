"""Validation of names that reach stores, commands and other processes.

Node, switch and job names come from the network; they are checked here, once, before
they are used as keys or arguments anywhere.
"""

from __future__ import annotations

import re

_NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class InvalidName(ValueError):
    """A name that is empty, too long or carries characters we never pass on."""


def validate_node_id(node_id: str) -> str:
    """Return node_id when it is a safe host-like name (letters, digits, . _ -; ≤ 63 chars)."""
    if not _NODE_ID.fullmatch(node_id or ""):
        raise InvalidName(
            f"invalid node id {node_id!r}: use 1-63 letters, digits, '.', '_' or '-', starting alphanumeric"
        )
    return node_id
