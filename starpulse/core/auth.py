"""Admin credentials for the controller's gRPC Admin and Query services.

The credential is a bearer token in gRPC metadata, ``authorization: Bearer <token>``,
compared with ``hmac.compare_digest`` against every configured token (tokens come from a
file, one per line; they are never logged). Rules:

- ``AuthConfig.admin_tokens is None``: dev mode, Admin RPCs are open (the controller
  logs a warning at start). Set: every Admin RPC needs a valid credential.
- ``open_reads`` (default True): Query RPCs are open. False: they need the same credential.
- No credential, or a malformed header: UNAUTHENTICATED. A wrong token: PERMISSION_DENIED.
- With mTLS, a client certificate whose identity (``starpulse.core.tls.peer_node_id`` rule) is
  in ``admin_cert_names`` also counts as the credential. Off by default (empty): with the
  CA signing node certificates, naming a certificate "admin" should be a deliberate choice.

Telemetry is protected by mTLS (identity from the certificate), health stays open. The
HTTP side (dashboard, /api, /metrics) has its own rules, ``HttpAuthConfig``: open by default
(loopback), or a bearer token / a client certificate for the dashboard and /api, with
/metrics open (Prometheus' plain scrape) or behind the same credential; /healthz stays open.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import grpc
import structlog

from starpulse.core.schema import ConfigError, setting
from starpulse.core.tls import peer_node_id

log = structlog.get_logger(__name__)

AUTH_HEADER = "authorization"
MIN_TOKEN_LEN = 16
ADMIN_PREFIX = "/starpulse.v1.Admin/"
QUERY_PREFIX = "/starpulse.v1.Query/"


class AuthConfigError(ConfigError):
    """A token file or auth setting that cannot be used."""


@dataclass
class AuthConfig:
    """Who may call Admin (and, with ``open_reads=False``, Query) RPCs."""

    admin_tokens: list[str] | None = None  # None: admin RPCs open (dev mode)
    open_reads: bool = setting(True, "Read-only API calls (nodes, events, incidents, topology) need no credentials")
    admin_cert_names: list[str] = setting([], "Mutual-TLS certificate names (CN/SAN) that count as admin")

    def __post_init__(self) -> None:
        if self.admin_tokens is not None:
            if not self.admin_tokens:
                raise AuthConfigError("admin_tokens is empty: give at least one token, or None for open admin")
            for t in self.admin_tokens:
                if len(t) < MIN_TOKEN_LEN or any(c.isspace() for c in t):
                    raise AuthConfigError(
                        f"an admin token is shorter than {MIN_TOKEN_LEN} characters or has whitespace"
                    )
        if not self.open_reads and self.admin_tokens is None and not self.admin_cert_names:
            raise AuthConfigError("closed reads need admin tokens or admin certificate names")

    @property
    def admin_open(self) -> bool:
        return self.admin_tokens is None and not self.admin_cert_names


@dataclass
class HttpAuthConfig:
    """Who may read the HTTP side. Tokens come from a file or the environment, never the settings file."""

    tls: bool = setting(
        True, "Serve HTTPS with the tls section's certificates when they are set; false: plain HTTP even then"
    )
    require_auth: bool = setting(
        False, "The dashboard and /api need a bearer token (token_file, $STARPULSE_HTTP_TOKEN) or a client certificate"
    )
    cert_names: list[str] = setting(
        [], "Client certificate names (CN/SAN) that may read; empty: any certificate the tls CA signed"
    )
    metrics: Literal["open", "auth"] = setting(
        "open", "/metrics: open (a plain Prometheus scrape, over TLS when it is on) or auth (the same credential)"
    )
    tokens: list[str] | None = None  # loaded from token_file / the environment; None: no token accepted

    def __post_init__(self) -> None:
        for t in self.tokens or ():
            if len(t) < MIN_TOKEN_LEN or any(c.isspace() for c in t):
                raise AuthConfigError(f"an HTTP token is shorter than {MIN_TOKEN_LEN} characters or has whitespace")


def load_tokens(path: Path | str, what: str = "admin") -> list[str]:
    """Tokens from a file, one per line; blank lines and ``#`` comments are skipped."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise AuthConfigError(f"{what} token file {str(p)!r} cannot be read: {exc.strerror or exc}") from exc
    tokens = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    if not tokens:
        raise AuthConfigError(f"{what} token file {str(p)!r} holds no token")
    return tokens


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying ``token``."""
    return ((AUTH_HEADER, f"Bearer {token}"),)


class Denied(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _presented_token(metadata: Sequence[tuple[str, Any]] | None) -> str | None:
    values = [v for k, v in (metadata or ()) if k.lower() == AUTH_HEADER]
    if not values:
        return None
    value = values[0].decode("utf-8", "replace") if isinstance(values[0], bytes) else str(values[0])
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Denied(grpc.StatusCode.UNAUTHENTICATED, "malformed authorization metadata: want 'Bearer <token>'")
    return token.strip()


def token_matches(token: str, tokens: Sequence[str]) -> bool:
    """Constant-time comparison against every configured token (no early exit)."""
    given = token.encode()
    ok = False
    for t in tokens:
        ok |= hmac.compare_digest(given, t.encode())
    return ok


def check_admin(config: AuthConfig, context: Any) -> str:
    """Who the caller is (``token``, ``cert:<name>`` or ``open``); Denied when not an admin."""
    if config.admin_open:
        return "open"
    if config.admin_cert_names:
        identity = peer_node_id(context)
        if identity is not None and identity in config.admin_cert_names:
            return f"cert:{identity}"
    token = _presented_token(context.invocation_metadata())
    if token is None:
        raise Denied(grpc.StatusCode.UNAUTHENTICATED, "an admin credential is required (authorization: Bearer)")
    if config.admin_tokens is None or not token_matches(token, config.admin_tokens):
        raise Denied(grpc.StatusCode.PERMISSION_DENIED, "the admin credential is not valid")
    return "token"


def _needs_credential(config: AuthConfig, method: str) -> bool:
    """Whether a call to ``method`` (``/package.Service/Method``) must carry the admin credential."""
    if method.startswith(ADMIN_PREFIX):
        return not config.admin_open
    if method.startswith(QUERY_PREFIX):
        return not config.open_reads
    return False


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Checks the admin credential before any Admin (or, with closed reads, Query) handler runs."""

    def __init__(self, config: AuthConfig) -> None:
        self.config = config

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = str(handler_call_details.method)
        if handler is None or not _needs_credential(self.config, method):
            return handler
        return _wrap(handler, self.config, method)


