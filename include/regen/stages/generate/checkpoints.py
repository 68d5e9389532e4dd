"""A generating shard's durable state: finished answers and rejections flushed to small part files as they arrive,
each part ending with the try's counts; read back by a retried try, which then asks only for what is missing.

    raw/shard-00042/part-00007.jsonl    one JSON line per answer ({"id", ...} as records.encode_answer writes it) or
                                        rejection ({"id", "rejected": {"reason", "detail", ...}}), then {"try",
                                        "generation"}
    raw/shard-00042/progress.json       the shard's numbers after each part, for the UI

A finished shard of an unpublished version whose answers the fleet lost is turned back into one such part by the
next try (`reopen`), which then asks them again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from tenacity import AsyncRetrying, RetryCallState, stop_after_delay, wait_random_exponential

from regen.fleet_losses import is_fleet_loss
from regen.manifest import GenerationReport, ShardManifest
from regen.reasons import Reason
from regen.records import encode_answer, iter_raw_file
from regen.samples import sample_of
from regen.storage import Storage

log = logging.getLogger(__name__)

MERGE_AFTER = 32  # small parts of one try merged into one: a long shard leaves dozens of parts to resume from
# How long a part may keep failing to be written before the task fails. Longer than S3's bursts of 503 SlowDown and a
# local disk's hiccups (botocore already retries within each PUT); short enough that a task whose storage is gone
# fails in well under a minute, holding at most that long of answers in memory, and Airflow's retry resumes it.
OUTAGE_S = 30.0
REOPENED = -1  # the try of a reopened shard's part: the tries before, once however often a reopen is redone


# Rejections that say more about the fleet than about the sample: until the shard is done, every try asks for them
# again (a fleet mended between tries answers them); a shard with too many refusals fails (generate.py).
SERVER_SIDE = frozenset({Reason.SERVER_REJECTED, Reason.SERVER_ABORTED, Reason.COUNT_MISMATCH, Reason.SAMPLE_TIMEOUT})


class CheckpointsUnwritable(Exception):
    """Storage took no checkpoint for `OUTAGE_S`: the task fails; a retry resumes from the parts that landed and asks
    again only for the answers that did not."""


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

    def ask_again(self) -> list[str]:
        """Forgets the server-side rejections of earlier tries, and the later turns of their conversations that
        were rejected as unusable because of them or because of a turn a later try answered (a Resume's try killed
        after answering the turn the fleet had lost), so that this try asks for them again; their ids."""
        released = {i for i, r in self.rejected.items() if r["reason"] in SERVER_SIDE}
        conversations = {sample_of(i) for i in released}
        released |= {
            i
            for i, r in self.rejected.items()
            if r["reason"] == Reason.EARLIER_TURN_UNUSABLE
            and (sample_of(i) in conversations or (r.get("ended_by") or {}).get("turn") in self.answers)
        }
        for answer_id in released:
            del self.rejected[answer_id]
        return sorted(released)


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
            elif record["id"] in found and not _asked_again(found, record["id"]):
                continue  # a merged part repeats its small parts until they are deleted: the same bytes
            elif "rejected" in record:
                found.rejected[record["id"]] = record["rejected"]
            else:
                found.rejected.pop(record["id"], None)  # a later try answered what an earlier one rejected
                found.answers[record["id"]] = bytes(line)
    found.next_part = 1 + max(map(_part_number, keys), default=-1)
    return found


def _asked_again(found: Checkpoints, answer_id: str) -> bool:
    """Whether a later part's record replaces what an earlier part holds: a rejection a later try asks again."""
    earlier = found.rejected.get(answer_id, {}).get("reason")
    return earlier in SERVER_SIDE or earlier == Reason.EARLIER_TURN_UNUSABLE


