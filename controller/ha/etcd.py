"""Connecting to etcd (aetcd) and reading a whole prefix page by page at one revision."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aetcd
import aetcd.utils
import structlog

from controller.ha.config import HAConfig

log = structlog.get_logger(__name__)

PAGE = 1000  # keys per range request: stays under gRPC's 4 MiB message limit for row-sized values


class EtcdUnavailable(RuntimeError):
    """No configured etcd endpoint answered."""


async def connect(config: HAConfig) -> aetcd.Client:
    """A connected client for the first endpoint that answers a status request."""
    errors = []
    for endpoint in config.etcd:
        host, _, port = endpoint.rpartition(":")
        client = aetcd.Client(host=host.strip("[]"), port=int(port), timeout=max(1, round(config.etcd_timeout_s)))
        try:
            await client.connect()
            await client.status()
        except (aetcd.exceptions.ClientError, OSError) as exc:
            errors.append(f"{endpoint}: {exc}")
            await client.close()
            continue
        log.info("etcd_connected", endpoint=endpoint)
        return client
    raise EtcdUnavailable("no etcd endpoint answered: " + "; ".join(errors))


async def scan_prefix(client: aetcd.Client, prefix: bytes) -> AsyncIterator[tuple[int, list[Any]]]:
    """Yield (revision, key-values) pages of everything under prefix, all at one revision.

    aetcd's get_prefix returns one response, which breaks past gRPC's message limit; the
    request builder does not take a limit, so it is set on the built request here.
    """
    end = aetcd.utils.prefix_range_end(prefix)
    start = prefix
    revision = 0
    while True:
        request = client._build_get_range_request(start, range_end=end)
        request.limit = PAGE
        request.revision = revision
        response = await client.kvstub.Range(request, timeout=client._timeout, metadata=client.metadata)
        revision = revision or response.header.revision
        yield revision, list(response.kvs)
        if not response.more or not response.kvs:
            return
        start = response.kvs[-1].key + b"\0"