def _wrap(handler: grpc.RpcMethodHandler, config: AuthConfig, method: str) -> grpc.RpcMethodHandler:
    async def deny(context: grpc.aio.ServicerContext) -> None:
        try:
            how = check_admin(config, context)
        except Denied as denied:
            log.warning("auth_refused", method=method, peer=context.peer(), code=denied.code.name)
            await context.abort(denied.code, denied.message)
        else:
            log.debug("auth_ok", method=method, how=how)

    h: Any = handler
    if h.unary_unary is not None:
        inner_uu = h.unary_unary

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await deny(context)
            return await inner_uu(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, h.request_deserializer, h.response_serializer)
    if h.unary_stream is not None:
        inner_us = h.unary_stream

        async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await deny(context)
            async for item in inner_us(request, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(unary_stream, h.request_deserializer, h.response_serializer)
    if h.stream_unary is not None:
        inner_su = h.stream_unary

        async def stream_unary(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
            await deny(context)
            return await inner_su(request_iterator, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, h.request_deserializer, h.response_serializer)
    inner_ss = h.stream_stream

    async def stream_stream(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
        await deny(context)
        async for item in inner_ss(request_iterator, context):
            yield item

    return grpc.stream_stream_rpc_method_handler(stream_stream, h.request_deserializer, h.response_serializer)
