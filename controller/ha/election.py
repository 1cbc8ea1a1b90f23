"""Leader election on an etcd lease, and the fencing token every leader write carries.

The leader key holds the leader's advertised address and is attached to its lease:

    campaign: txn compare=[create(key) == 0] -> put(key, me, lease=l)

The winner's token is the key's create revision. Every later write of that leader is a
transaction whose compare includes ``create(key) == token`` (see ``fence_compare``): once
the lease has expired and another replica has created the key again, the old leader's
writes are refused by etcd itself, however late they arrive.

The leader also keeps a local deadline (time of the last keep-alive sent + the TTL it
got back). Before any scheduler action it must be inside that deadline, with a margin;
if keep-alives keep failing past it, ``lost`` is set and the replica must stop acting.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import aetcd
import structlog

log = structlog.get_logger(__name__)


class NotLeader(RuntimeError):
    """This replica does not (or no longer) hold the leader lease: it must not act."""


class Elector:
    """Campaigns for one leader key; after winning, keeps the lease alive until told to stop or it is lost."""

    def __init__(
        self,
        client: aetcd.Client,
        key: bytes,
        me: str,
        ttl_s: int,
        poll_interval_s: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.key = key
        self.me = me
        self.ttl_s = ttl_s
        self.poll_interval_s = poll_interval_s
        self._clock = clock
        self.lease: Any = None
        self.token = 0  # the leader key's create revision while we lead
        self.valid_until = 0.0  # local deadline of the lease (monotonic seconds)
        self.lost = asyncio.Event()
        self.current_leader = ""  # the leader's address as last seen while campaigning
        self._keepalive: asyncio.Task[None] | None = None

    # -- campaign ------------------------------------------------------------------------
    async def campaign(self, stop: asyncio.Event) -> bool:
        """Return True once this replica leads; False when stop is set first."""
        while not stop.is_set():
            try:
                if await self._try_once():
                    return True
            except aetcd.exceptions.ClientError as exc:
                log.warning("ha_campaign_etcd_error", detail=str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.poll_interval_s)
        return False

    async def _try_once(self) -> bool:
        kv = await self.client.get(self.key)
        if kv is not None:
            self.current_leader = kv.value.decode()
            return False
        self.current_leader = ""
        sent = self._clock()
        lease = await self.client.lease(self.ttl_s)
        t = self.client.transactions
        won, _ = await self.client.transaction(
            compare=[t.create(self.key) == 0],
            success=[t.put(self.key, self.me.encode(), lease=lease)],
            failure=[],
        )
        if not won:
            await lease.revoke()
            return False
        mine = await self.client.get(self.key)
        if mine is None or mine.lease != lease.id:  # expired in between: try again
            return False
        kv = mine
        self.current_leader = self.me
        self.lease, self.token = lease, kv.create_revision
        self.valid_until = sent + lease.ttl
        self._keepalive = asyncio.create_task(self._keep_alive())
        log.warning("ha_elected", me=self.me, token=self.token, ttl_s=lease.ttl)
        return True

    # -- while leading ---------------------------------------------------------------------
    async def _keep_alive(self) -> None:
        """Refresh the lease every third of its TTL; set ``lost`` when it runs out or is gone."""
        while not self.lost.is_set():
            await asyncio.sleep(self.ttl_s / 3)
            sent = self._clock()
            try:
                reply = await asyncio.wait_for(self.lease.refresh(), self.ttl_s / 3)
            except (aetcd.exceptions.ClientError, TimeoutError, OSError) as exc:
                log.warning("ha_keepalive_failed", detail=str(exc) or type(exc).__name__)
                if self._clock() >= self.valid_until:
                    self._lose("lease deadline passed without a keep-alive")
                continue
            if reply is None or reply.TTL <= 0:
                self._lose("etcd says the lease has expired")
                continue
            self.valid_until = sent + reply.TTL

    def _lose(self, why: str) -> None:
        if not self.lost.is_set():
            log.error("ha_leadership_lost", me=self.me, token=self.token, reason=why)
            self.lost.set()

    def holds(self, margin_s: float = 0.5) -> bool:
        """True while the lease is ours with at least margin_s of it left, by our own clock."""
        return self.token != 0 and not self.lost.is_set() and self._clock() + margin_s < self.valid_until

    def fence_compare(self) -> Any:
        """The compare every leader write carries: the leader key is still the one we created."""
        if self.token == 0:
            raise NotLeader("this replica has never been elected")
        return self.client.transactions.create(self.key) == self.token

    def refused(self) -> None:
        """A fenced write was refused by etcd: someone else leads now."""
        self._lose("a fenced write was refused (the leader key is no longer ours)")

    async def leader(self) -> str:
        """The current leader's advertised address, "" when there is none."""
        kv = await self.client.get(self.key)
        return kv.value.decode() if kv is not None else ""

    async def resign(self) -> None:
        """Give the key up now (graceful stop): a standby takes over without waiting for the TTL."""
        if self._keepalive is not None:
            self._keepalive.cancel()
            await asyncio.gather(self._keepalive, return_exceptions=True)
        if self.lease is not None and not self.lost.is_set():
            with contextlib.suppress(aetcd.exceptions.ClientError, OSError):
                await self.lease.revoke()
            log.info("ha_resigned", me=self.me, token=self.token)
        self.lost.set()

    async def close(self) -> None:
        """Stop the keep-alive without revoking (a crash-like exit leaves the lease to expire)."""
        if self._keepalive is not None:
            self._keepalive.cancel()
            await asyncio.gather(self._keepalive, return_exceptions=True)
