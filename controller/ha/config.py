"""The ``ha`` settings of a controller replica (units in names)."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_PREFIX = "/starpulse"


@dataclass
class HAConfig:
    """Several controller replicas coordinated by etcd; None in ControllerConfig: one controller on SQLite."""

    etcd: list[str] = field(default_factory=lambda: ["127.0.0.1:2379"])  # etcd client HOST:PORTs, tried in order
    # Every key lives under prefix/cluster/, so several starpulse installations can share one etcd.
    prefix: str = DEFAULT_PREFIX
    cluster: str = "default"
    # The leader's lease: a dead leader is replaced this long after its last keep-alive at the latest.
    lease_ttl_s: int = 5
    # The gRPC address standbys send agents and the CLI to when this replica leads ("" -> server.listen).
    advertise: str = ""
    # How often the leader pushes changed rows to etcd when nothing else (an ack, a scheduler action) did.
    flush_interval_s: float = 0.05
    # How long events stay in etcd (the new leader's history); node states, incidents, actions never expire.
    event_retention_s: float = 7 * 86400.0
    # A standby looks for a vacant leader key this often (failover = lease TTL + this, at most).
    poll_interval_s: float = 0.2
    etcd_timeout_s: float = 5.0  # per etcd request

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
