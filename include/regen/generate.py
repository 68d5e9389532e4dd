"""Stage 3: one shard of prompts -> raw answers, kept exactly as /generate returned them.

Durable and exactly-once per sample id: finished answers (and permanent rejections) are flushed to small part files
at least every `checkpoint_s` seconds; a retried or cleared task reads the parts and requests only what is missing,
so a killed task redoes only its requests in flight and its last second or so of answers. Every part also carries the
try's generation counts, so the shard's report covers every try, the killed ones included. The shard's raw file is
written once, from the parts, when nothing is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import jinja2
import msgspec

from regen.chat import ChatRenderer
from regen.manifest import GenerationReport, ShardManifest, StageStats
from regen.on_policy import Ended, after_answer, check_resumed, dataset_turns, turn_count
from regen.reasons import Reason
from regen.records import (
    RawAnswer,
    ShardPrompts,
    decode_answer,
    encode_answer,
    iter_raw_file,
    read_prompts,
    text_digest,
    write_raw,
)
from regen.rejections import RejectionWriter
from regen.samples import sample_of, turn_id
from regen.sglang.auth import NO_KEYS, ApiKeys
from regen.sglang.client import RECORD_FAULTS, Generation, PermanentError, SGLangClient, TransientError
from regen.sglang.fleet import EndpointPool, FleetUnavailable
from regen.storage import Storage, sha256_file

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerateSettings:
    endpoints: list[str]
    sampling_params: dict[str, Any]
    concurrency: int = 64  # this shard task's share of the fleet's in-flight budget
    request_timeout_s: float = 3600.0
    max_attempts: int = 5
    checkpoint_every: int = 1024
    checkpoint_s: float = 1.0
    progress_s: float = 10.0
    fleet_wait_s: float = 120.0
    backoff_max_s: float = 30.0
    api_keys: ApiKeys = field(default=NO_KEYS, repr=False)


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


class _Checkpointer:
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


class _Progress:
    """The numbers behind the progress lines and the shard's GenerationReport."""

    def __init__(self, shard: ShardManifest, total: int, already: int) -> None:
        self.shard, self.total, self.done, self.already = shard, total, already, already
        self.started_at, self.started = time.time(), time.monotonic()
        self.answered = self.output_tokens = self.prompt_tokens = self.cached_tokens = 0
        self.request_seconds = 0.0

    def answer(self, generation: Generation) -> None:
        self.done += 1
        self.answered += 1
        self.output_tokens += len(generation.output_ids)
        self.prompt_tokens += int(generation.meta_info.get("prompt_tokens") or 0)
        self.cached_tokens += int(generation.meta_info.get("cached_tokens") or 0)

    def log_line(self, client: SGLangClient) -> None:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.answered / elapsed
        eta = (self.total - self.done) / rate if rate else float("inf")
        log.info(
            "%s %s: %d/%d done, %d in flight, %.2f req/s, %.0f output tok/s, retries %s, ETA %.0fs",
            self.shard.location.dataset,
            self.shard.name,
            self.done,
            self.total,
            client.pool.in_flight,
            rate,
            self.output_tokens / elapsed,
            dict(client.stats.retries_by_cause),
            eta,
        )

    def status(self, client: SGLangClient, concurrency: int, flushed: int) -> dict[str, Any]:
        """The shard's numbers as the UI shows them; `done` counts only what is checkpointed."""
        return {
            "total": self.total,
            "done": self.already + flushed,
            "answered": self.answered,
            "started_at": self.started_at,
            "updated_at": time.time(),
            "in_flight": client.pool.in_flight,
            "concurrency": concurrency,
            "requests": client.stats.requests,
            "retries_by_cause": dict(client.stats.retries_by_cause),
        }

    def report(self, client: SGLangClient) -> GenerationReport:
        return GenerationReport(
            started_at=self.started_at,
            finished_at=time.time(),
            requests=client.stats.requests,
            answered=self.answered,
            request_seconds=round(client.stats.request_seconds, 3),
            output_tokens=self.output_tokens,
            retries_by_cause=dict(client.stats.retries_by_cause),
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
        )


