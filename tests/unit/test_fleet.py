"""Endpoint routing, outlier ejection (flaky kept, dead out), backpressure, and re-admission when /health answers."""

from __future__ import annotations

import asyncio
import random
import re
import socket
from pathlib import Path

import aiohttp
import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from regen.sglang.fleet import (
    EndpointPool,
    FleetUnavailable,
    NothingListens,
    OutlierPolicy,
    health_problem,
    readiness,
)
from tests.conftest import free_port, start_simulator

FAST = OutlierPolicy(base_ejection_s=0.05)


async def answer(pool: EndpointPool, url: str, cause: str | None) -> None:
    """One request to `url` and its outcome, as the client reports it."""
    endpoint = next(e for e in pool.endpoints if e.url == url)
    endpoint.outstanding += 1  # as acquire() would
    pool.release(endpoint, cause)


async def _pool_scenario(tmp_path: Path, port: int) -> list[str]:
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as session:
        pool = EndpointPool([url, "http://127.0.0.1:1"], session, FAST, probe_interval_s=0.1, fleet_wait_s=30)
        events = []
        a = await pool.acquire()
        b = await pool.acquire()
        events.append(f"spread:{a.url != b.url}")  # least outstanding: one request each
        pool.release(a, None)
        pool.release(b, None)
        avoided = await pool.acquire(avoid=url)
        events.append(f"avoided:{avoided.url != url}")
        pool.release(avoided, None)
        for endpoint in pool.endpoints:  # nothing answers anywhere: dead endpoints are out whatever the cap
            for _ in range(FAST.dead_after):
                await answer(pool, endpoint.url, "connection")
        events.append(f"ejected:{[e.ejected for e in pool.endpoints]}")
        sim = await asyncio.to_thread(start_simulator, tmp_path, port=port)  # the endpoint comes back
        try:
            back = await asyncio.wait_for(pool.acquire(), timeout=30)
            events.append(f"readmitted:{back.url == url}")
        finally:
            sim.process.terminate()
            await pool.close()
        return events


def test_dead_endpoints_are_ejected_and_readmitted_when_health_answers(tmp_path: Path) -> None:
    events = asyncio.run(_pool_scenario(tmp_path, free_port()))
    assert events == ["spread:True", "avoided:True", "ejected:[True, True]", "readmitted:True"]


async def _dead_fleet() -> None:
    async with aiohttp.ClientSession() as session:
        policy = OutlierPolicy(dead_after=1, base_ejection_s=0.01)
        pool = EndpointPool(
            [f"http://127.0.0.1:{free_port()}"], session, policy, probe_interval_s=0.1, fleet_wait_s=0.5
        )
        endpoint = await pool.acquire()
        pool.release(endpoint, "connection")
        try:
            await pool.acquire()
        finally:
            await pool.close()


def test_a_dead_fleet_fails_with_a_clear_message() -> None:
    with pytest.raises(FleetUnavailable, match=r"every SGLang endpoint is failing .* none answered /health within"):
        asyncio.run(_dead_fleet())


def flaky_outcomes(rng: random.Random, rate: float) -> str | None:
    return rng.choice(["connection", "http_500", "timeout"]) if rng.random() < rate else None


def test_a_fleet_that_is_flaky_everywhere_is_kept_whole() -> None:
    """21% of answers failing on every server, 20,000 answers: runs of several failures in a row happen, and
    nobody is ejected, because nobody is worse than the rest."""

    async def scenario() -> tuple[int, int]:
        rng = random.Random(7)
        async with aiohttp.ClientSession() as session:
            pool = EndpointPool([f"http://127.0.0.1:{p}" for p in (1, 2, 3, 4)], session, FAST)
            longest = 0
            for _ in range(20_000):
                endpoint = await pool.acquire()
                pool.release(endpoint, flaky_outcomes(rng, 0.21))
                longest = max(longest, endpoint.consecutive_failures)
            await pool.close()
            return pool.ejections, longest

    ejections, longest_run = asyncio.run(scenario())
    assert ejections == 0
    assert longest_run >= 4  # what the old rule (3 in a row) ejected on


def test_an_outlier_is_ejected_and_the_ejected_share_is_capped() -> None:
    """Of 20 endpoints, 5 fail 70% of the time against 5% elsewhere: 2 at a time are out (10%, at least one), and a
    repeat ejection lasts longer than the first."""

    async def scenario() -> tuple[list[int], int, int]:
        rng = random.Random(3)
        urls = [f"http://127.0.0.1:{p}" for p in range(1, 21)]
        async with aiohttp.ClientSession() as session:
            pool = EndpointPool(urls, session, OutlierPolicy(base_ejection_s=30))
            for _ in range(200):
                for url in urls:
                    await answer(pool, url, flaky_outcomes(rng, 0.7 if url in urls[:5] else 0.05))
            ejected = [i for i, e in enumerate(pool.endpoints) if e.ejected]
            healthy_ejections = sum(e.ejections for e in pool.endpoints[5:])
            await pool.close()
            return ejected, healthy_ejections, pool._ejected_now()

    ejected, healthy_ejections, now = asyncio.run(scenario())
    assert len(ejected) == 2 and set(ejected) <= {0, 1, 2, 3, 4}
    assert healthy_ejections == 0 and now == 2


