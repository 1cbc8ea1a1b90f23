"""free_port hands out ports the kernel never gives an outgoing connection (a CI flake's cause)."""

from __future__ import annotations

import socket

import pytest

from tests.helpers import _ephemeral_range, free_port, free_ports


def test_ports_are_below_the_ephemeral_range_distinct_and_bindable() -> None:
    low, _ = _ephemeral_range()
    ports = free_ports(20)
    assert len(set(ports)) == 20
    assert all(10_000 <= p < low for p in ports)
    for port in ports[:3]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # raises if it was not free


def _listener_below_the_range() -> socket.socket:
    low, _ = _ephemeral_range()
    for port in range(low - 1, 10_000, -1):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            s.close()
            continue
        s.listen()
        return s
    raise AssertionError("no free port below the ephemeral range")


def test_a_port_with_a_listener_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The draw that hits a listening port (on loopback only) is skipped: the next draw is returned."""
    taken = _listener_below_the_range()
    try:
        held = taken.getsockname()[1]
        draws = iter([held, *range(held - 1, held - 100, -1)])
        monkeypatch.setattr("tests.helpers._rng.randrange", lambda a, b: next(draws))
        port = free_port()
        assert port != held and port < held
    finally:
        taken.close()
