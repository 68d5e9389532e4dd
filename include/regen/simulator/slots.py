"""The simulator's running slots, handed to waiting requests as SGLang 0.5.23's scheduler admits its waiting queue:
in arrival order, or with --enable-priority-scheduling by priority, then arrival (`schedule_policy.py`
`_sort_by_priority_and_fcfs`): a larger value first, a smaller one with --schedule-low-priority-values-first, and a
request without a priority the least preferred (`scheduler.py` `_set_or_validate_priority`). Not simulated: the
preemption of a running request by one more preferred by over --priority-scheduling-preemption-threshold (10)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class Slots:
    def __init__(self, count: int, by_priority: bool = False, low_values_first: bool = False) -> None:
        self.free = count
        self.by_priority = by_priority
        self.low_values_first = low_values_first
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrival = itertools.count()

    def _rank(self, priority: int | None) -> int:
        """The waiting queue's sort key: the smallest is admitted first."""
        if not self.by_priority:
            return 0
        if priority is None:
            return sys.maxsize
        return priority if self.low_values_first else -priority

    @asynccontextmanager
    async def slot(self, priority: int | None = None) -> AsyncIterator[None]:
        if self.free > 0 and not self._waiting:
            self.free -= 1
        else:
            admitted = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiting, (self._rank(priority), next(self._arrival), admitted))
            try:
                await admitted
            except asyncio.CancelledError:  # a client gone while it waited: a slot handed to it goes on
                if admitted.done() and not admitted.cancelled():
                    self._release()
                raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        while self._waiting:
            admitted = heapq.heappop(self._waiting)[2]
            if not admitted.done():
                admitted.set_result(None)
                return
        self.free += 1
