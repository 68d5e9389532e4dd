"""A generating shard's durable state: finished answers and rejections flushed to small part files as they arrive,
each part ending with the try's counts; read back by a retried try, which then asks only for what is missing.

    raw/shard-00042/part-00007.jsonl    one JSON line per answer ({"id", ...} as records.encode_answer writes it) or
                                        rejection ({"id", "rejected": {"reason", "detail"}}), then {"try", "generation"}
    raw/shard-00042/progress.json       the shard's numbers after each part, for the UI
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from regen.manifest import GenerationReport, ShardManifest
from regen.reasons import Reason
from regen.storage import Storage

MERGE_AFTER = 32  # small parts of one try merged into one: a long shard leaves dozens of parts to resume from


@dataclass
class Checkpoints:
    """What earlier tries finished for a shard. Answers stay JSON lines: a shard's worth of parsed token lists
    would cost several times the memory."""

    answers: dict[str, bytes] = field(default_factory=dict)  # sample id -> raw answer line
    rejected: dict[str, dict[str, Any]] = field(default_factory=dict)  # sample id -> rejection
    tries: dict[int, GenerationReport] = field(default_factory=dict)  # each try's counts at its last flush
    next_part: int = 0

    def __contains__(self, sample_id: object) -> bool:
        return sample_id in self.answers or sample_id in self.rejected

    def __len__(self) -> int:
        return len(self.answers) + len(self.rejected)


def load_checkpoints(storage: Storage, shard: ShardManifest) -> Checkpoints:
    found = Checkpoints()
    keys = [k for k in storage.list_keys(shard.keys.checkpoints) if k.endswith(".jsonl")]
    for key in keys:
        for line in storage.get_bytes(key).splitlines():
            record = msgspec.json.decode(line)
            if "try" in record:  # counts are cumulative within a try: the latest flush has them all
                report = GenerationReport.from_dict(record["generation"])
                earlier = found.tries.get(record["try"])
                if earlier is None or report.finished_at >= earlier.finished_at:
                    found.tries[record["try"]] = report
            elif record["id"] in found:
                continue  # a merged part repeats its small parts until they are deleted: the same bytes
            elif "rejected" in record:
                found.rejected[record["id"]] = record["rejected"]
            else:
                found.answers[record["id"]] = bytes(line)
    found.next_part = 1 + max((int(k.rsplit("part-", 1)[1].split(".")[0]) for k in keys), default=-1)
    return found


class Checkpointer:
    """Finished records leave for storage as they arrive: one flusher task writes whatever is waiting as a small part
    file every `seconds` (or sooner, once `every` records wait), off the event loop. However many requests are in
    flight, that is one PUT a flush; a killed try loses only its requests in flight and its unflushed answers. Each
    part ends with the try's counts so far. Every `MERGE_AFTER` parts the try's small parts are merged into one (the
    merged part is written before the small ones are deleted), so a resume reads dozens of parts, not thousands.
    After each part, the shard's progress (what the UI shows) is written beside the parts."""

    def __init__(self, storage: Storage, shard: ShardManifest, next_part: int, every: int, seconds: float) -> None:
        self.storage, self.shard, self.part = storage, shard, next_part
        self.try_id = next_part  # unique: part numbers only grow over a shard's tries
        self.every, self.seconds = every, seconds
        self.pending: list[bytes] = []
        self.unmerged: list[tuple[str, bytes]] = []
        self.wake = asyncio.Event()
        self.stopping = False
        self.flushed = 0  # records (answers and rejections) this try has written to storage

    def add(self, record: bytes) -> None:
        self.pending.append(record)
        if len(self.pending) >= self.every:
            self.wake.set()

    async def run(
        self, counts: Callable[[], GenerationReport], status: Callable[[int], dict[str, Any]] | None = None
    ) -> None:
        """Flush until `stop`, then once more: the only writer, so parts never race. `status(flushed)`: the
        progress to write after each part."""
        while not self.stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.seconds)
            self.wake.clear()
            await self._flush(counts(), status)
        await self._flush(counts(), status)

    def stop(self) -> None:
        self.stopping = True
        self.wake.set()

    async def _flush(self, counts: GenerationReport, status: Callable[[int], dict[str, Any]] | None = None) -> None:
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        self.flushed += len(batch)
        batch.append(msgspec.json.encode({"try": self.try_id, "generation": dataclasses.asdict(counts)}))
        body = b"".join(line + b"\n" for line in batch)
        key = self._next_key()
        await asyncio.to_thread(self.storage.put_bytes, key, body)
        self.unmerged.append((key, body))
        if len(self.unmerged) >= MERGE_AFTER:
            merged, self.unmerged = self.unmerged, []
            await asyncio.to_thread(self._merge, self._next_key(), merged)
        if status is not None:  # after the part: `done` never counts an answer that is not in storage
            progress = msgspec.json.encode(status(self.flushed))
            await asyncio.to_thread(self.storage.put_bytes, self.shard.keys.progress, progress)

    def _next_key(self) -> str:
        part, self.part = self.part, self.part + 1
        return f"{self.shard.keys.checkpoints}part-{part:05d}.jsonl"

    def _merge(self, key: str, parts: list[tuple[str, bytes]]) -> None:
        self.storage.put_bytes(key, b"".join(body for _, body in parts))
        for small, _ in parts:
            self.storage.delete(small)


def rejection_line(sample_id: str, reason: Reason, detail: str) -> bytes:
    return msgspec.json.encode({"id": sample_id, "rejected": {"reason": reason.value, "detail": detail}})
