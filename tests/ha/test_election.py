"""Leader election and fencing against a real etcd."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aetcd
import pytest

from controller.ha.config import HAConfig
from controller.ha.election import Elector, NotLeader
from controller.ha.etcd import EtcdUnavailable, connect
from tests.etcd_server import EtcdServer
from tests.helpers import free_port, wait_for


@pytest.fixture
async def clients(etcd: EtcdServer) -> AsyncIterator[list[aetcd.Client]]:
    config = HAConfig(etcd=[etcd.endpoint])
    out = [await connect(config) for _ in range(2)]
    yield out
    for c in out:
        await c.close()


def elector(client: aetcd.Client, me: str, ttl_s: int = 2) -> Elector:
    return Elector(client, HAConfig().key("leader"), me, ttl_s, poll_interval_s=0.05)


class TestElector:
    async def test_one_of_two_wins_and_the_other_sees_it(self, clients: list[aetcd.Client]) -> None:
        """Two campaigns: exactly one leads; the other keeps campaigning and knows the leader's address."""
        a, b = elector(clients[0], "10.0.0.1:50051"), elector(clients[1], "10.0.0.2:50051")
        stop = asyncio.Event()
        assert await a.campaign(stop)
        loser = asyncio.create_task(b.campaign(stop))
        await wait_for(lambda: b.current_leader == "10.0.0.1:50051", 5, "the standby to see the leader")
        assert not loser.done()
        assert a.holds() and not b.holds()
        assert await b.leader() == "10.0.0.1:50051"
        stop.set()
        assert await loser is False
        await a.resign()

    async def test_keepalive_holds_the_key_past_its_ttl(self, clients: list[aetcd.Client]) -> None:
        """A leader that keeps its lease alive still leads after 1.5 TTLs."""
        a = elector(clients[0], "a:1")
        assert await a.campaign(asyncio.Event())
        await asyncio.sleep(3.0)
        assert a.holds() and await a.leader() == "a:1" and not a.lost.is_set()
        await a.resign()

    async def test_resign_hands_over_at_once(self, clients: list[aetcd.Client]) -> None:
        """A graceful resign deletes the key: the standby leads without waiting for the TTL."""
        a, b = elector(clients[0], "a:1", ttl_s=30), elector(clients[1], "b:1", ttl_s=30)
        assert await a.campaign(asyncio.Event())
        task = asyncio.create_task(b.campaign(asyncio.Event()))
        await a.resign()
        assert await asyncio.wait_for(task, 5)
        assert b.token > a.token
        await b.resign()

    async def test_expired_lease_marks_leadership_lost(self, clients: list[aetcd.Client]) -> None:
        """When the lease is gone (revoked here, as if it expired), the keep-alive sets lost."""
        a = elector(clients[0], "a:1")
        assert await a.campaign(asyncio.Event())
        await clients[1].revoke_lease(a.lease.id)
        await wait_for(a.lost.is_set, 5, "the leader to notice its lease is gone")
        assert not a.holds()
        await a.close()


class TestFencing:
    async def test_deposed_leaders_write_is_refused(self, clients: list[aetcd.Client]) -> None:
        """After A's lease is gone and B leads, a write carrying A's fencing compare changes nothing."""
        a, b = elector(clients[0], "a:1"), elector(clients[1], "b:1")
        assert await a.campaign(asyncio.Event())
        fence_a = a.fence_compare()
        await clients[1].revoke_lease(a.lease.id)
        assert await b.campaign(asyncio.Event())
        t = clients[0].transactions
        ok, _ = await clients[0].transaction(compare=[fence_a], success=[t.put(b"/probe", b"from-a")], failure=[])
        assert not ok
        assert await clients[0].get(b"/probe") is None
        ok, _ = await clients[1].transaction(
            compare=[b.fence_compare()], success=[t.put(b"/probe", b"from-b")], failure=[]
        )
        assert ok and (await clients[0].get(b"/probe")).value == b"from-b"
        await a.close()
        await b.resign()

    def test_never_elected_has_no_fence(self) -> None:
        """A replica that never won cannot build a fencing compare (so it cannot write)."""
        e = Elector(None, b"/k", "me:1", 2)
        with pytest.raises(NotLeader):
            e.fence_compare()
        assert not e.holds()


class TestConnect:
    async def test_unreachable_etcd_is_a_clear_error(self) -> None:
        """No etcd answering: EtcdUnavailable naming the endpoint."""
        endpoint = f"127.0.0.1:{free_port()}"
        with pytest.raises(EtcdUnavailable, match=endpoint):
            await connect(HAConfig(etcd=[endpoint], etcd_timeout_s=1))

    def test_config_is_checked(self) -> None:
        """Settings etcd cannot honour are refused up front."""
        with pytest.raises(ValueError, match="lease_ttl_s"):
            HAConfig(lease_ttl_s=1)
        with pytest.raises(ValueError, match="cluster"):
            HAConfig(cluster="a/b")
