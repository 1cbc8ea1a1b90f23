"""The ``ha`` settings of a controller replica (units in names)."""

from __future__ import annotations

from dataclasses import dataclass

from starpulse.core.schema import setting

DEFAULT_PREFIX = "/starpulse"


@dataclass
class HAConfig:
    """Several controller replicas coordinated by etcd; None in ControllerConfig: one controller on SQLite."""

    etcd: list[str] = setting(["127.0.0.1:2379"], "etcd client addresses, tried in order", address=True, nonempty=True)
    prefix: str = setting(
        DEFAULT_PREFIX,
        "etcd key prefix: every key lives under prefix/cluster/, so several installations can share one etcd",
        nonempty=True,
    )
    cluster: str = setting("default", "This installation's name under the prefix", nonempty=True)
    lease_ttl_s: int = setting(
        5,
        "Seconds of the leader's lease: a dead leader is replaced this long after its last keep-alive at the latest",
        ge=2,
        le=60,
    )
    advertise: str = setting(
        "",
        "gRPC address standbys send agents and the CLI to while this replica leads; empty: server.listen",
        address=True,
        empty=True,
    )
    flush_interval_s: float = setting(
        0.05,
        "Seconds: the leader pushes changed rows to etcd this often when nothing else (an ack, a scheduler action) did",
        gt=0,
    )
    event_retention_s: float = setting(
        7 * 86400.0,
        "Seconds events stay in etcd (a new leader's history; 7 days); 0: forever. Node states, "
        "incidents and actions never expire",
        ge=0,
    )
    poll_interval_s: float = setting(
        0.2, "Seconds: a standby looks for a vacant leader key this often (failover: lease TTL + this)", gt=0
    )
    etcd_timeout_s: float = setting(5.0, "Seconds per etcd request", gt=0)

    def __post_init__(self) -> None:
        if not self.etcd:
            raise ValueError("ha.etcd needs at least one etcd HOST:PORT")
        if self.lease_ttl_s < 2:
            raise ValueError(f"ha.lease_ttl_s must be >= 2 (etcd's shortest lease), got {self.lease_ttl_s}")
        if not self.cluster or "/" in self.cluster:
            raise ValueError(f"ha.cluster must be a non-empty name without '/', got {self.cluster!r}")

    def key(self, *parts: str) -> bytes:
        """The etcd key prefix/cluster/parts... as bytes."""
        return "/".join([self.prefix.rstrip("/"), self.cluster, *parts]).encode()