def test_repeat_ejections_last_longer(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with aiohttp.ClientSession() as session:
            pool = EndpointPool(["http://127.0.0.1:1"], session, OutlierPolicy(dead_after=2, base_ejection_s=10))
            for _ in range(2):
                endpoint = pool.endpoints[0]
                endpoint.ejected, endpoint.consecutive_failures = False, 0  # as a re-admission would
                for _ in range(2):
                    await answer(pool, endpoint.url, "connection")
            await pool.close()

    with caplog.at_level("WARNING", logger="regen.sglang.fleet"):
        asyncio.run(scenario())
    assert [re.search(r"for (\d+)s", r.getMessage()).group(1) for r in caplog.records] == ["10", "20"]  # type: ignore[union-attr]


def test_backpressure_slows_the_sender_and_never_ejects() -> None:
    """A 503 or 429 halves the endpoint's in-flight limit (once a second at most): requests go elsewhere while it is
    at its limit, a lone endpoint's requests wait for a release, and answers grow the limit back."""

    async def scenario() -> list[str]:
        async with aiohttp.ClientSession() as session:
            pool = EndpointPool(["http://127.0.0.1:1", "http://127.0.0.1:2"], session, FAST)
            a, b = pool.endpoints
            held = [await pool.acquire() for _ in range(8)]
            events = [f"spread:{held.count(a)},{held.count(b)}"]
            for _ in range(2):
                pool.release(a, "http_503")  # the second within the same second: no second halving
            events.append(f"limit:{a.limit:g} ejected:{a.ejected} outstanding:{a.outstanding}")
            picks = [await pool.acquire() for _ in range(3)]
            events.append(f"to_b:{picks.count(b)}")
            pool.release(a, None)
            events.append(f"limit:{a.limit:g} next_to_a:{(await pool.acquire()) is a}")
            await pool.close()

            lone = EndpointPool(["http://127.0.0.1:3"], session, FAST)
            (c,) = lone.endpoints
            for _ in range(3):
                await lone.acquire()
            lone.release(c, "http_429")  # 2 outstanding, the limit is 1.5
            waiting = asyncio.create_task(lone.acquire())
            await asyncio.sleep(0.05)
            events.append(f"waits:{not waiting.done()}")
            lone.release(c, None)  # 1 outstanding, the limit 1.5 + 1 / 1.5
            await asyncio.wait_for(waiting, 1)
            events.append(f"served:{c.outstanding}")
            await lone.close()
            return events

    assert asyncio.run(scenario()) == [
        "spread:4,4",
        "limit:2 ejected:False outstanding:2",
        "to_b:3",
        "limit:2.5 next_to_a:True",
        "waits:True",
        "served:2",
    ]


def test_after_backpressure_the_limit_grows_by_one_a_round_of_answers() -> None:
    """Additive increase as TCP's congestion avoidance: a limit of 8 grows by about one over 8 answers (a round),
    not by one an answer (which doubles the limit each round, straight back to the overload): from 8 to 16 takes
    about (16^2 - 8^2) / 2 = 96 answers, not 8."""

    async def scenario() -> tuple[float, int]:
        async with aiohttp.ClientSession() as session:
            pool = EndpointPool(["http://127.0.0.1:1"], session, FAST)
            (a,) = pool.endpoints
            for _ in range(16):
                await pool.acquire()
            pool.release(a, "http_503")  # 15 outstanding: the limit halves to (15 + 1) / 2
            assert a.limit == 8
            for _ in range(8):  # one round of answers
                pool.release(a, None)
            after_a_round, answers = a.limit, 8
            while a.limit < 16:
                if a.outstanding:
                    pool.release(a, None)
                else:
                    pool.release(await pool.acquire(), None)
                answers += 1
            await pool.close()
            return after_a_round, answers

    after_a_round, answers = asyncio.run(scenario())
    assert 8.9 < after_a_round < 9.0
    assert 90 <= answers <= 100


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


def test_a_preferred_endpoint_is_taken_unless_it_is_much_busier_or_to_be_avoided() -> None:
    """An on-policy turn prefers the server holding its history in cache: taken while it has at most 1.25 x the
    least-loaded endpoint's requests outstanding, plus one; never when the retry avoids it."""

    async def scenario() -> list[str]:
        async with aiohttp.ClientSession() as session:
            a, b = "http://127.0.0.1:1", "http://127.0.0.1:2"
            pool = EndpointPool([a, b], session, FAST)
            busy, idle = pool.endpoints
            picked = []
            for outstanding_a, outstanding_b, prefer, avoid in [(1, 0, a, None), (2, 0, a, None), (5, 4, a, None),
                                                               (7, 4, a, None), (0, 3, a, a)]:  # fmt: skip
                busy.outstanding, idle.outstanding = outstanding_a, outstanding_b
                endpoint = await pool.acquire(avoid, prefer)
                picked.append(endpoint.url)
            await pool.close()
            return picked

    a, b = "http://127.0.0.1:1", "http://127.0.0.1:2"
    assert asyncio.run(scenario()) == [a, b, a, b, b]