def raw_answer(sample_id: str, generation: Generation) -> RawAnswer:
    digest, tail = text_digest(generation.text)
    return RawAnswer(
        id=sample_id,
        output_ids=generation.output_ids,
        meta_info=generation.meta_info,
        text_digest=digest,
        text_replacement_tail=tail,
        rid=generation.rid,
        endpoint=generation.endpoint,
        attempts=generation.attempts,
    )


def rejection_line(sample_id: str, reason: Reason, detail: str) -> bytes:
    return msgspec.json.encode({"id": sample_id, "rejected": {"reason": reason.value, "detail": detail}})


async def _ask(
    client: SGLangClient,
    answer_id: str,
    prompt_ids: list[int],
    params: dict[str, Any],
    settings: GenerateSettings,
    checkpointer: _Checkpointer,
    progress: _Progress,
    keep_prompt: bool = False,
) -> RawAnswer | None:
    """One answer, checkpointed; or None when the sample is rejected (checkpointed with its reason). `keep_prompt`:
    the answer carries its prompt (one that prompts/ does not hold)."""
    try:
        generation = await client.generate(prompt_ids, params, answer_id)
    except PermanentError as e:
        checkpointer.add(rejection_line(answer_id, Reason.SERVER_REJECTED, str(e)))
        progress.done += 1
        return None
    except TransientError as e:
        if e.cause not in RECORD_FAULTS:
            raise  # the fleet, not this sample: the task fails and Airflow retries it
        reason = Reason.SERVER_ABORTED if e.cause == "abort" else Reason.COUNT_MISMATCH
        checkpointer.add(rejection_line(answer_id, reason, f"{settings.max_attempts} attempts: {e}"))
        progress.done += 1
        return None
    answer = raw_answer(answer_id, generation)
    if keep_prompt:
        answer = msgspec.structs.replace(answer, prompt_ids=prompt_ids)
    checkpointer.add(encode_answer(answer))
    progress.answer(generation)
    return answer


async def _worker(
    client: SGLangClient,
    queue: Iterator[str],
    prompts: ShardPrompts,
    settings: GenerateSettings,
    checkpointer: _Checkpointer,
    progress: _Progress,
) -> None:
    for sample_id in queue:
        prompt_ids = prompts.prompt_ids(sample_id).tolist()
        params = {**settings.sampling_params, **prompts.sampling(sample_id)}  # a sample's temperature and seed
        await _ask(client, sample_id, prompt_ids, params, settings, checkpointer, progress)


@dataclass
class _Conversations:
    """An on-policy shard's conversations, each answered turn by turn (regen.on_policy). A worker takes one
    conversation at a time and follows it to its end, so a turn waits only for its own previous turn and the
    conversation's prefix is still in the server's cache; the fleet stays full with many conversations in flight.
    A resumed conversation reads its finished turns from the checkpoints and asks only for the first unfinished
    one: each (conversation, turn) is generated once."""

    prompts: ShardPrompts
    renderer: ChatRenderer
    done: Checkpoints
    render_thread: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "regen-render"))

    async def worker(
        self,
        client: SGLangClient,
        queue: Iterator[str],
        settings: GenerateSettings,
        checkpointer: _Checkpointer,
        progress: _Progress,
    ) -> None:
        for sample_id in queue:
            await self.converse(sample_id, client, settings, checkpointer, progress)

    async def converse(
        self,
        sample_id: str,
        client: SGLangClient,
        settings: GenerateSettings,
        checkpointer: _Checkpointer,
        progress: _Progress,
    ) -> None:
        prompts = self.prompts
        turns = dataset_turns(json.loads(prompts.later(sample_id) or "[]"))
        messages = json.loads(prompts.messages_json(sample_id))
        tools = json.loads(prompts.tools_json(sample_id) or "[]")
        prompt_ids = prompts.prompt_ids(sample_id).tolist()
        for turn, recorded in enumerate(turns, 1):
            answer_id = turn_id(sample_id, turn)
            if turn > 1:
                try:
                    prompt_ids = await asyncio.get_running_loop().run_in_executor(
                        self.render_thread, self.renderer.render_ids, messages, tools or None
                    )
                except (ValueError, jinja2.TemplateError) as e:  # a template refusing this history ends it here
                    ended = Ended(Reason.EARLIER_TURN_UNUSABLE, f"turn {turn}'s prompt does not render: {e}")
                    return self._end(sample_id, turn - 1, len(turns), ended, checkpointer, progress)
            answer: RawAnswer | None = None
            if answer_id in self.done.answers:  # finished by an earlier try: read, never asked again
                answer = decode_answer(self.done.answers[answer_id])
                check_resumed(answer, prompt_ids)
            elif answer_id not in self.done.rejected:
                params = {**settings.sampling_params, **prompts.sampling(answer_id)}
                answer = await _ask(client, answer_id, prompt_ids, params, settings, checkpointer, progress, True)
            if turn == len(turns):
                return
            after = after_answer(answer, prompt_ids, messages, tools, recorded, self.renderer)
            if isinstance(after, Ended):
                return self._end(sample_id, turn, len(turns), after, checkpointer, progress)
            messages = after

    def _end(
        self, sample_id: str, turn: int, turns: int, ended: Ended, checkpointer: _Checkpointer, progress: _Progress
    ) -> None:
        """The turns after `turn` rejected with the reason the conversation ended there (those not already)."""
        for later in range(turn + 1, turns + 1):
            answer_id = turn_id(sample_id, later)
            if answer_id not in self.done:
                checkpointer.add(rejection_line(answer_id, ended.reason, f"turn {turn}: {ended.detail}"))
                progress.done += 1


