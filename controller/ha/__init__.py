"""Controller high availability: several replicas, one leader elected through an etcd lease.

Why: a health controller that dies with its node is one more single point of failure.
The pieces, one job each:

- ``config``: the ``ha`` settings (etcd endpoints, lease TTL, the address agents are sent to).
- ``etcd``: connecting to etcd and paging through a prefix.
- ``election``: the leader key under a lease, its keep-alive, and the fencing token.
- ``mirror``: every durable SQLite row mirrored into etcd by fenced transactions; a new
  leader restores from it, standbys follow it to answer reads.
- ``fenced``: the scheduler wrapper that checks the lease before every action.
- ``standby``: what a standby serves (reads) and refuses (agent streams, admin writes,
  with the leader's address).
- ``controller.replica`` (one floor up, beside the service it runs): one controller process,
  standby until elected, then the full controller.

A single controller on SQLite (no ``ha`` section) stays the default and needs none of this.
"""

from controller.ha.config import HAConfig

__all__ = ["HAConfig"]
