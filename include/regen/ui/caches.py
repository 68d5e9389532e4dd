"""The page's two caches: one in-flight read per question, kept a few seconds (`SingleFlight`, on the API server's
event loop), and published versions' summaries, kept longer (`PublishedSummaries`, in the reading threads).

A burst of viewers, or the page and its JSON endpoints at once, costs one scan of the bucket, not one each: every
request for a key awaits the read in flight for it. A read that fails is not kept, so the next request tries again.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass
class _Flight(Generic[T]):
    loop: asyncio.AbstractEventLoop
    task: asyncio.Task[T]
    landed_at: float | None = None  # when it answered; None while in flight


class SingleFlight(Generic[T]):
    """`read()` run in a worker thread once per key however many await it, its answer kept `ttl_s` seconds after it
    landed. Errors are not kept: every request waiting on a failed read gets the error, the next one reads again."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._flights: dict[Hashable, _Flight[T]] = {}

    async def get(self, key: Hashable, read: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        self._forget_expired()
        flight = self._flights.get(key)
        if flight is None or flight.loop is not loop or _failed(flight.task):
            flight = _Flight(loop, loop.create_task(asyncio.to_thread(read)))
            self._flights[key] = flight
            flight.task.add_done_callback(functools.partial(self._landed, key, flight))
        # shielded: a request that goes away (its client closed) does not cancel the read the others await
        return await asyncio.shield(flight.task)

    def _landed(self, key: Hashable, flight: _Flight[T], _: object) -> None:
        if _failed(flight.task):
            if self._flights.get(key) is flight:
                del self._flights[key]
        else:
            flight.landed_at = self._clock()

    def _forget_expired(self) -> None:
        now = self._clock()
        for key in [k for k, f in self._flights.items() if f.landed_at is not None and now - f.landed_at >= self.ttl_s]:
            del self._flights[key]


def _failed(task: asyncio.Task[Any]) -> bool:
    return task.done() and (task.cancelled() or task.exception() is not None)


@dataclass
class PublishedSummaries:
    """Summaries of published versions by (root, profile, dataset, version), the `size` most recently used, each for
    `ttl_s`. A published version does not change (its manifest is created once), except when a run republishes it
    with `overwrite_version`: for at most `ttl_s` the page then shows its earlier numbers. `full` summaries (with
    the report's numbers) also answer for the manifest-only ones. Used from the reading threads: locked."""

    size: int = 4096
    ttl_s: float = 900.0
    clock: Callable[[], float] = time.monotonic
    _entries: OrderedDict[tuple[str, ...], tuple[float, bool, dict[str, Any]]] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, key: tuple[str, ...], full: bool) -> dict[str, Any] | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or self.clock() - entry[0] >= self.ttl_s or (full and not entry[1]):
                return None
            self._entries.move_to_end(key)
            return entry[2]

    def put(self, key: tuple[str, ...], full: bool, summary: dict[str, Any]) -> None:
        with self._lock:
            held = self._entries.get(key)
            if held is not None and held[1] and not full and self.clock() - held[0] < self.ttl_s:
                return  # a full summary answers for this one already
            self._entries[key] = (self.clock(), full, summary)
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
