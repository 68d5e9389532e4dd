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
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class TransientError(Exception):
    """Worth another attempt: the connection, the server's load or an abort, not the request itself."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(f"{cause}: {message}")
        self.cause = cause


class PermanentError(Exception):
    """The server refused the request itself (400); retrying cannot help."""


class FleetUnavailable(Exception):
    """No endpoint answered within the attempts: the task fails and Airflow's retry resumes it."""


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
    return [int(i) for i in output_ids], meta


@dataclass
class Endpoint:
    url: str
    outstanding: int = 0
    consecutive_failures: int = 0


@dataclass
class ClientStats:
    requests: int = 0
    retries_by_cause: Counter[str] = field(default_factory=Counter)


class SGLangClient:
    def __init__(
        self,
        endpoints: list[str],
        session: aiohttp.ClientSession,
        request_timeout_s: float = 3600.0,
        max_attempts: int = 5,
        backoff_max_s: float = 30.0,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one SGLang endpoint is needed")
        self.endpoints = [Endpoint(url.rstrip("/")) for url in endpoints]
        self.session = session
        self.timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self.max_attempts = max_attempts
        self.backoff_max_s = backoff_max_s
        self.stats = ClientStats()

    def _pick(self) -> Endpoint:
        """Least outstanding requests; endpoints that keep failing sort last until they answer again."""
        return min(self.endpoints, key=lambda e: (e.consecutive_failures >= 3, e.outstanding))

    async def _attempt(self, payload: dict[str, Any], prompt_len: int) -> Generation:
        endpoint = self._pick()
        endpoint.outstanding += 1
        self.stats.requests += 1
        try:
            async with self.session.post(f"{endpoint.url}/generate", json=payload, timeout=self.timeout) as resp:
                body = await resp.text()
            if resp.status == 400:
                raise PermanentError(error_message(body))
            if resp.status in RETRYABLE_STATUS:
                raise TransientError(f"http_{resp.status}", error_message(body))
            if resp.status != 200:
                raise PermanentError(f"HTTP {resp.status}: {error_message(body)}")
            data = json.loads(body)
            output_ids, meta = check_response(data, prompt_len)
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as e:
            endpoint.consecutive_failures += 1
            cause = "timeout" if isinstance(e, TimeoutError) else "connection"
            raise TransientError(cause, f"{endpoint.url}: {e!r}") from e
        except TransientError:
            endpoint.consecutive_failures += 1
            raise
        finally:
            endpoint.outstanding -= 1
        endpoint.consecutive_failures = 0
        return Generation(output_ids, meta, data.get("text"), endpoint.url, payload["rid"], 0)

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any], rid: str) -> Generation:
        nonce = uuid.uuid4().hex[:8]  # a rid never repeats, even across task retries
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(TransientError),
            stop=stop_after_attempt(self.max_attempts),
            wait=wait_random_exponential(multiplier=0.5, max=self.backoff_max_s),
            before_sleep=lambda state: self._count_retry(state.outcome.exception() if state.outcome else None),
            reraise=True,
        )
        async for trial in retrying:
            with trial:
                attempt = trial.retry_state.attempt_number
                payload = {
                    "input_ids": prompt_ids,
                    "sampling_params": sampling_params,
                    "rid": f"{rid}-{nonce}-{attempt}",
                }
                result = await self._attempt(payload, len(prompt_ids))
                return dataclasses.replace(result, attempts=attempt)
        raise AssertionError("unreachable: tenacity reraises the last error")

    def _count_retry(self, error: BaseException | None) -> None:
        cause = error.cause if isinstance(error, TransientError) else "other"
        self.stats.retries_by_cause[cause] += 1
        log.debug("retrying after %s", error)


async def get_json(session: aiohttp.ClientSession, url: str, timeout_s: float = 10.0) -> Any:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        resp.raise_for_status()
        return await resp.json(content_type=None)


async def wait_healthy(session: aiohttp.ClientSession, url: str, deadline_s: float, poll_s: float = 2.0) -> None:
    loop = asyncio.get_running_loop()
    give_up = loop.time() + deadline_s
    last = "no answer"
    while True:
        try:
            async with session.get(f"{url}/health", timeout=aiohttp.ClientTimeout(total=10)) as resp:
                if resp.status == 200:
                    return
                last = f"HTTP {resp.status}"
        except (aiohttp.ClientError, TimeoutError) as e:
            last = repr(e)
        if loop.time() >= give_up:
            raise FleetUnavailable(f"{url}/health not ready after {deadline_s:.0f}s (last: {last})")
        await asyncio.sleep(poll_s)
