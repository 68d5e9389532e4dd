"""Conversations -> prompt ids through the profile's chat template, in worker processes, in input order.

Real target tokenizers (Kimi's among them) are slow Python tokenizers, so rendering runs in a pool of processes that
each build the renderer once. Chunks are submitted in order and collected in order, at most a few per worker in
flight: output order is the input order whatever the number of workers, and memory stays bounded. Workers start
with `spawn`, safe inside an Airflow task process that already runs threads (plain `fork` is not), and without
re-importing the parent's `__main__` (see `_WorkerProcess`).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import multiprocessing.context
import os
import sys
import time
import types
from collections import deque
from collections.abc import Generator, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from itertools import chain, islice
from typing import Any, TypeVar

from jinja2 import TemplateError

from regen.chat import ChatRenderer
from regen.chat_request import Refused
from regen.profiles import Profile
from regen.reasons import Reason
from regen.stages.prepare.normalize import Conversation, Rejection

log = logging.getLogger(__name__)

T = TypeVar("T")
CHUNK_SIZE = 32  # conversations per task sent to a worker
CHUNKS_IN_FLIGHT_PER_WORKER = 4
IN_PROCESS_BELOW = 1000  # conversations; a smaller dataset is not worth starting workers for
Job = tuple[list[dict[str, Any]], list[dict[str, Any]]] | None  # (messages, tools); None: nothing to render
Result = list[int] | Rejection | None

_worker_renderer: ChatRenderer | None = None  # one per worker process, built by `_start_worker`


@dataclass(frozen=True)
class Rendered:
    conversation: Conversation
    prompt_ids: list[int]


def available_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def pool_size(configured: int | None, tasks_at_once: int = 1) -> int:
    """Tokenizer processes for one task: as configured, or (None) its share of this machine's cores when
    `tasks_at_once` tasks may run on it together, each starting a pool (a Celery worker's concurrency): C pools of
    every core each would put C times the cores' work on them."""
    return configured or max(1, available_cores() // max(1, tasks_at_once))


def render(
    renderer: ChatRenderer, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> list[int] | Rejection:
    """Prompt ids, or a rejection when the template refuses the conversation or it exceeds the profile's limit."""
    try:
        if too_long := _certainly_too_long(renderer, messages, tools):
            return too_long
        ids = renderer.render_ids(messages, tools)
    except (TemplateError, Refused) as e:
        return _refused(e)
    return _within_limit(renderer, ids)


def render_many(renderer: ChatRenderer, jobs: list[Job]) -> list[Result]:
    """`render` of each job (None stays None), the same ids and rejections; where the renderer's batch encode is
    its per-prompt one (`encodes_rendered_text`), the texts are rendered one by one and encoded in one batch."""
    if not renderer.encodes_rendered_text:
        return [None if job is None else render(renderer, *job) for job in jobs]
    results: list[Result] = [None] * len(jobs)
    texts, positions = [], []
    for position, job in enumerate(jobs):
        if job is None:
            continue
        try:
            if too_long := _certainly_too_long(renderer, *job):
                results[position] = too_long
                continue
            texts.append(renderer.render_text(*job))
            positions.append(position)
        except (TemplateError, Refused) as e:
            results[position] = _refused(e)
    for position, ids in zip(positions, renderer.encode_texts(texts), strict=True):
        results[position] = _within_limit(renderer, ids)
    return results


def _refused(e: TemplateError | Refused) -> Rejection:
    if isinstance(e, Refused):  # normalize refuses these first; a conversation built elsewhere may still hold one
        return Rejection(Reason.TEMPLATE_ERROR, f"SGLang's chat layer refuses it: {e}"[:300])
    return Rejection(Reason.TEMPLATE_ERROR, str(e)[:300])


def _within_limit(renderer: ChatRenderer, ids: list[int]) -> list[int] | Rejection:
    limit = renderer.profile.max_prompt_tokens
    if len(ids) > limit:
        return Rejection(Reason.PROMPT_TOO_LONG, f"{len(ids)} tokens > {limit}")
    return ids


def _certainly_too_long(
    renderer: ChatRenderer, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> Rejection | None:
    """A conversation whose text cannot fit `max_prompt_tokens` at any tokenization is not tokenized: one 10 MB message
    costs gigabytes and seconds there. Only a conversation whose JSON alone is past the bound is rendered to text to
    measure; every other one goes straight to the tokenizer."""
    per_token, limit = renderer.max_token_bytes, renderer.profile.max_prompt_tokens
    if per_token is None or len(json.dumps([messages, tools])) <= limit * per_token:
        return None
    size = len(renderer.render_text(messages, tools).encode("utf-8", "surrogatepass"))
    if size <= limit * per_token:
        return None
    return Rejection(
        Reason.PROMPT_TOO_LONG,
        f"{size} bytes of prompt text: more than {limit} tokens however it is tokenized (a token of this vocabulary "
        f"holds at most {per_token} bytes), so it was not tokenized",
    )


def _start_worker(profile: Profile) -> None:
    global _worker_renderer
    _worker_renderer = ChatRenderer(profile)


def _render_chunk(jobs: list[Job]) -> list[Result]:
    if _worker_renderer is None:
        raise RuntimeError("tokenizer worker used before its renderer was built")
    return render_many(_worker_renderer, jobs)


def _job(outcome: Conversation | Rejection) -> Job:
    return None if isinstance(outcome, Rejection) else (outcome.messages, outcome.tools)


def _settle(outcome: Conversation | Rejection, result: Result) -> Rendered | Rejection:
    if isinstance(outcome, Rejection):
        return outcome
    if result is None:
        raise RuntimeError("a conversation came back from the tokenizer without prompt ids")
    return result if isinstance(result, Rejection) else Rendered(outcome, result)


def _chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


def render_ordered(
    items: Iterable[tuple[T, Conversation | Rejection]],
    renderer: ChatRenderer,
    workers: int,
    in_process_below: int = IN_PROCESS_BELOW,
) -> Generator[tuple[T, Rendered | Rejection], None, None]:
    """Each item's conversation rendered (rejections pass through untouched), in input order. Rendering runs in this
    process with one worker, and for fewer than `in_process_below` items (starting a worker costs about a second,
    more than rendering a small dataset)."""
    iterator = iter(items)
    head = list(islice(iterator, in_process_below))
    if workers > 1 and len(head) < in_process_below:
        workers = 1
    if workers > 1:
        yield from _render_in_pool(chain(head, iterator), renderer.profile, workers)
        return
    for chunk in _chunks(chain(head, iterator), CHUNK_SIZE):
        results = render_many(renderer, [_job(outcome) for _, outcome in chunk])
        for (payload, outcome), result in zip(chunk, results, strict=True):
            yield payload, _settle(outcome, result)


class _WorkerProcess(multiprocessing.context.SpawnProcess):
    """A spawned process that does not import the parent's `__main__` again, and starts from a daemonic process too.
    Spawn normally re-imports `__main__` in every child; in an Airflow task that is the `airflow` command, whose
    import initializes Airflow and fails there (task processes have no database), so every worker would die at
    start. The workers need nothing from `__main__`, so for the instant of the launch it is a blank module, and
    nothing of it is sent to the child."""

    def start(self) -> None:
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        # A Celery worker runs tasks in daemonic pool processes, and multiprocessing refuses children there, lest
        # they outlive a parent that is terminated. These cannot: a worker exits when its call queue breaks, which
        # the parent's death does. So the rule is lifted for the launch, and prepare keeps its workers on Celery.
        config = multiprocessing.current_process()._config  # type: ignore[attr-defined]
        daemonic = config.pop("daemon", None)
        try:
            super().start()
        finally:
            sys.modules["__main__"] = main
            if daemonic is not None:
                config["daemon"] = daemonic


class _WorkerContext(multiprocessing.context.SpawnContext):
    Process = _WorkerProcess


def _render_in_pool(
    items: Iterable[tuple[T, Conversation | Rejection]], profile: Profile, workers: int
) -> Iterator[tuple[T, Rendered | Rejection]]:
    """A worker that dies (killed, out of memory) fails the stage with `BrokenProcessPool`, never a silent hang."""
    started = time.monotonic()
    pool = ProcessPoolExecutor(workers, mp_context=_WorkerContext(), initializer=_start_worker, initargs=(profile,))
    log.info("tokenizing with %d worker processes (spawn, profile %s)", workers, profile.name)
    try:
        pending: deque[tuple[list[tuple[T, Conversation | Rejection]], Future[list[Result]]]] = deque()
        for chunk in _chunks(items, CHUNK_SIZE):
            pending.append((chunk, pool.submit(_render_chunk, [_job(o) for _, o in chunk])))
            if len(pending) >= workers * CHUNKS_IN_FLIGHT_PER_WORKER:
                yield from _collect(*pending.popleft())
        while pending:
            yield from _collect(*pending.popleft())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # also when the consumer stops early (a limit)
    log.info("tokenizer pool done in %.1f s", time.monotonic() - started)


def _collect(
    chunk: list[tuple[T, Conversation | Rejection]], result: Future[list[Result]]
) -> Iterator[tuple[T, Rendered | Rejection]]:
    for (payload, outcome), rendered in zip(chunk, result.result(), strict=True):
        yield payload, _settle(outcome, rendered)
