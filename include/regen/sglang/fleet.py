"""The fleet of SGLang endpoints as the client sees it: load, outliers, ejection and re-admission.

Requests go to the admitted endpoint with the fewest outstanding requests, preferring one other than the endpoint a
retried request just failed on. Health follows Envoy's outlier detection, because at fleet scale a flaky server is
the normal case and must be kept busy, while a dead one must be out within seconds:
- an endpoint is ejected when its failure rate over its recent answers is well above the rest of the fleet's (a
  fleet-wide fault rate singles nobody out), never more than a capped share of the fleet at once;
- an endpoint that answers nothing (a long run of failures in a row: refused, reset, timed out) is ejected whatever
  the cap, since every request sent there is an attempt burnt;
- an endpoint that answers /generate with a 4xx other than 400, 408 and 429 (a proxy's 404 page, a 401 for a wrong
  key) is no working SGLang server for this run: ejected at once, whatever the cap;
- each repeat ejection lasts longer; after it, /health must answer 200 before the endpoint is admitted again;
- a 503 or 429 is backpressure, not a fault: the endpoint's in-flight limit is halved (at most once a second) and
  grows back by one with each round of answers (a limit's worth), as TCP's congestion window does in congestion
  avoidance (RFC 5681: 1/cwnd a segment acknowledged, about one a round trip).
If every endpoint is ejected, requests wait up to `fleet_wait_s` for one to come back, then the fleet is declared
unavailable (the task fails and Airflow's retry resumes it).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections import deque
from dataclasses import dataclass, field

import aiohttp

from regen.endpoints import redact_url
from regen.hints import ENDPOINT_AFFINITY, Hints
from regen.metrics import current as metrics
from regen.redaction import describe

log = logging.getLogger(__name__)


class FleetUnavailable(Exception):
    """No endpoint can take requests: the task fails with this message and Airflow's retry resumes it."""


class NothingListens(FleetUnavailable):
    """Connection refused or an unknown host: no server is there, so waiting for one to get ready cannot help."""


# A preferred endpoint (one holding the prompt's prefix in its cache) is taken while it has at most this many times
# the least-loaded endpoint's requests outstanding, plus one: a prefill saved is worth a little imbalance, not a queue.
AFFINITY_SLACK = 1.25


def preferred(open_: list[Endpoint], least: Endpoint, prefer: str, avoid: str | None) -> Endpoint:
    """`prefer` when it is open, not `avoid`, and not much busier than the least-loaded `least`; else `least`."""
    chosen = next((e for e in open_ if e.url == prefer and e.url != avoid), None)
    if chosen is not None and chosen.outstanding <= least.outstanding * AFFINITY_SLACK + 1:
        return chosen
    return least


def nothing_listens(error: BaseException) -> str | None:
    """Why nothing can answer at that address ("connection refused", "unknown host"), or None for timeouts, resets
    and the like, which a server that is there but busy or starting up can cause."""
    if isinstance(error, aiohttp.ClientConnectorDNSError):
        return "unknown host"
    if isinstance(error, aiohttp.ClientConnectorError) and error.os_error.errno == errno.ECONNREFUSED:
        return "connection refused"
    return None


async def readiness(session: aiohttp.ClientSession, url: str, path: str = "/health") -> str | None:
    """None when GET url+path answers 200 (SGLang's readiness), else what is not ready yet ("HTTP 503" while a
    server warms up, a timeout). Raises NothingListens where nothing listens at url."""
    try:
        async with session.get(f"{url}{path}", timeout=aiohttp.ClientTimeout(total=10)) as resp:
            return None if resp.status == 200 else f"HTTP {resp.status}"
    except (aiohttp.ClientError, TimeoutError) as e:
        if cause := nothing_listens(e):
            raise NothingListens(
                f"{redact_url(url)}: nothing listens there ({cause}: {e}): check the endpoint's host and port, and "
                "that its server is running"
            ) from e
        return describe(e)


async def health_problem(session: aiohttp.ClientSession, url: str) -> str | None:
    """None when GET /health answers 200, else what went wrong. For an evicted endpoint a server that is down is
    merely not back yet, so a refused connection is one more problem here, not an error."""
    try:
        return await readiness(session, url)
    except NothingListens as e:
        return str(e)


# Faults that say something about the endpoint itself: every status but 200 and 400, and the causes below. A 503 or
# 429 is the server asking for less (LOAD_SIGNALS); an abort, a 400 or one slow sample says nothing about its health.
ENDPOINT_FAULTS = frozenset({"connection", "timeout", "bad_response", "count_mismatch"})
LOAD_SIGNALS = frozenset({"http_429", "http_503"})


