"""Credentials on the HTTP side: a bearer token or a verified client certificate (``HttpAuthConfig``).

A request for the dashboard or /api carries one of:

- a client certificate the TLS handshake verified against the CA (``http.cert_names``, when
  set, must name it);
- ``Authorization: Bearer <token>`` (scripts, curl);
- the ``starpulse_token`` cookie, which ``/?token=<token>`` sets once and then redirects to
  the same address without the token (a browser cannot send a header by itself; the token
  then stays out of the address bar and history).

Tokens are compared in constant time (``token_matches``) and never logged. /healthz is always
open (probes); /metrics follows ``http.metrics``. Without a credential: 401 with a page saying
how to authenticate; a wrong one: 403.
"""

from __future__ import annotations

import html

import structlog
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from yarl import URL

from starpulse.core.auth import HttpAuthConfig, token_matches
from starpulse.core.tls import node_id_from_peercert

log = structlog.get_logger(__name__)

COOKIE = "starpulse_token"
ALWAYS_OPEN = frozenset({"/healthz"})

HOW = (
    "Send 'Authorization: Bearer <token>' (a token from the controller's http.token_file or "
    "$STARPULSE_HTTP_TOKEN), open /?token=<token> once in a browser, or present a client "
    "certificate signed by the controller's CA."
)


def _refusal(request: web.Request, status: int, why: str) -> web.Response:
    headers = {"WWW-Authenticate": 'Bearer realm="starpulse"', "Cache-Control": "no-store"}
    if "text/html" in request.headers.get("Accept", ""):
        body = (
            '<!doctype html><html><head><meta charset="utf-8"><title>starpulse: sign in</title></head>'
            f'<body><h1 id="auth-required">{html.escape(why)}</h1><p>{html.escape(HOW)}</p></body></html>'
        )
        return web.Response(status=status, text=body, content_type="text/html", headers=headers)
    return web.json_response({"error": why, "how": HOW}, status=status, headers=headers)


def _bearer(request: web.Request) -> str | None:
    value = request.headers.get("Authorization")
    if value is None:
        return None
    scheme, _, token = value.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else ""


def _certificate_ok(config: HttpAuthConfig, request: web.Request) -> bool:
    ssl_object = request.transport.get_extra_info("ssl_object") if request.transport is not None else None
    if ssl_object is None:
        return False
    cert = ssl_object.getpeercert()  # only a certificate the handshake verified is returned
    if not cert:
        return False
    if not config.cert_names:
        return True
    return node_id_from_peercert(cert) in config.cert_names


def same_origin_location(url: URL) -> str:
    """Where to send the browser after a ``?token=`` sign-in: the same path without the token,
    and always on this origin. A path that begins with several slashes or a backslash
    (``GET ////evil.example/x?token=...``) would otherwise be read as another host's address."""
    path = "/" + url.raw_path.lstrip("/\\")
    query = [(k, v) for k, v in url.query.items() if k != "token"]
    target = URL(path, encoded=True).with_query(query)
    return str(target)


def needs_credential(config: HttpAuthConfig, path: str) -> bool:
    """Whether a request for ``path`` must carry a credential under ``config``."""
    if path in ALWAYS_OPEN:
        return False
    if path == "/metrics":
        return config.metrics == "auth" and config.require_auth
    return config.require_auth


def auth_middleware(config: HttpAuthConfig, secure_cookie: bool) -> Middleware:
    """The aiohttp middleware enforcing ``config`` (``secure_cookie``: the site serves HTTPS)."""
    tokens = config.tokens or []

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not needs_credential(config, request.path):
            return await handler(request)
        if _certificate_ok(config, request):
            return await handler(request)
        query_token = request.query.get("token")
        if query_token is not None and request.method == "GET":
            if not tokens or not token_matches(query_token, tokens):
                log.warning("http_auth_refused", path=request.path, how="query", peer=request.remote)
                return _refusal(request, 403, "That token is not valid")
            response = web.Response(
                status=303, headers={"Location": same_origin_location(request.rel_url), "Cache-Control": "no-store"}
            )
            response.set_cookie(COOKIE, query_token, httponly=True, secure=secure_cookie, samesite="Strict", path="/")
            return response
        presented = _bearer(request)
        how = "header"
        if presented is None:
            presented, how = request.cookies.get(COOKIE), "cookie"
        if presented is None:
            return _refusal(request, 401, "Authentication required")
        if presented == "" or not tokens or not token_matches(presented, tokens):
            log.warning("http_auth_refused", path=request.path, how=how, peer=request.remote)
            return _refusal(request, 403, "That credential is not valid")
        return await handler(request)

    return middleware
