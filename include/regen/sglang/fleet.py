"""The fleet of SGLang endpoints as the client sees it: load, failures, eviction and re-admission.

Requests go to the admitted endpoint with the fewest outstanding requests, preferring one other than the endpoint a
retried request just failed on. An endpoint that fails `evict_after` times in a row is evicted; a background probe
re-admits it as soon as its /health answers 200. If every endpoint is evicted, requests wait up to `fleet_wait_s`
for one to come back, then the fleet is declared unavailable (the task fails and Airflow's retry resumes it).
"""

from __future__ import annotations

import asyncio
import errno
import logging
from dataclasses import dataclass

import aiohttp

log = logging.getLogger(__name__)


def redact_url(url: str) -> str:
    """The URL as it may be shown or recorded: a user and password in it (`http://user:pass@host`) become `***`."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


class FleetUnavailable(Exception):
    """No endpoint can take requests: the task fails with this message and Airflow's retry resumes it."""


class NothingListens(FleetUnavailable):
    """Connection refused or an unknown host: no server is there, so waiting for one to get ready cannot help."""


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
        return repr(e)


async def health_problem(session: aiohttp.ClientSession, url: str) -> str | None:
    """None when GET /health answers 200, else what went wrong. For an evicted endpoint a server that is down is
    merely not back yet, so a refused connection is one more problem here, not an error."""
    try:
        return await readiness(session, url)
    except NothingListens as e:
        return str(e)


@dataclass
class Endpoint:
    url: str
    outstanding: int = 0
    consecutive_failures: int = 0
    evicted: bool = False
    evictions: int = 0


class EndpointPool:
    def __init__(
        self,
        urls: list[str],
        session: aiohttp.ClientSession,
        evict_after: int = 3,
        probe_interval_s: float = 2.0,
        fleet_wait_s: float = 120.0,
    ) -> None:
        if not urls:
            raise ValueError("at least one SGLang endpoint is needed")
        self.endpoints = [Endpoint(url.rstrip("/")) for url in urls]
        self.session = session
        self.evict_after = evict_after
        self.probe_interval_s = probe_interval_s
        self.fleet_wait_s = fleet_wait_s
        self._readmitted = asyncio.Event()
        self._probes: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        return sum(e.outstanding for e in self.endpoints)

    async def acquire(self, avoid: str | None = None) -> Endpoint:
        """The least-loaded admitted endpoint (not `avoid` if another is admitted), its outstanding count taken."""
        admitted = [e for e in self.endpoints if not e.evicted]
        if not admitted:
            await self._wait_for_readmission()
            admitted = [e for e in self.endpoints if not e.evicted]
        endpoint = min(admitted, key=lambda e: (e.url == avoid and len(admitted) > 1, e.outstanding))
        endpoint.outstanding += 1
        return endpoint

    def release(self, endpoint: Endpoint, ok: bool, counts_against_endpoint: bool = True) -> None:
        endpoint.outstanding -= 1
        if ok:
            endpoint.consecutive_failures = 0
        elif counts_against_endpoint:
            endpoint.consecutive_failures += 1
            if endpoint.consecutive_failures >= self.evict_after and not endpoint.evicted:
                self._evict(endpoint)

    def _evict(self, endpoint: Endpoint) -> None:
        endpoint.evicted = True
        endpoint.evictions += 1
        log.warning(
            "evicted %s after %d failures in a row; probing /health",
            redact_url(endpoint.url),
            endpoint.consecutive_failures,
        )
        probe = asyncio.create_task(self._probe(endpoint))
        self._probes.add(probe)
        probe.add_done_callback(self._probes.discard)

    async def _probe(self, endpoint: Endpoint) -> None:
        while endpoint.evicted:
            await asyncio.sleep(self.probe_interval_s)
            if await health_problem(self.session, endpoint.url) is None:
                endpoint.evicted, endpoint.consecutive_failures = False, 0
                log.info("re-admitted %s: /health answers again", redact_url(endpoint.url))
                self._readmitted.set()
                self._readmitted = asyncio.Event()

    async def _wait_for_readmission(self) -> None:
        event = self._readmitted
        try:
            await asyncio.wait_for(event.wait(), timeout=self.fleet_wait_s)
        except TimeoutError:
            urls = ", ".join(e.url for e in self.endpoints)
            raise FleetUnavailable(
                f"every SGLang endpoint is failing ({urls}) and none answered /health within {self.fleet_wait_s:.0f}s"
            ) from None

    async def close(self) -> None:
        for probe in list(self._probes):
            probe.cancel()
        await asyncio.gather(*self._probes, return_exceptions=True)
