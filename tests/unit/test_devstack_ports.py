"""The ports the local stack hands its servers: out of the kernel's ephemeral range (where an outgoing connection may
take a port before its server binds it), one stripe per pytest-xdist worker, never the same one twice."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tools import devstack


def ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


@pytest.mark.parametrize("worker", [0, 1, 2])
def test_each_worker_draws_below_the_ephemeral_range_in_a_stripe_of_its_own(
    worker: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
    first = min(10_000, ephemeral_low() // 2)
    stripe = (ephemeral_low() - first) // 3
    ports = [devstack.free_port() for _ in range(20)]
    assert all(first + worker * stripe <= p < first + (worker + 1) * stripe for p in ports), ports
    assert len(set(ports)) == 20  # none handed out twice, though nothing listens on them yet


def test_a_port_something_listens_on_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    first = min(10_000, ephemeral_low() // 2)
    workers = (ephemeral_low() - first) // 100  # stripes of 100 ports: the draws below cover a stripe
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(workers))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{workers // 2}")
    listeners = []
    for _ in range(50):  # listen on half the stripe's ports, then draw the rest: none may be one of them
        s = socket.socket()
        s.bind(("127.0.0.1", devstack.free_port()))
        s.listen()
        listeners.append(s)
    monkeypatch.setattr(devstack, "_HANDED_OUT", set())  # forgotten: only the bind check stands in the way
    taken = {s.getsockname()[1] for s in listeners}
    try:
        drawn = {devstack.free_port() for _ in range(40)}
        assert not taken & drawn
    finally:
        for s in listeners:
            s.close()
