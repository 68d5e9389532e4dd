"""Endpoint routing, eviction after repeated failures, and re-admission when /health answers again."""

from __future__ import annotations

import asyncio
import re
import socket
from pathlib import Path

import aiohttp
import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from regen.sglang.fleet import EndpointPool, FleetUnavailable, NothingListens, health_problem, readiness
from tests.conftest import free_port, start_simulator


async def _pool_scenario(tmp_path: Path, port: int) -> list[str]:
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as session:
        pool = EndpointPool([url, "http://127.0.0.1:1"], session, evict_after=2, probe_interval_s=0.1, fleet_wait_s=30)
        events = []
        a = await pool.acquire()
        b = await pool.acquire()
        events.append(f"spread:{a.url != b.url}")  # least outstanding: one request each
        pool.release(a, ok=True)
        pool.release(b, ok=True)
        avoided = await pool.acquire(avoid=url)
        events.append(f"avoided:{avoided.url != url}")
        pool.release(avoided, ok=True)
        for endpoint in pool.endpoints:
            for _ in range(2):
                endpoint.outstanding += 1  # as acquire() would
                pool.release(endpoint, ok=False)
        events.append(f"evicted:{[e.evicted for e in pool.endpoints]}")
        sim = await asyncio.to_thread(start_simulator, tmp_path, port=port)  # the endpoint comes back
        try:
            back = await asyncio.wait_for(pool.acquire(), timeout=30)
            events.append(f"readmitted:{back.url == url}")
        finally:
            sim.process.terminate()
            await pool.close()
        return events


def test_eviction_and_readmission(tmp_path: Path) -> None:
    events = asyncio.run(_pool_scenario(tmp_path, free_port()))
    assert events == ["spread:True", "avoided:True", "evicted:[True, True]", "readmitted:True"]


async def _dead_fleet() -> None:
    async with aiohttp.ClientSession() as session:
        pool = EndpointPool(
            [f"http://127.0.0.1:{free_port()}"], session, evict_after=1, probe_interval_s=0.1, fleet_wait_s=0.5
        )
        endpoint = await pool.acquire()
        pool.release(endpoint, ok=False)
        try:
            await pool.acquire()
        finally:
            await pool.close()


def test_a_dead_fleet_fails_with_a_clear_message() -> None:
    with pytest.raises(FleetUnavailable, match=r"every SGLang endpoint is failing .* none answered /health within"):
        asyncio.run(_dead_fleet())


def test_load_signals_do_not_evict() -> None:
    async def scenario() -> bool:
        async with aiohttp.ClientSession() as session:
            pool = EndpointPool(["http://127.0.0.1:1"], session, evict_after=1)
            endpoint = await pool.acquire()
            pool.release(endpoint, ok=False, counts_against_endpoint=False)  # e.g. 503 queue full
            return endpoint.evicted

    assert asyncio.run(scenario()) is False


class NoSuchHost(AbstractResolver):
    """A name lookup that fails as an unknown host does, without asking any DNS server."""

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[ResolveResult]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    async def close(self) -> None:
        return None


async def _readiness(url: str, resolver: AbstractResolver | None = None) -> str | None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(resolver=resolver)) as session:
        return await readiness(session, url)


@pytest.mark.parametrize(
    "url,resolver,cause",
    [
        pytest.param(f"http://127.0.0.1:{free_port()}", None, "connection refused", id="refused"),
        pytest.param("http://sglang-0.fleet.example:30000", NoSuchHost(), "unknown host", id="unknown-host"),
    ],
)
def test_where_nothing_listens_readiness_fails_at_once(url: str, resolver: AbstractResolver | None, cause: str) -> None:
    with pytest.raises(NothingListens, match=rf"^{re.escape(url)}: nothing listens there \({cause}: "):
        asyncio.run(_readiness(url, resolver))


def test_a_warming_server_is_not_ready_yet(tmp_path: Path) -> None:
    warming = start_simulator(tmp_path, "--warmup-s", "60")
    try:
        assert asyncio.run(_readiness(warming.url)) == "HTTP 503"
    finally:
        warming.stop()


def test_an_evicted_endpoint_that_is_down_is_just_not_back_yet() -> None:
    async def scenario(url: str) -> str | None:
        async with aiohttp.ClientSession() as session:
            return await health_problem(session, url)  # the pool's probe: a problem, not an error

    url = f"http://127.0.0.1:{free_port()}"
    problem = asyncio.run(scenario(url))
    assert problem is not None and problem.startswith(f"{url}: nothing listens there (connection refused: ")
