"""Endpoint routing, eviction after repeated failures, and re-admission when /health answers again."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from regen.sglang.fleet import EndpointPool, FleetUnavailable
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