def endpoint_fault(cause: str) -> bool:
    return cause in ENDPOINT_FAULTS or (cause.startswith("http_") and cause not in LOAD_SIGNALS)


def not_sglang(cause: str) -> bool:
    """A 4xx other than 400, 408 and 429: an answer no working SGLang /generate gives to a well-formed request."""
    return cause.startswith("http_4") and cause not in ("http_408", "http_429")


@dataclass(frozen=True)
class OutlierPolicy:
    """When an endpoint is ejected and for how long; the defaults follow Envoy's where they carry over."""

    window: int = 100  # an endpoint's most recent outcomes (answers and endpoint faults) that its failure rate counts
    min_outcomes: int = 50  # fewer outcomes than this in the window: no failure-rate verdict yet
    rate_margin: float = 0.3  # ejected when its failure rate exceeds the rest of the fleet's by more than this
    max_ejected_share: float = 0.1  # of the fleet, at once, for the failure rate (at least one endpoint)
    dead_after: int = 16  # failures in a row that mean nothing answers there (a 21%-flaky server: 1 in 10^11)
    base_ejection_s: float = 2.0  # the n-th ejection of an endpoint lasts n times this, at most max_ejection_s
    max_ejection_s: float = 60.0
    slowdown_every_s: float = 1.0  # a 503 or 429 halves the endpoint's in-flight limit at most this often


@dataclass
class Endpoint:
    url: str
    outstanding: int = 0
    consecutive_failures: int = 0
    ejected: bool = False
    ejections: int = 0
    limit: float = float("inf")  # in-flight cap from backpressure (503, 429); inf until the server first pushes back
    outcomes: deque[bool] = field(default_factory=deque)  # True: a failure; the last OutlierPolicy.window outcomes
    failures: int = 0  # of those outcomes
    slowed_at: float = float("-inf")
    answered_at: float = float("-inf")  # time.monotonic() of its last answer: a timeout there since is the sample's

    @property
    def failure_rate(self) -> float:
        return self.failures / len(self.outcomes) if self.outcomes else 0.0