async def _ticker(progress: _Progress, client: SGLangClient, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        progress.log_line(client)


async def _generate_missing(
    settings: GenerateSettings,
    prompts: ShardPrompts,
    todo: list[str],
    checkpointer: _Checkpointer,
    progress: _Progress,
    conversations: _Conversations | None = None,
) -> GenerationReport:
    """`todo`: the samples to answer, or the on-policy conversations to follow (`conversations`)."""
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    async with settings.api_keys.session(connector=connector) as session:
        pool = EndpointPool(settings.endpoints, session, fleet_wait_s=settings.fleet_wait_s)
        client = SGLangClient(pool, session, settings.request_timeout_s, settings.max_attempts, settings.backoff_max_s)
        queue = iter(todo)  # shared by the workers: each sample is taken exactly once
        work = (
            conversations.worker(client, queue, settings, checkpointer, progress)
            if conversations is not None
            else _worker(client, queue, prompts, settings, checkpointer, progress)
            for _ in range(min(settings.concurrency, len(todo)))
        )
        workers = [asyncio.create_task(w) for w in work]
        ticker = asyncio.create_task(_ticker(progress, client, settings.progress_s))
        flusher = asyncio.create_task(
            checkpointer.run(
                lambda: progress.report(client), lambda flushed: progress.status(client, len(workers), flushed)
            )
        )
        try:
            await asyncio.gather(*workers)
        except TransientError as e:
            raise FleetUnavailable(
                f"a sample failed {settings.max_attempts} attempts on {settings.endpoints} ({e}); finished answers "
                "are checkpointed and a retry of this task resumes from them"
            ) from e
        finally:
            for task in [*workers, ticker]:
                task.cancel()
            await asyncio.gather(*workers, ticker, return_exceptions=True)
            await pool.close()
            checkpointer.stop()
            await flusher  # the last answers, and this try's final counts
            progress.log_line(client)
        return progress.report(client)


def run_generate(
    shard: ShardManifest, storage: Storage, settings: GenerateSettings, renderer: ChatRenderer | None = None
) -> ShardManifest:
    """`renderer`: the profile's, which renders the later turns of an on-policy shard's conversations."""
    raw_key = shard.keys.raw
    conversation_columns = ["messages", "tools"] if shard.num_answers is not None else []  # on-policy (prepare)
    prompts = read_prompts(storage, shard.prompts_key, ["id", "prompt_ids", *conversation_columns])
    if prompts.on_policy and renderer is None:
        raise ValueError(f"{shard.name} holds on-policy conversations: generating them needs the profile's renderer")
    ids = prompts.answer_ids(turn_count)
    if storage.exists(raw_key):  # an earlier attempt finished this shard
        return _summarise_existing(storage, shard, raw_key, ids)
    done = load_checkpoints(storage, shard)
    todo = [answer_id for answer_id in ids if answer_id not in done]
    log.info(
        "%s %s: %d prompts, %d checkpointed, %d to generate",
        shard.location.dataset,
        shard.name,
        len(ids),
        len(done),
        len(todo),
    )
    if todo:
        checkpointer = _Checkpointer(storage, shard, done.next_part, settings.checkpoint_every, settings.checkpoint_s)
        progress = _Progress(shard, len(ids), len(done))
        conversations = None
        if prompts.on_policy:
            assert renderer is not None
            conversations = _Conversations(prompts, renderer, done)
            todo = _longest_first(todo)
        try:
            asyncio.run(_generate_missing(settings, prompts, todo, checkpointer, progress, conversations))
        finally:
            if conversations is not None:
                conversations.render_thread.shutdown()
        done = load_checkpoints(storage, shard)
    report = GenerationReport.combined(list(done.tries.values()))
    if report is not None:  # beside the raw file, for a try that finds the shard already done
        storage.put_bytes(shard.keys.generation, msgspec.json.encode(dataclasses.asdict(report)))
    files = _write_raw(storage, shard, raw_key, ids, done)
    for key in storage.list_keys(shard.keys.checkpoints):  # the raw file holds every part's answers now
        storage.delete(key)
    stats = _stats(ids, done.answers.keys(), {i: r["reason"] for i, r in done.rejected.items()})
    return shard.with_stage("generate", stats, files, raw_key=raw_key, generation=report)


def _longest_first(todo: list[str]) -> list[str]:
    """The conversations with unfinished turns, those with the most such turns first: the shard's last requests are
    then the short conversations', and the fleet stays full until its end."""
    remaining = Counter(sample_of(answer_id) for answer_id in todo)
    return sorted(remaining, key=lambda sample_id: -remaining[sample_id])


def _stats(ids: list[str], answered: Any, rejected: dict[str, str]) -> StageStats:
    """Every prompt is answered or rejected with its reason: nothing else leaves generate."""
    stats = StageStats()
    for sample_id in ids:
        if sample_id in answered:
            stats.keep()
        else:
            stats.drop(rejected.get(sample_id, Reason.SERVER_REJECTED.value))
    return stats


def _write_raw(
    storage: Storage, shard: ShardManifest, raw_key: str, ids: list[str], done: Checkpoints
) -> dict[str, str]:
    """Rejections into rejected/, then the answers in prompt order into raw/: the raw file marks the shard done."""
    missing = [i for i in ids if i not in done]
    if missing:
        raise AssertionError(f"{shard.name}: {len(missing)} samples neither answered nor rejected, e.g. {missing[:3]}")
    with RejectionWriter(storage, shard.keys.rejected("generate")) as rejections:
        for sample_id, rejected in done.rejected.items():
            rejections.add(sample_id, Reason.of(rejected["reason"]), rejected["detail"])
        files = rejections.upload()
    with tempfile.TemporaryDirectory(prefix="regen-raw-") as tmp:  # streamed: a shard's raw file can be large
        path = Path(tmp) / "raw.jsonl.zst"
        write_raw(path, (done.answers[i] for i in ids if i in done.answers))
        files[raw_key] = storage.put_file(raw_key, path)
    return files


def _summarise_existing(storage: Storage, shard: ShardManifest, raw_key: str, ids: list[str]) -> ShardManifest:
    with tempfile.TemporaryDirectory(prefix="regen-raw-") as tmp:
        path = Path(tmp) / "raw.jsonl.zst"
        storage.get_file(raw_key, path)
        answered = [answer.id for answer in iter_raw_file(path)]
        files = {raw_key: sha256_file(path)}
    if len(answered) != len(set(answered)):
        raise AssertionError(f"{raw_key}: duplicate sample ids")
    rejected: dict[str, str] = {}
    rejected_key = shard.keys.rejected("generate")
    if storage.exists(rejected_key):
        body = storage.get_bytes(rejected_key)
        rejected = {r["id"]: r["reason"] for r in map(json.loads, body.splitlines())}  # bytes: only \n, \r split
        files[rejected_key] = hashlib.sha256(body).hexdigest()
    report = None
    if storage.exists(shard.keys.generation):
        report = GenerationReport.from_dict(msgspec.json.decode(storage.get_bytes(shard.keys.generation)))
    stats = _stats(ids, set(answered), rejected)
    return shard.with_stage("generate", stats, files, raw_key=raw_key, generation=report)
