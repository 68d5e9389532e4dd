"""Hints: what only makes a run faster (a send order, a length fit, another version's answer lengths, endpoint
affinity), never what it produces. An optimisation never fails a run: every hint is used through `Hints.use`, which
on any failure takes the plain path instead, turns the hint off for the rest of the task (one warning, not one a
request), and keeps why for the run report. One guard, with every hint declared below, so that a new hint cannot
forget it. Memo caches of pure functions (lru_cache) are no hints: their plain path is the same computation."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True)
class Hint:
    """A hint's one declaration: its name in reports, what it is, and the plain path taken when it fails."""

    name: str
    what: str
    instead: str


SEND_ORDER = Hint(
    "send_order",
    "the send order (longest expected answer first, re-ranked by a fit of the answers so far)",
    "the rest of the shard was sent in the order it had",
)
ENDPOINT_AFFINITY = Hint(
    "endpoint_affinity",
    "endpoint affinity (an on-policy turn first to the endpoint that answered its previous turn)",
    "each request went to the least busy endpoint",
)
CHAIN_PRIORITY = Hint(
    "chain_priority",
    "chain priority (an on-policy turn's priority raised by the work its conversation has left)",
    "turns were sent with the run's priority",
)
LAST_LENGTHS = Hint(
    "last_lengths",
    "the answer lengths of the last version (this profile's or another's)",
    "this version is ordered by its rows' reference answers, where they have one",
)
SHARED_FIT = Hint(
    "shared_fit",
    "the length fit's start from the answers the version's validated shards measured",
    "this shard's fit learnt from its own answers alone",
)
RUN_ORDER = Hint(
    "run_order",
    "the run's order of shard tasks across datasets (the longest expected work first)",
    "the shard tasks ran dataset after dataset, each dataset's shards as prepare dealt them",
)
HINTS = {
    hint.name: hint for hint in (SEND_ORDER, ENDPOINT_AFFINITY, CHAIN_PRIORITY, LAST_LENGTHS, SHARED_FIT, RUN_ORDER)
}


class Hints:
    """One task's hints: `failed` maps each hint that failed in it to why (the first failure), and a failed hint
    stays off for the rest of the task."""

    def __init__(self) -> None:
        self.failed: dict[str, str] = {}

    def on(self, hint: Hint) -> bool:
        return hint.name not in self.failed

    def use(self, hint: Hint, plain: T, compute: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """compute(*args, **kwargs), or `plain` (the value without the hint) when it raises or the hint is off."""
        if hint.name not in HINTS:
            raise KeyError(f"{hint.name}: a hint is declared in regen.hints.HINTS")
        if hint.name in self.failed:
            return plain
        try:
            return compute(*args, **kwargs)
        except Exception as e:  # whatever a hint raises: never the run's failure (a cancellation is no Exception)
            self.failed[hint.name] = f"{type(e).__name__}: {e}"
            log.warning("%s failed (%s), turned off for this task: %s", hint.what, self.failed[hint.name], hint.instead)
            return plain

    def warnings(self, where: str) -> list[str]:
        return hint_warnings(where, self.failed)


def hint_warnings(where: str, failed: Mapping[str, str]) -> list[str]:
    """The run report's warnings for the hints that failed (`failed`: hint name -> why) in `where`."""
    return [
        f"{where}: {HINTS[name].what if name in HINTS else name} failed ({why}) and was turned off; "
        f"{HINTS[name].instead if name in HINTS else 'the plain path was taken'} (a hint only changes how fast a "
        "run goes, never its data)"
        for name, why in failed.items()
    ]
