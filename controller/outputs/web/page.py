"""The dashboard page itself: ``/`` and its static assets.

A snapshot (``/?live=0``, for screenshots and reports) carries its data inside the page, in
``<script id="snapshot" type="application/json">``, so the script draws everything while the
document is parsed, before the load event. It used to draw only once four fetches had
answered, and a screenshot that does not wait for them (Chromium's ``--screenshot``, which
waits for nothing the page does) could catch an empty fabric panel. Every render, live or
not, ends by setting ``<body data-ready="1">`` for harnesses that can wait on the DOM.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from controller.outputs.web import STATIC_DIR

SNAPSHOT_SLOT = '<script id="snapshot" type="application/json"></script>'
SNAPSHOT_INCIDENT_LIMIT = 200  # as many as the live page asks for

Snapshot = Callable[[], dict[str, Any]]


def embed(page: str, data: dict[str, Any]) -> str:
    """The page with ``data`` in its snapshot slot; ``<`` escaped so no string can close the script."""
    if SNAPSHOT_SLOT not in page:
        raise ValueError("index.html has no snapshot slot")
    body = json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")
    return page.replace(SNAPSHOT_SLOT, SNAPSHOT_SLOT.replace("></script>", f">{body}</script>"), 1)


def add_page_routes(app: web.Application, snapshot: Snapshot) -> None:
    """``/`` (live, or with embedded data for ``?live=0``) and ``/static/``."""

    async def index(request: web.Request) -> web.StreamResponse:
        headers = {"Cache-Control": "no-cache"}
        if request.query.get("live") != "0":
            return web.FileResponse(STATIC_DIR / "index.html", headers=headers)
        page = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
        return web.Response(text=embed(page, snapshot()), content_type="text/html", headers=headers)

    app.router.add_get("/", index)
    app.router.add_static("/static/", STATIC_DIR)
