"""Asynchronous client for SGLang's native /generate over a fleet of endpoints.

aiohttp: one pooled session for thousands of concurrent requests in one thread (the GPU server is the bottleneck,
the client must never be). Every failure is classified: `TransientError` is retried (on the least-loaded endpoint,
with exponential backoff and jitter), `PermanentError` (a 400 with the server's message) rejects the sample.

What an answer says about whom:
- 400: the request is wrong. Where the fleet has another endpoint, the sample is asked there once more first: a 400
  only one server gives (a smaller --context-length) is that server's, not the prompt's.
- Any other status than 200 is the endpoint's fault, never the sample's: a 4xx other than 408 and 429 (a proxy's
  404 page, a 401 for a wrong key) comes from something that is no working SGLang /generate, and ejects the endpoint
  at once (fleet.py); the sample is retried elsewhere.
- A timeout on an endpoint that works (it answered another request meanwhile, or its /health answers now) is the
  sample's (`sample_timeout`): it does not count against the endpoint, and after `sample_timeouts` of them the
  sample is rejected instead of failing the task again and again. A timeout on an endpoint that does not is its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, wait_random_exponential

from regen.endpoints import redact_url
from regen.redaction import describe
from regen.sglang.fleet import Endpoint, EndpointPool, FleetUnavailable, readiness

log = logging.getLogger(__name__)

JSON_HEADERS = {"Content-Type": "application/json"}
_encoder = msgspec.json.Encoder()


class TransientError(Exception):
    """Worth another attempt: the connection, the server's load or an abort, not the request itself."""

    def __init__(self, cause: str, message: str, endpoint: str | None = None) -> None:
        super().__init__(f"{cause}: {message}")
        self.cause = cause
        self.endpoint = endpoint


class PermanentError(Exception):
    """The server refused the request itself (400); retrying cannot help."""

    def __init__(self, message: str, endpoint: str | None = None) -> None:
        super().__init__(message)
        self.endpoint = endpoint


# Faults of one sample's answer, not of the fleet: when a sample's attempts end in one, the sample is rejected with
# that cause as its reason and the shard goes on.
RECORD_FAULTS = frozenset({"abort", "count_mismatch", "sample_timeout"})
REFUSED_HERE = "refused_here"  # a 400 that is asked again on another endpoint


class _Response(msgspec.Struct):
    """/generate's answer, typed: an id that is not an integer fails the decode instead of reaching a record."""

    meta_info: dict[str, Any]
    output_ids: list[int] | None = None
    text: str | None = None


_response = msgspec.json.Decoder(_Response)


@dataclass(frozen=True)
class Generation:
    output_ids: list[int]
    meta_info: dict[str, Any]
    text: str | None
    endpoint: str
    rid: str
    attempts: int

    @property
    def finish_reason(self) -> dict[str, Any]:
        return dict(self.meta_info["finish_reason"])


def answer_id_of(request_rid: str) -> str:
    """The answer a request's rid asks for: the client sends `<answer id>-<nonce>-<attempt>` (ids hold dashes)."""
    return request_rid.rsplit("-", 2)[0]