class Checkpointer:
    """Finished records leave for storage as they arrive, in parts: a part closes once `every` records are in it, or
    when `seconds` pass, and one flusher task writes the closed parts, off the event loop. However many requests are
    in flight, that is one PUT a second below `every` records a second; a killed try loses only its requests in
    flight and its unwritten records. A try of n records that arrive faster than `seconds` writes the same parts
    however they are timed, and however long its writes take (the crash points name parts by number:
    tools/crash_points). Each part ends with the try's counts as of its last record. Every `MERGE_AFTER` parts the
    try's small parts are merged into one (the merged part is written before the small ones are deleted), so a
    resume reads dozens of parts, not thousands. After each part, the shard's progress (what the UI shows) is written
    beside the parts."""

    def __init__(
        self,
        storage: Storage,
        shard: ShardManifest,
        next_part: int,
        every: int,
        seconds: float,
        outage_s: float = OUTAGE_S,
    ) -> None:
        self.storage, self.shard, self.part = storage, shard, next_part
        self.try_id = next_part  # unique: part numbers only grow over a shard's tries
        self.every, self.seconds, self.outage_s = every, seconds, outage_s
        self.filling: list[bytes] = []  # the records of the part not closed yet
        self.closed: list[tuple[list[bytes], GenerationReport]] = []  # closed parts not written yet, oldest first
        self.counts: Callable[[], GenerationReport] | None = None
        self.status: Callable[[int], dict[str, Any]] | None = None
        self.unmerged: list[tuple[str, bytes]] = []
        self.wake = asyncio.Event()
        self.stopping = False
        self.flushed = 0  # records (answers and rejections) this try has written to storage

    @property
    def waiting(self) -> int:
        """Records not in storage yet."""
        return len(self.filling) + sum(len(records) for records, _ in self.closed)

    def start(
        self, counts: Callable[[], GenerationReport], status: Callable[[int], dict[str, Any]] | None = None
    ) -> asyncio.Task[None]:
        """The flusher, until `stop`. `counts()`: the try's counts so far, taken as a part closes (after its last
        record was counted); `status(flushed)`: the progress to write after each part. It is the only writer, so
        parts never race, and it ends early only by raising CheckpointsUnwritable (the caller watches)."""
        self.counts, self.status = counts, status
        return asyncio.create_task(self._run())

    def add(self, record: bytes) -> None:
        self.filling.append(record)
        if len(self.filling) >= self.every:
            self._close()
            self.wake.set()

    def stop(self) -> None:
        self.stopping = True
        self.wake.set()

    async def finish(self, flusher: asyncio.Task[None]) -> None:
        """Stops the flusher and waits for its last part. A flusher that failed is tried once more on the way out
        (storage may be back); what still cannot be written is named, and a retry of the task asks for it again."""
        self.stop()
        try:
            await flusher
        except CheckpointsUnwritable as e:
            log.warning("%s: %s; writing the answers waiting once more before the task fails", self.shard.name, e)
            try:
                await self._flush()
            except CheckpointsUnwritable:
                log.error(
                    "%s: %d answers and rejections could not be checkpointed; a retry of this task asks for them "
                    "again (every one that was checkpointed is kept)",
                    self.shard.name,
                    self.waiting,
                )
            raise

    async def _run(self) -> None:
        while not self.stopping:
            try:
                await asyncio.wait_for(self.wake.wait(), self.seconds)
            except TimeoutError:
                self._close()  # the interval: what finished in it leaves now, however few
            self.wake.clear()
            await self._write_closed()
        await self._flush()

    async def _flush(self) -> None:
        self._close()
        await self._write_closed()

    def _close(self) -> None:
        if self.filling:
            assert self.counts is not None, "start() binds the counts before records arrive"
            self.closed.append((self.filling, self.counts()))
            self.filling = []

    async def _write_closed(self) -> None:
        """The closed parts, oldest first. A part stays waiting until it is written: a failed write is retried (the
        same key and bytes: harmless if an unanswered try landed), and after `outage_s` raises with it kept."""
        while self.closed:
            records, counts = self.closed[0]
            trailer = msgspec.json.encode({"try": self.try_id, "generation": dataclasses.asdict(counts)})
            body = b"".join(line + b"\n" for line in [*records, trailer])
            key = self._next_key()
            await self._write(key, body)
            del self.closed[0]
            self.flushed += len(records)
            self.unmerged.append((key, body))
            if len(self.unmerged) >= MERGE_AFTER:
                merged, self.unmerged = self.unmerged, []
                try:  # the small parts hold the same records: a merge that fails leaves them to be read as they are
                    await asyncio.to_thread(self._merge, self._next_key(), merged)
                except Exception as e:
                    log.warning("%s: merging %d parts failed (%s); they stay", self.shard.name, len(merged), e)
            if self.status is not None:  # after the part: `done` never counts an answer that is not in storage
                progress = msgspec.json.encode(self.status(self.flushed))
                try:  # what the UI shows: never worth failing the task for
                    await asyncio.to_thread(self.storage.put_bytes, self.shard.keys.progress, progress)
                except Exception as e:
                    log.warning("%s: progress not written (%s)", self.shard.name, e)

    async def _write(self, key: str, body: bytes) -> None:
        """One part, retried with backoff for at most `outage_s` in all, each try cut off at what is left of it (a
        PUT that botocore keeps retrying would otherwise outlast the bound)."""
        deadline = time.monotonic() + self.outage_s
        retrying = AsyncRetrying(
            stop=stop_after_delay(self.outage_s),
            wait=wait_random_exponential(multiplier=0.1, max=min(5.0, self.outage_s / 4)),
            before_sleep=self._log_retry,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    left = max(deadline - time.monotonic(), 0.05)
                    await asyncio.wait_for(asyncio.to_thread(self.storage.put_bytes, key, body), left)
        except Exception as e:
            raise CheckpointsUnwritable(
                f"storage took no checkpoint for {self.outage_s:g} s ({self.storage.uri(key)}: "
                f"{type(e).__name__}: {e}); {self.waiting} answers and rejections wait in memory"
            ) from e

    def _log_retry(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        log.warning("%s: checkpoint part not written (%s: %s); retrying", self.shard.name, type(error).__name__, error)

    def _next_key(self) -> str:
        part, self.part = self.part, self.part + 1
        return f"{self.shard.keys.checkpoints}part-{part:05d}.jsonl"

    def _merge(self, key: str, parts: list[tuple[str, bytes]]) -> None:
        self.storage.put_bytes(key, b"".join(body for _, body in parts))
        for small, _ in parts:
            self.storage.delete(small)


def rejection_line(
    sample_id: str,
    reason: Reason,
    detail: str,
    endpoint: str | None = None,
    ended_by: dict[str, str] | None = None,
) -> bytes:
    """`endpoint`: the server that gave a server-side rejection (redacted), for the message of a shard with too many.
    `ended_by`: for a later turn of an ended conversation, the turn that ended it (and its rejection's reason)."""
    rejected: dict[str, Any] = {"reason": reason.value, "detail": detail}
    rejected |= {"endpoint": endpoint} if endpoint else {}
    rejected |= {"ended_by": ended_by} if ended_by else {}
    return msgspec.json.encode({"id": sample_id, "rejected": rejected})


def reopen(storage: Storage, shard: ShardManifest) -> bool:
    """A finished shard whose fleet losses (regen.fleet_losses) a new try of its unpublished version asks again: its
    answers, rejections and generation counts become a checkpoint part and its raw file, the mark of a finished
    shard, is removed, so the try goes on as a resumed one. False, and nothing changed, for a shard without fleet
    losses or of a published version (never changed)."""
    rejected_key = shard.keys.rejected("generate")
    if storage.exists(shard.location.manifest) or not storage.exists(rejected_key):
        return False
    rejections = [msgspec.json.decode(line) for line in storage.get_bytes(rejected_key).splitlines()]
    if not any(map(is_fleet_loss, rejections)):
        return False
    for key in (shard.keys.report, shard.location.fleet_losses):  # not finished now; the version's list is stale
        if storage.exists(key):
            storage.delete(key)
    lines = [
        rejection_line(r["id"], Reason.of(r["reason"]), r["detail"], r.get("endpoint"), r.get("ended_by"))
        for r in rejections
    ]
    with tempfile.TemporaryDirectory(prefix="regen-reopen-") as tmp:
        path = Path(tmp) / "raw.jsonl.zst"
        storage.get_file(shard.keys.raw, path)
        lines += [encode_answer(answer) for answer in iter_raw_file(path)]
    # Parts a finishing try died removing hold nothing the raw file, the rejections and generation.json do not, and
    # their counts are in generation.json: kept, they would count those tries twice. They go after the reopened
    # part lands and before the raw file does (a reopen cut short anywhere is redone whole).
    earlier = [k for k in storage.list_keys(shard.keys.checkpoints) if k.endswith(".jsonl")]
    part = 1 + max(map(_part_number, earlier), default=-1)
    if storage.exists(shard.keys.generation):  # the earlier tries' counts, so the shard's report covers them all
        generation = msgspec.json.decode(storage.get_bytes(shard.keys.generation))
        lines.append(msgspec.json.encode({"try": REOPENED, "generation": generation}))
    storage.put_bytes(f"{shard.keys.checkpoints}part-{part:05d}.jsonl", b"".join(line + b"\n" for line in lines))
    for key in earlier:
        storage.delete(key)
    storage.delete(shard.keys.raw)
    log.info("%s %s: finished, reopened to ask its fleet losses again", shard.location.dataset, shard.name)
    return True


def _part_number(key: str) -> int:
    return int(key.rsplit("part-", 1)[1].split(".")[0])
