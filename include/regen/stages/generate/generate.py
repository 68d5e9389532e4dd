"""The generate stage: one shard of prompts -> raw answers, kept exactly as /generate returned them.

Durable and exactly-once per sample id: finished answers (and permanent rejections) are flushed to small part files
at least every `checkpoint_s` seconds; a retried or cleared task reads the parts and requests only what is missing,
so a killed task redoes only its requests in flight and its last second or so of answers. Every part also carries the
try's generation counts, so the shard's report covers every try, the killed ones included. The shard's raw file is
written once, from the parts, when nothing is missing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from regen.chat import ChatRenderer
from regen.endpoints import Endpoint, redact_url
from regen.fleet_losses import DEFAULT_SHARE, check_losses, fleet_losses, version_answers
from regen.fleet_losses import TooManyServerRejections as TooManyServerRejections  # what a shard fails with
from regen.manifest import GenerationReport, ShardManifest, StageStats
from regen.metrics import current as metrics
from regen.on_policy import turn_count
from regen.reasons import Reason
from regen.records import RawAnswer, ShardPrompts, encode_answer, iter_raw_file, read_prompts, text_digest, write_raw
from regen.rejections import RejectionWriter
from regen.sglang.auth import NO_KEYS, ApiKeys
from regen.sglang.client import RECORD_FAULTS, Generation, PermanentError, SGLangClient, TransientError
from regen.sglang.fleet import EndpointPool, FleetUnavailable
from regen.stages.generate.checkpoints import (
    OUTAGE_S,
    Checkpointer,
    Checkpoints,
    load_checkpoints,
    rejection_line,
    reopen,
)
from regen.stages.generate.conversations import Conversations, chain_priority
from regen.stages.generate.order import LengthOrder, conversation_order, shard_order
from regen.stages.generate.progress import Progress
from regen.storage import Storage, sha256_file

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerateSettings:
    endpoints: Sequence[str | Endpoint]  # a URL's login goes by the session, never in a URL (regen.sglang.auth)
    sampling_params: dict[str, Any]
    concurrency: int = 64  # this shard task's share of the fleet's in-flight budget
    request_timeout_s: float = 3600.0
    max_attempts: int = 5
    checkpoint_every: int = 1024
    checkpoint_s: float = 1.0
    checkpoint_outage_s: float = OUTAGE_S  # storage taking no checkpoint this long fails the task
    progress_s: float = 10.0
    fleet_wait_s: float = 120.0
    backoff_max_s: float = 30.0
    sample_timeouts: int = 2  # a sample that timed out this often, its endpoint answering others, is rejected
    max_server_rejected_share: float = DEFAULT_SHARE  # of the version's answers the fleet may lose (fleet_losses)
    priority: int | None = None  # SGLang's request priority: below live traffic on a shared fleet
    priority_order: str | None = None  # with chain priority: the fleet's ("larger" or "smaller" first); None: off
    endpoint_affinity: bool = True  # an on-policy turn first to the endpoint that answered the turn before it
    api_keys: ApiKeys = field(default=NO_KEYS, repr=False)
    vocab_size: int | None = None  # prompt ids must be below it; None: the prepared tokenizer's (run_generate)


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


async def _ask(
    client: SGLangClient,
    answer_id: str,
    prompt_ids: list[int],
    params: dict[str, Any],
    settings: GenerateSettings,
    checkpointer: Checkpointer,
    progress: Progress,
    keep: bool = False,
    prefer: str | None = None,
    priority: int | None = None,
) -> RawAnswer | Reason:
    """One answer, checkpointed; or the reason the sample is rejected (checkpointed with it). `keep`:
    the answer carries its prompt (one that prompts/ does not hold: an on-policy turn's). `prefer`: the endpoint
    to ask first (an on-policy turn's: the one that answered its previous turn, whose cache holds the history)."""
    bad = out_of_vocab(prompt_ids, settings.vocab_size)
    if bad is not None:  # never sent: SGLang 0.5.23 does not range-check input ids, and one kills the server
        return _reject(checkpointer, progress, answer_id, Reason.PROMPT_ID_OUT_OF_VOCAB, bad)
    in_flight = progress.in_flight
    in_flight.inc()
    try:
        generation = await client.generate(prompt_ids, params, answer_id, prefer, priority)
    except PermanentError as e:
        detail = f"{redact_url(e.endpoint)}: {e}" if e.endpoint else str(e)
        return _reject(checkpointer, progress, answer_id, Reason.SERVER_REJECTED, detail, e.endpoint)
    except TransientError as e:
        if e.cause not in RECORD_FAULTS:
            raise  # the fleet, not this sample: the task fails and Airflow retries it
        reason = RECORD_FAULT_REASONS[e.cause]
        return _reject(checkpointer, progress, answer_id, reason, f"last attempt: {e}", e.endpoint)
    finally:
        in_flight.dec()
    answer = raw_answer(answer_id, generation)
    if keep:
        answer = msgspec.structs.replace(answer, prompt_ids=prompt_ids)
    progress.answer(generation)  # counted first: a part that this record closes carries counts that include it
    checkpointer.add(encode_answer(answer))
    return answer


RECORD_FAULT_REASONS = {
    "abort": Reason.SERVER_ABORTED,
    "count_mismatch": Reason.COUNT_MISMATCH,
    "sample_timeout": Reason.SAMPLE_TIMEOUT,
}


def check_server_rejections(shard: ShardManifest, answers: int, done: Checkpoints, share: float) -> None:
    """Fails the shard early (red, its checkpoints kept) when its own fleet losses (regen.fleet_losses) are past what
    its dataset version of `answers` answers may keep: no version could be published then. Fewer are kept with
    their reason, and publish counts them over the whole version."""
    then = (
        "Look at those endpoints (their logs: retractions, out of memory; a router's sick worker), fix or remove "
        "them and run again: these answers are asked again, the others kept"
    )
    check_losses(f"{shard.location.dataset} {shard.name}", fleet_losses(done.rejected), answers, share, then)


def out_of_vocab(prompt_ids: list[int], vocab_size: int | None) -> str | None:
    """What is wrong with a prompt whose ids leave the vocabulary [0, vocab_size), or None."""
    if vocab_size is None:
        return None
    bad = next((i for i in prompt_ids if not 0 <= i < vocab_size), None)
    return None if bad is None else f"prompt id {bad} is outside the vocabulary of {vocab_size} ids"


def prepared_vocab(storage: Storage, shard: ShardManifest) -> int | None:
    """The vocabulary of the tokenizer the shard's prompts were prepared with (prompts/prepare.json's token roles)."""
    key = shard.location.prepared
    if not storage.exists(key):
        return None
    size = (json.loads(storage.get_bytes(key)).get("token_roles") or {}).get("vocab_size")
    return int(size) if isinstance(size, int) else None


def _reject(
    checkpointer: Checkpointer,
    progress: Progress,
    answer_id: str,
    reason: Reason,
    detail: str,
    endpoint: str | None = None,
    ended_by: dict[str, str] | None = None,
) -> Reason:
    progress.settle()
    checkpointer.add(rejection_line(answer_id, reason, detail, endpoint and redact_url(endpoint), ended_by))
    return reason


async def _worker(
    client: SGLangClient,
    queue: Iterator[str],
    prompts: ShardPrompts,
    settings: GenerateSettings,
    checkpointer: Checkpointer,
    progress: Progress,
) -> None:
    for sample_id in queue:
        prompt_ids = prompts.prompt_ids(sample_id).tolist()
        params = {**settings.sampling_params, **prompts.sampling(sample_id)}  # a sample's temperature and seed
        answer = await _ask(client, sample_id, prompt_ids, params, settings, checkpointer, progress)
        if isinstance(answer, RawAnswer) and isinstance(queue, LengthOrder):
            queue.observe(sample_id, len(answer.output_ids))


async def _ticker(progress: Progress, client: SGLangClient, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        progress.log_line(client)


async def _generate_missing(
    settings: GenerateSettings,
    prompts: ShardPrompts,
    todo: list[str] | LengthOrder,
    checkpointer: Checkpointer,
    progress: Progress,
    conversations: Conversations | None = None,
) -> GenerationReport:
    """`todo`: the samples to answer, or the on-policy conversations to follow (`conversations`)."""
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    targets = [Endpoint.parse(url) for url in settings.endpoints]
    async with settings.api_keys.session(targets, connector=connector) as session:
        pool = EndpointPool(
            [t.base for t in targets], session, fleet_wait_s=settings.fleet_wait_s, hints=progress.hints
        )
        client = SGLangClient(
            pool,
            session,
            settings.request_timeout_s,
            settings.max_attempts,
            settings.backoff_max_s,
            settings.sample_timeouts,
            settings.priority if settings.priority_order is None else settings.priority or 0,
            observe=progress.request,
        )
        flusher = checkpointer.start(
            lambda: progress.report(client), lambda flushed: progress.status(client, len(workers), flushed)
        )
        queue = iter(todo)  # shared by the workers: each sample is taken exactly once
        work = (
            conversations.worker(
                queue,
                settings.sampling_params,
                partial(_ask, client, settings=settings, checkpointer=checkpointer, progress=progress, keep=True),
                partial(_reject, checkpointer, progress),
            )
            if conversations is not None
            else _worker(client, queue, prompts, settings, checkpointer, progress)
            for _ in range(min(settings.concurrency, len(todo)))
        )
        workers = [asyncio.create_task(w) for w in work]
        ticker = asyncio.create_task(_ticker(progress, client, settings.progress_s))
        try:
            await _answer_all(workers, flusher)
        except TransientError as e:
            raise FleetUnavailable(
                f"a sample failed {settings.max_attempts} attempts on {[str(t) for t in targets]} ({e}); finished "
                "answers are checkpointed and a retry of this task resumes from them"
            ) from e
        finally:
            for task in [*workers, ticker]:
                task.cancel()
            await asyncio.gather(*workers, ticker, return_exceptions=True)
            await pool.close()
            await checkpointer.finish(flusher)  # the last answers, with the final counts
            progress.log_line(client)
        return progress.report(client)


async def _answer_all(workers: list[asyncio.Task[None]], flusher: asyncio.Task[None]) -> None:
    """The workers to the end, watching the flusher: it ends early only when storage takes no checkpoint, and then
    the task stops asking (answers it could not keep would only pile up) and fails with CheckpointsUnwritable."""
    answering = asyncio.gather(*workers)
    watched: list[asyncio.Future[Any]] = [answering, flusher]
    await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
    if flusher.done() and not answering.done():
        answering.cancel()
        await asyncio.gather(answering, return_exceptions=True)
        flusher.result()  # raises: the flusher never ends on its own before it is stopped
    await answering


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
    if storage.exists(raw_key) and not reopen(storage, shard):  # an earlier attempt finished this shard
        _remove_checkpoints(storage, shard)  # (it may have died removing them)
        metrics().settled.labels(shard.location.dataset).inc(len(ids))
        return _summarize_existing(storage, shard, raw_key, ids)
    done = load_checkpoints(storage, shard)
    asked_again = done.ask_again()
    todo = [answer_id for answer_id in ids if answer_id not in done]
    log.info(
        "%s %s: %d prompts, %d checkpointed, %d to generate (%d rejected server-side before, asked again)",
        shard.location.dataset,
        shard.name,
        len(ids),
        len(done),
        len(todo),
        len(asked_again),
    )
    if todo:
        if settings.vocab_size is None:
            settings = dataclasses.replace(settings, vocab_size=prepared_vocab(storage, shard))
        every, outage_s = settings.checkpoint_every, settings.checkpoint_outage_s
        checkpointer = Checkpointer(storage, shard, done.next_part, every, settings.checkpoint_s, outage_s)
        progress = Progress(shard, len(ids), len(done))
        conversations = None
        if prompts.on_policy:
            assert renderer is not None
            chain = chain_priority(settings.priority_order, settings.priority, progress.hints, prompts, todo)
            conversations = Conversations(prompts, renderer, done, settings.endpoint_affinity, chain)
            todo = conversation_order(prompts, todo, progress.hints)  # the longest chain first: a hint
        longest = settings.sampling_params.get("max_new_tokens")  # no answer is longer, nor any prediction
        order = shard_order(prompts, todo, progress.hints, longest, storage, shard) if conversations is None else todo
        try:
            asyncio.run(_generate_missing(settings, prompts, order, checkpointer, progress, conversations))
        finally:
            if conversations is not None:
                conversations.render_thread.shutdown()
        done = load_checkpoints(storage, shard)
    else:  # every answer checkpointed by a try before this one: settled
        metrics().settled.labels(shard.location.dataset).inc(len(ids))
    answers = version_answers(storage, shard.location) or len(ids)  # the allowance is the version's
    metrics().fleet_losses.labels(shard.location.dataset).inc(len(fleet_losses(done.rejected)))
    check_server_rejections(shard, answers, done, settings.max_server_rejected_share)
    report = GenerationReport.combined(list(done.tries.values()))
    if report is not None:  # beside the raw file, for a try that finds the shard already done
        storage.put_bytes(shard.keys.generation, msgspec.json.encode(dataclasses.asdict(report)))
    files = _write_raw(storage, shard, raw_key, ids, done)
    _remove_checkpoints(storage, shard)  # the raw file holds every part's answers now
    stats = _stats(ids, done.answers.keys(), {i: r["reason"] for i, r in done.rejected.items()})
    return shard.with_stage("generate", stats, files, raw_key=raw_key, generation=report)


def _remove_checkpoints(storage: Storage, shard: ShardManifest) -> None:
    """The shard's checkpoint parts and progress, once its raw file holds their answers: no version lists them."""
    for key in storage.list_keys(shard.keys.checkpoints):
        storage.delete(key)


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
            kept = {k: rejected[k] for k in ("endpoint", "ended_by") if k in rejected}  # whose loss (fleet_losses)
            rejections.add(sample_id, Reason.of(rejected["reason"]), rejected["detail"], **kept)
        files = rejections.upload()
    with tempfile.TemporaryDirectory(prefix="regen-raw-") as tmp:  # streamed: a shard's raw file can be large
        path = Path(tmp) / "raw.jsonl.zst"
        write_raw(path, (done.answers[i] for i in ids if i in done.answers))
        files[raw_key] = storage.put_file(raw_key, path)
    return files


def _summarize_existing(storage: Storage, shard: ShardManifest, raw_key: str, ids: list[str]) -> ShardManifest:
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