def error_message(body: str) -> str:
    """The message out of any of SGLang's error shapes ({"error": {"message"}} from the engine, {"error": "..."} from
    its request parser, {"message"} from the schema check), or the raw body."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return body[:500]
    if isinstance(data, dict):
        if isinstance(data.get("error"), dict):
            return str(data["error"].get("message", data))
        if isinstance(data.get("error"), str):
            return data["error"]
        if "message" in data:
            return str(data["message"])
    return body[:500]


def check_response(body: bytes) -> _Response:
    """Token ids are taken strictly: anything that does not add up is a transient fault, never a record. (Whether
    prompt_tokens matches the prompt is judged at validate, as a disagreement of the server with itself.)"""
    try:
        data = _response.decode(body)
    except msgspec.DecodeError as e:
        raise TransientError("bad_response", f"not a /generate answer ({e}): {body[:200]!r}") from e
    finish = data.meta_info.get("finish_reason")
    if isinstance(finish, dict) and finish.get("type") == "abort":
        raise TransientError("abort", str(finish.get("message")))
    if not data.output_ids:
        raise TransientError("bad_response", f"output_ids missing or empty (finish_reason {finish})")
    if data.meta_info.get("completion_tokens") != len(data.output_ids):
        raise TransientError(
            "count_mismatch",
            f"{len(data.output_ids)} output_ids but completion_tokens={data.meta_info.get('completion_tokens')}",
        )
    if not isinstance(finish, dict) or finish.get("type") not in ("stop", "length"):
        raise TransientError("bad_response", f"unexpected finish_reason {finish}")
    return data


@dataclass
class ClientStats:
    requests: int = 0
    request_seconds: float = 0.0  # summed over requests, from send to answer
    retries_by_cause: Counter[str] = field(default_factory=Counter)


class SGLangClient:
    def __init__(
        self,
        pool: EndpointPool,
        session: aiohttp.ClientSession,
        request_timeout_s: float = 3600.0,
        max_attempts: int = 5,
        backoff_max_s: float = 30.0,
        sample_timeouts: int = 2,
        priority: int | None = None,
        observe: Callable[[str, str, float], None] | None = None,
    ) -> None:
        self.pool = pool
        self.observe = observe  # each attempt's endpoint, outcome ("answered", "refused", a fault) and seconds
        self.priority = priority  # SGLang's request priority, sent only when set (docs/scaling.md)
        self.session = session
        self.timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self.max_attempts = max_attempts
        self.sample_timeouts = sample_timeouts
        self.backoff_max_s = backoff_max_s
        self._backoff = wait_random_exponential(multiplier=0.5, max=backoff_max_s)
        self.stats = ClientStats()
        # A rid never repeats, even across task retries: a random prefix per client (a retried task builds a new
        # one), then a count per sample (one urandom read per client, not per request).
        self._nonce_prefix, self._samples = uuid.uuid4().hex[:8], itertools.count()

    async def _attempt(self, payload: bytes, rid: str, avoid: str | None, prefer: str | None = None) -> Generation:
        endpoint = await self.pool.acquire(avoid, prefer)
        self.stats.requests += 1
        cause: str | None = "other"  # None once the endpoint has answered (a refusal of the request included)
        outcome: str | None = None  # "answered", "refused"; else the fault's cause
        sent = time.monotonic()
        try:
            async with self.session.post(
                f"{endpoint.url}/generate", data=payload, headers=JSON_HEADERS, timeout=self.timeout
            ) as resp:
                body = await resp.read()
            if resp.status == 400:
                cause, outcome = None, "refused"  # the endpoint works; the request is wrong
                raise PermanentError(error_message(body.decode("utf-8", "replace")), endpoint.url)
            if resp.status != 200:  # the endpoint's fault, whatever it is (module docstring)
                message = error_message(body.decode("utf-8", "replace"))
                raise TransientError(f"http_{resp.status}", f"{endpoint.url}: {message}", endpoint.url)
            data = check_response(body)
            cause, outcome = None, "answered"
        except TimeoutError as e:
            waited = time.monotonic() - sent
            cause = "sample_timeout" if await self._alive(endpoint, sent) else "timeout"
            raise TransientError(cause, f"{endpoint.url}: no answer in {waited:.0f}s", endpoint.url) from e
        except aiohttp.ClientError as e:
            cause = "connection"
            raise TransientError(cause, f"{endpoint.url}: {describe(e)}", endpoint.url) from e
        except TransientError as e:
            cause, e.endpoint = e.cause, endpoint.url
            raise
        finally:
            seconds = time.monotonic() - sent
            self.stats.request_seconds += seconds
            self.pool.release(endpoint, cause)
            if self.observe is not None:
                self.observe(endpoint.url, outcome or cause or "other", seconds)
        assert data.output_ids is not None
        return Generation(data.output_ids, data.meta_info, data.text, endpoint.url, rid, 0)

    async def _alive(self, endpoint: Endpoint, since: float) -> bool:
        """Whether an endpoint a request timed out on works: it answered another request since, or its /health
        (SGLang's: a 1-token generation) answers now. Then the sample is the slow one, not the server."""
        if endpoint.answered_at > since:
            return True
        try:
            return await readiness(self.session, endpoint.url) is None
        except FleetUnavailable:  # nothing listens there any more
            return False

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        rid: str,
        prefer: str | None = None,
        priority: int | None = None,
    ) -> Generation:
        """One sample: transient faults retried with exponential backoff and jitter, on another endpoint if any.
        `prefer`: the endpoint to ask first where it is not much busier than the others (EndpointPool.acquire).
        `priority`: this request's, instead of the client's.

        The request body is encoded once per sample; only the rid changes between attempts. Every attempt goes
        through tenacity's loop: its machinery costs about 0.17 ms a request (bench/bench_generate.py cpu), nothing
        beside answers that take seconds to minutes of GPU time."""
        nonce = f"{self._nonce_prefix}{next(self._samples):x}"
        request: dict[str, Any] = {"input_ids": prompt_ids, "sampling_params": sampling_params}
        if (chosen := self.priority if priority is None else priority) is not None:
            request["priority"] = chosen
        body = _encoder.encode({**request, "rid": ""})
        head, tail = body[: -len(b'""}')], b'"}'  # the body ends with the empty rid
        avoid: str | None = None
        refused_once, timeouts = False, 0

        def worth_another(error: BaseException) -> bool:
            if not isinstance(error, TransientError):
                return False
            return error.cause != "sample_timeout" or timeouts < self.sample_timeouts

        retrying = AsyncRetrying(
            retry=retry_if_exception(worth_another),
            stop=stop_after_attempt(self.max_attempts),
            wait=self._backoff,
            before_sleep=self._count_retry,
            reraise=True,
        )
        async for trial in retrying:
            with trial:
                attempt = trial.retry_state.attempt_number
                attempt_rid = f"{rid}-{nonce}-{attempt}"
                payload = b"".join((head, b'"', attempt_rid.encode(), tail))
                try:
                    generation = await self._attempt(payload, attempt_rid, avoid, prefer if attempt == 1 else None)
                except TransientError as e:
                    avoid = e.endpoint  # the next try goes elsewhere where the fleet has another endpoint
                    timeouts += e.cause == "sample_timeout"
                    raise
                except PermanentError as e:
                    if refused_once or attempt == self.max_attempts or not self.pool.has_other(e.endpoint):
                        raise
                    refused_once, avoid = True, e.endpoint  # asked once more, elsewhere (module docstring)
                    raise TransientError(REFUSED_HERE, f"{e.endpoint}: {e}", e.endpoint) from e
                return dataclasses.replace(generation, attempts=attempt)
        raise AssertionError("unreachable: tenacity reraises the last error")

    def _count_retry(self, state: RetryCallState) -> None:
        """A failed try that will be tried again, by its cause."""
        error = state.outcome.exception() if state.outcome else None
        self.stats.retries_by_cause[error.cause if isinstance(error, TransientError) else "other"] += 1


async def get_json(session: aiohttp.ClientSession, url: str, timeout_s: float = 10.0) -> Any:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        resp.raise_for_status()
        return await resp.json(content_type=None)


async def wait_healthy(
    session: aiohttp.ClientSession, url: str, deadline_s: float, poll_s: float = 2.0, path: str = "/health"
) -> None:
    """Waits up to deadline_s for a server that answers but is not ready (503 while it warms up, a timeout while it
    is busy), logging each wait. Where nothing listens (connection refused, unknown host) it raises NothingListens
    at once: no deadline makes a server appear at a wrong address."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while (last := await readiness(session, url, path)) is not None:
        waited = loop.time() - started
        if waited >= deadline_s:
            raise FleetUnavailable(f"{redact_url(url)}{path} not ready after {deadline_s:.0f}s (last: {last})")
        log.info(
            "waiting for %s%s to answer 200: %.0fs of %.0fs so far, last: %s",
            redact_url(url),
            path,
            waited,
            deadline_s,
            last,
        )
        await asyncio.sleep(poll_s)
