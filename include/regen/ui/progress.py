"""A version still being made, from one listing of its folder: which shards are finished (their report is written),
generated (their raw file is), generating (a progress file written lately) or waiting, and when anything in the
version last changed. Only generating shards' progress files are read; a version idle longer than
`abandoned_after_s` is marked abandoned and none of its files is read.

Before this, the page asked for two or three keys per shard of every unpublished version on every load (a version
of 5,000 shards: 10,000 requests); a listing answers for 1,000 files a request.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from regen.layout import DatasetLocation
from regen.storage import StoredObject
from regen.ui.documents import PreparedShard, PreparedView, ProgressView

ReadProgress = Callable[[str], ProgressView | None]  # a progress file's key -> its numbers (None: gone meanwhile)


def unpublished(
    location: DatasetLocation,
    prepared: PreparedView,
    listing: list[StoredObject],
    read_progress: ReadProgress,
    abandoned_after_s: float,
    now: float,
) -> dict[str, Any]:
    """A prepared version whose manifest is not written, shard by shard."""
    files = {o.key: o for o in listing}
    last = max((o.mtime for o in listing), default=None)
    abandoned = last is None or now - last > abandoned_after_s

    def active(key: str) -> bool:  # a progress file written lately: its task may still be generating
        return not abandoned and now - files[key].mtime <= abandoned_after_s

    shards = [_shard(location, s, files, active, read_progress, now) for s in prepared.shards]
    done = sum(s["done"] or 0 for s in shards)
    total = sum(s["total"] for s in shards)
    generating = [s for s in shards if s["state"] == "generating"]
    in_flight = sum(s["in_flight"] for s in generating)
    slots = sum(s["concurrency"] for s in generating)
    rate = sum(s["requests_per_s"] for s in generating)
    state = "abandoned" if abandoned else "generating" if generating else "unpublished"
    return {
        "dataset": location.dataset,
        "version": location.version,
        "state": state,
        "prepared_at": prepared.prepared_at,
        "run_id": prepared.run_id,
        "last_activity": last,
        "idle_s": None if last is None else round(now - last, 1),
        "prompts": total,
        "done": done,
        "shards": shards,
        "requests_per_s": round(rate, 2),
        "eta_s": round((total - done) / rate) if rate > 0 else None,
        "in_flight": in_flight,
        "utilization": round(in_flight / slots, 3) if slots else None,
        "retries_by_cause": dict(sum((Counter(s["retries_by_cause"]) for s in generating), Counter())),
    }


def _shard(
    location: DatasetLocation,
    shard: PreparedShard,
    files: dict[str, StoredObject],
    active: Callable[[str], bool],
    read_progress: ReadProgress,
    now: float,
) -> dict[str, Any]:
    keys = location.shard(shard.shard)
    total = shard.total
    if keys.report in files:
        return {"shard": keys.name, "state": "finished", "done": total, "total": total}
    if keys.raw in files:
        return {"shard": keys.name, "state": "generated", "done": total, "total": total}
    if keys.progress in files and active(keys.progress):
        progress = read_progress(keys.progress)
        if progress is None:  # gone since the listing: its raw file landed and the checkpoints were deleted
            return {"shard": keys.name, "state": "generated", "done": total, "total": total}
        return {"shard": keys.name, "state": "generating", **_rates(progress, total, now)}
    if keys.progress in files:  # its task stopped writing long ago: how far it got is not read
        idle = round(now - files[keys.progress].mtime, 1)
        return {"shard": keys.name, "state": "stalled", "done": None, "total": total, "idle_s": idle}
    return {"shard": keys.name, "state": "waiting", "done": 0, "total": total}


def _rates(progress: ProgressView, total: int, now: float) -> dict[str, Any]:
    """One generating shard's numbers from its progress file: what the generate task wrote at its last flush."""
    elapsed = max(progress.updated_at - progress.started_at, 1e-9)
    rate = progress.answered / elapsed
    return {
        "done": progress.done,
        "total": total,
        "requests_per_s": round(rate, 2),
        "eta_s": round((total - progress.done) / rate) if rate > 0 else None,
        "in_flight": progress.in_flight,
        "concurrency": progress.concurrency,
        "retries_by_cause": progress.retries_by_cause,
        "updated_at": progress.updated_at,
        "stale_s": round(now - progress.updated_at, 1),
    }


def preparing(
    location: DatasetLocation, listing: list[StoredObject], abandoned_after_s: float, now: float
) -> dict[str, Any]:
    """A version folder with neither a manifest nor prepare's record: prepare is writing its shards, or stopped
    before its record (abandoned, once idle long enough)."""
    last = max(o.mtime for o in listing)
    return {
        "dataset": location.dataset,
        "version": location.version,
        "state": "abandoned" if now - last > abandoned_after_s else "preparing",
        "last_activity": last,
        "idle_s": round(now - last, 1),
        "prompts": None,
        "done": None,
    }
