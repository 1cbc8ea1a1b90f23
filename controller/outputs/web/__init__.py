"""The controller's web dashboard: JSON endpoints (``api``) and static assets (``static/``)."""

from __future__ import annotations

from pathlib import Path

STATIC_DIR = Path(__file__).parent / "static"

__all__ = ["STATIC_DIR"]
