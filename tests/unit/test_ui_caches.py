"""The caches in front of the Drafter data page's storage reads: one read in flight per question however many ask,
errors never kept, answers kept for their time; published versions' summaries kept longer, bounded."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from regen.ui.caches import PublishedSummaries, SingleFlight


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Read:
    """A storage read that waits until released, counting how often it ran."""

    def __init__(self, answer: Any = "scan") -> None:
        self.answer, self.runs = answer, 0
        self.release = threading.Event()

    def __call__(self) -> Any:
        self.runs += 1
        assert self.release.wait(10), "never released"
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


async def _ask_together(flights: SingleFlight[Any], read: Read, key: str = "k", many: int = 2) -> list[Any]:
    waiting = [asyncio.ensure_future(flights.get(key, read)) for _ in range(many)]
    await asyncio.sleep(0.05)  # every request is waiting before the read answers
    read.release.set()
    return await asyncio.gather(*waiting, return_exceptions=True)


def test_concurrent_requests_for_one_key_await_one_read() -> None:
    async def main() -> None:
        flights: SingleFlight[Any] = SingleFlight(10.0)
        read, other = Read("scan"), Read("other")
        other.release.set()
        assert await _ask_together(flights, read, many=5) == ["scan"] * 5
        assert read.runs == 1
        assert await flights.get("k", read) == "scan" and read.runs == 1  # kept
        assert await flights.get("other key", other) == "other" and other.runs == 1

    asyncio.run(main())


def test_an_error_reaches_every_waiter_and_is_not_kept() -> None:
    async def main() -> None:
        flights: SingleFlight[Any] = SingleFlight(10.0)
        failing = Read(OSError("bucket unreachable"))
        answers = await _ask_together(flights, failing, many=3)
        assert [type(a) for a in answers] == [OSError] * 3 and failing.runs == 1
        healthy = Read("scan")
        healthy.release.set()
        assert await flights.get("k", healthy) == "scan" and healthy.runs == 1  # read again, not the error

    asyncio.run(main())


def test_an_answer_expires_after_its_time() -> None:
    async def main() -> None:
        clock = Clock()
        flights: SingleFlight[Any] = SingleFlight(10.0, clock)
        read = Read()
        read.release.set()
        await flights.get("k", read)
        clock.now += 9.9
        await flights.get("k", read)
        assert read.runs == 1
        clock.now += 0.1
        await flights.get("k", read)
        assert read.runs == 2

    asyncio.run(main())


def test_a_request_that_goes_away_does_not_cancel_the_read_others_await() -> None:
    async def main() -> None:
        flights: SingleFlight[Any] = SingleFlight(10.0)
        read = Read()
        leaving = asyncio.ensure_future(flights.get("k", read))
        staying = asyncio.ensure_future(flights.get("k", read))
        await asyncio.sleep(0.05)
        leaving.cancel()
        read.release.set()
        assert await staying == "scan" and read.runs == 1
        with pytest.raises(asyncio.CancelledError):
            await leaving

    asyncio.run(main())


def test_published_summaries_are_bounded_and_expire() -> None:
    clock = Clock()
    kept = PublishedSummaries(size=2, ttl_s=60.0, clock=clock)
    kept.put(("r", "p", "d", "v1"), False, {"version": "v1"})
    kept.put(("r", "p", "d", "v2"), True, {"version": "v2", "histograms": {}})
    assert kept.get(("r", "p", "d", "v1"), full=False) == {"version": "v1"}
    assert kept.get(("r", "p", "d", "v1"), full=True) is None  # its report was not read
    assert kept.get(("r", "p", "d", "v2"), full=False) == {"version": "v2", "histograms": {}}  # full answers both
    kept.put(("r", "p", "d", "v2"), False, {"version": "v2"})  # does not replace the full one
    assert kept.get(("r", "p", "d", "v2"), full=True) == {"version": "v2", "histograms": {}}
    kept.put(("r", "p", "d", "v3"), False, {"version": "v3"})  # v1 was used least lately
    assert kept.get(("r", "p", "d", "v1"), full=False) is None
    assert kept.get(("r", "p", "d", "v3"), full=False) is not None
    clock.now += 60.0
    assert kept.get(("r", "p", "d", "v3"), full=False) is None