class EndpointPool:
    def __init__(
        self,
        urls: list[str],
        session: aiohttp.ClientSession,
        policy: OutlierPolicy = OutlierPolicy(),
        probe_interval_s: float = 2.0,
        fleet_wait_s: float = 120.0,
        hints: Hints | None = None,
    ) -> None:
        if not urls:
            raise ValueError("at least one SGLang endpoint is needed")
        self.endpoints = [Endpoint(url.rstrip("/")) for url in urls]
        for endpoint in self.endpoints:  # a series from the start, at 0 until an ejection
            metrics().ejections.labels(redact_url(endpoint.url)).inc(0)
        self.session = session
        self.policy = policy
        self.probe_interval_s = probe_interval_s
        self.fleet_wait_s = fleet_wait_s
        self.hints = hints or Hints()  # the task's: endpoint affinity is one (regen.hints)
        self._readmitted = asyncio.Event()
        self._released = asyncio.Event()
        self._probes: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        return sum(e.outstanding for e in self.endpoints)

    @property
    def ejections(self) -> int:
        return sum(e.ejections for e in self.endpoints)

    def has_other(self, url: str | None) -> bool:
        """Whether an admitted endpoint other than `url` could take a request."""
        return any(not e.ejected and e.url != url for e in self.endpoints)

    async def acquire(self, avoid: str | None = None, prefer: str | None = None) -> Endpoint:
        """The least-loaded admitted endpoint under its in-flight limit (not `avoid` if another will do), its
        outstanding count taken; `prefer` (the endpoint whose prefix cache holds the prompt's history) instead, when
        it is admitted, open, and not much busier than that one (AFFINITY_SLACK). Waits for a release while every
        admitted endpoint is at its limit."""
        while True:
            admitted = [e for e in self.endpoints if not e.ejected]
            if not admitted:
                await self._wait_for_readmission()
                continue
            open_ = [e for e in admitted if e.outstanding < e.limit]
            if open_:
                break
            await self._released.wait()  # at its limit an endpoint has requests outstanding, so a release comes
        endpoint = min(open_, key=lambda e: (e.url == avoid and len(open_) > 1, e.outstanding))
        if prefer is not None:
            endpoint = self.hints.use(ENDPOINT_AFFINITY, endpoint, preferred, open_, endpoint, prefer, avoid)
        endpoint.outstanding += 1
        return endpoint

    def release(self, endpoint: Endpoint, cause: str | None) -> None:
        """`cause`: None for an answer (or a refusal of the request itself), else the fault's cause."""
        endpoint.outstanding -= 1
        self._released.set()
        self._released = asyncio.Event()
        if cause is None:
            endpoint.answered_at = time.monotonic()
            endpoint.consecutive_failures = 0
            endpoint.limit += 1 / endpoint.limit  # one a round: growing by one an answer doubles it each round
            self._record(endpoint, failed=False)
        elif cause in LOAD_SIGNALS:
            self._slow_down(endpoint)
        elif endpoint_fault(cause):
            endpoint.consecutive_failures += 1
            self._record(endpoint, failed=True)
            if endpoint.ejected:
                return
            if not_sglang(cause):
                self._eject(endpoint, f"it answers /generate with HTTP {cause[5:]}: no working SGLang server there")
            else:
                self._judge(endpoint, cause)

    def _record(self, endpoint: Endpoint, failed: bool) -> None:
        endpoint.outcomes.append(failed)
        endpoint.failures += failed
        if len(endpoint.outcomes) > self.policy.window:
            endpoint.failures -= endpoint.outcomes.popleft()

    def _slow_down(self, endpoint: Endpoint) -> None:
        now = time.monotonic()
        if now - endpoint.slowed_at >= self.policy.slowdown_every_s:
            endpoint.slowed_at = now
            endpoint.limit = max(1.0, min(endpoint.limit, endpoint.outstanding + 1) / 2)
            log.info(
                "%s asks for less (503/429): at most %d requests in flight there for now",
                redact_url(endpoint.url),
                endpoint.limit,
            )

    def _judge(self, endpoint: Endpoint, cause: str) -> None:
        policy = self.policy
        if endpoint.consecutive_failures >= policy.dead_after:
            self._eject(endpoint, f"{endpoint.consecutive_failures} failures in a row, the last {cause}")
            return
        if len(endpoint.outcomes) < policy.min_outcomes:
            return
        rest = [e for e in self.endpoints if e is not endpoint and not e.ejected and e.outcomes]
        if not rest:
            return  # nothing to compare with: a lone endpoint is judged by failures in a row only
        rest_rate = sum(e.failures for e in rest) / sum(len(e.outcomes) for e in rest)
        cap = max(1, int(policy.max_ejected_share * len(self.endpoints)))
        if endpoint.failure_rate > rest_rate + policy.rate_margin and self._ejected_now() < cap:
            self._eject(
                endpoint,
                f"{endpoint.failure_rate:.0%} of its last {len(endpoint.outcomes)} answers failed, "
                f"against {rest_rate:.0%} on the rest of the fleet",
            )

    def _ejected_now(self) -> int:
        return sum(e.ejected for e in self.endpoints)

    def _eject(self, endpoint: Endpoint, why: str) -> None:
        endpoint.ejected = True
        endpoint.ejections += 1
        metrics().ejections.labels(redact_url(endpoint.url)).inc()
        seconds = min(self.policy.base_ejection_s * endpoint.ejections, self.policy.max_ejection_s)
        log.warning("ejected %s for %.0fs: %s; then probing /health", redact_url(endpoint.url), seconds, why)
        probe = asyncio.create_task(self._probe(endpoint, seconds))
        self._probes.add(probe)
        probe.add_done_callback(self._probes.discard)

    async def _probe(self, endpoint: Endpoint, ejected_for_s: float) -> None:
        await asyncio.sleep(ejected_for_s)
        while await health_problem(self.session, endpoint.url) is not None:
            await asyncio.sleep(self.probe_interval_s)
        endpoint.ejected, endpoint.consecutive_failures = False, 0
        endpoint.outcomes.clear()
        endpoint.failures = 0
        log.info("re-admitted %s: /health answers again", redact_url(endpoint.url))
        self._readmitted.set()
        self._readmitted = asyncio.Event()

    async def _wait_for_readmission(self) -> None:
        event = self._readmitted
        try:
            await asyncio.wait_for(event.wait(), timeout=self.fleet_wait_s)
        except TimeoutError:
            urls = ", ".join(redact_url(e.url) for e in self.endpoints)
            raise FleetUnavailable(
                f"every SGLang endpoint is failing ({urls}) and none answered /health within {self.fleet_wait_s:.0f}s"
            ) from None

    async def close(self) -> None:
        for probe in list(self._probes):
            probe.cancel()
        await asyncio.gather(*self._probes, return_exceptions=True)
