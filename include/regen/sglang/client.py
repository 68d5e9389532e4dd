"""Asynchronous client for SGLang's native /generate over a fleet of endpoints.

aiohttp: one pooled session for thousands of concurrent requests in one thread (the GPU server is the bottleneck,
the client must never be). Every failure is classified: `TransientError` is retried (on the least-loaded endpoint,
with exponential backoff and jitter), `PermanentError` (a 400 with the server's message) rejects the sample.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from regen.sglang.fleet import EndpointPool, FleetUnavailable, health_problem

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class TransientError(Exception):
    """Worth another attempt: the connection, the server's load or an abort, not the request itself."""

    def __init__(self, cause: str, message: str, endpoint: str | None = None) -> None:
        super().__init__(f"{cause}: {message}")
        self.cause = cause
        self.endpoint = endpoint


class PermanentError(Exception):
    """The server refused the request itself (400); retrying cannot help."""


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


def error_message(body: str) -> str:
    """The message out of either SGLang error shape, or the raw body."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return body[:500]
    if isinstance(data, dict):
        if isinstance(data.get("error"), dict):
            return str(data["error"].get("message", data))
        if "message" in data:
            return str(data["message"])
    return body[:500]


def check_response(data: Any, prompt_len: int) -> tuple[list[int], dict[str, Any]]:
    """Token ids are taken strictly: anything that does not add up is a transient fault, never a record."""
    if not isinstance(data, dict) or not isinstance(data.get("meta_info"), dict):
        raise TransientError("bad_response", f"no meta_info in response: {str(data)[:200]}")
    meta = data["meta_info"]
    finish = meta.get("finish_reason")
    if isinstance(finish, dict) and finish.get("type") == "abort":
        raise TransientError("abort", str(finish.get("message")))
    output_ids = data.get("output_ids")
    if not isinstance(output_ids, list) or not output_ids:
        raise TransientError("bad_response", f"output_ids missing or empty (finish_reason {finish})")
    if meta.get("completion_tokens") != len(output_ids):
        raise TransientError(
            "bad_response", f"{len(output_ids)} output_ids but completion_tokens={meta.get('completion_tokens')}"
        )
    if meta.get("prompt_tokens") is not None and meta["prompt_tokens"] != prompt_len:
        raise TransientError("bad_response", f"sent {prompt_len} prompt ids, server counted {meta['prompt_tokens']}")
    if not isinstance(finish, dict) or finish.get("type") not in ("stop", "length"):
        raise TransientError("bad_response", f"unexpected finish_reason {finish}")
    # JSON gives ints; a per-id conversion would cost as much as decoding the body, so the ends are checked instead.
    if type(output_ids[0]) is not int or type(output_ids[-1]) is not int:
        raise TransientError("bad_response", f"output_ids are not token ids: {output_ids[:3]}...")
    return output_ids, meta


@dataclass
class ClientStats:
    requests: int = 0
    request_seconds: float = 0.0  # summed over requests, from send to answer
    retries_by_cause: Counter[str] = field(default_factory=Counter)


# Faults that say something about the endpoint itself; load signals (429, 503, abort) do not evict it.
ENDPOINT_FAULTS = frozenset({"connection", "timeout", "http_500", "http_502", "http_504", "bad_response"})


class SGLangClient:
    def __init__(
        self,
        pool: EndpointPool,
        session: aiohttp.ClientSession,
        request_timeout_s: float = 3600.0,
        max_attempts: int = 5,
        backoff_max_s: float = 30.0,
    ) -> None:
        self.pool = pool
        self.session = session
        self.timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self.max_attempts = max_attempts
        self.backoff_max_s = backoff_max_s
        self.stats = ClientStats()

    async def _attempt(self, payload: dict[str, Any], prompt_len: int, avoid: str | None) -> Generation:
        endpoint = await self.pool.acquire(avoid)
        self.stats.requests += 1
        ok, cause, sent = False, "", time.monotonic()
        try:
            async with self.session.post(f"{endpoint.url}/generate", json=payload, timeout=self.timeout) as resp:
                body = await resp.text()
            if resp.status == 400:
                ok = True  # the endpoint works; the request is wrong
                raise PermanentError(error_message(body))
            if resp.status in RETRYABLE_STATUS:
                raise TransientError(f"http_{resp.status}", f"{endpoint.url}: {error_message(body)}", endpoint.url)
            if resp.status != 200:
                raise PermanentError(f"HTTP {resp.status} from {endpoint.url}: {error_message(body)}")
            data = json.loads(body)
            output_ids, meta = check_response(data, prompt_len)
            ok = True
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as e:
            cause = "timeout" if isinstance(e, TimeoutError) else "connection"
            raise TransientError(cause, f"{endpoint.url}: {e!r}", endpoint.url) from e
        except TransientError as e:
            cause, e.endpoint = e.cause, endpoint.url
            raise
        finally:
            self.stats.request_seconds += time.monotonic() - sent
            self.pool.release(endpoint, ok, counts_against_endpoint=cause in ENDPOINT_FAULTS)
        return Generation(output_ids, meta, data.get("text"), endpoint.url, payload["rid"], 0)

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], rid: str) -> Generation:
        """One sample: transient faults retried with exponential backoff and jitter, on another endpoint if any."""
        nonce = uuid.uuid4().hex[:8]  # a rid never repeats, even across task retries
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(TransientError),
            stop=stop_after_attempt(self.max_attempts),
            wait=wait_random_exponential(multiplier=0.5, max=self.backoff_max_s),
            before_sleep=self._count_retry,
            reraise=True,
        )
        avoid: str | None = None
        async for trial in retrying:
            with trial:
                attempt = trial.retry_state.attempt_number
                payload = {
                    "input_ids": prompt_ids,
                    "sampling_params": sampling_params,
                    "rid": f"{rid}-{nonce}-{attempt}",
                }
                try:
                    result = await self._attempt(payload, len(prompt_ids), avoid)
                except TransientError as e:
                    avoid = e.endpoint
                    raise
                return dataclasses.replace(result, attempts=attempt)
        raise AssertionError("unreachable: tenacity reraises the last error")

    def _count_retry(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        self.stats.retries_by_cause[error.cause if isinstance(error, TransientError) else "other"] += 1


async def get_json(session: aiohttp.ClientSession, url: str, timeout_s: float = 10.0) -> Any:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        resp.raise_for_status()
        return await resp.json(content_type=None)


async def wait_healthy(session: aiohttp.ClientSession, url: str, deadline_s: float, poll_s: float = 2.0) -> None:
    loop = asyncio.get_running_loop()
    give_up = loop.time() + deadline_s
    while (last := await health_problem(session, url)) is not None:
        if loop.time() >= give_up:
            raise FleetUnavailable(f"{url}/health not ready after {deadline_s:.0f}s (last: {last})")
        await asyncio.sleep(poll_s)
