"""The fleet as it is right now, for people: each endpoint's health, model, SGLang version, context length, running
slots and running requests, asked with a short timeout and never judged (that is check_server's job).

Running requests come from SGLang's `GET /v1/loads?include=core` (one entry per data-parallel rank, since SGLang
2026-01), or from the older `GET /get_load` (whose `num_reqs` counts running and waiting requests together). Behind
an sglang-router they are summed over the workers that can be reached from here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from regen.endpoints import Endpoint
from regen.redaction import describe
from regen.sglang.auth import NO_KEYS, ApiKeys, Unauthorized
from regen.sglang.client import get_json
from regen.sglang.served_model import context_length_of
from regen.sglang.server_check import MODEL_INFO, SERVER_INFO, get_either, redacted, router_workers

TIMEOUT_S = 3.0


async def running_requests(session: aiohttp.ClientSession, url: str, timeout_s: float) -> tuple[int, int]:
    """(running, waiting) requests of one server, over its data-parallel ranks."""
    try:
        loads = await get_json(session, f"{url}/v1/loads?include=core", timeout_s)
        ranks = loads["loads"]
        return sum(r["num_running_reqs"] for r in ranks), sum(r["num_waiting_reqs"] for r in ranks)
    except aiohttp.ClientResponseError as e:
        if e.status != 404:
            raise
    ranks = await get_json(session, f"{url}/get_load", timeout_s)
    waiting = sum(r["num_waiting_reqs"] for r in ranks)
    return sum(r["num_reqs"] for r in ranks) - waiting, waiting


async def _health(session: aiohttp.ClientSession, url: str, path: str, timeout_s: float) -> str:
    async with session.get(f"{url}{path}", timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
        return "ok" if resp.status == 200 else f"HTTP {resp.status}"


async def _server(session: aiohttp.ClientSession, url: str, timeout_s: float) -> dict[str, Any]:
    server = await get_either(session, url, SERVER_INFO, timeout_s)
    model = await get_either(session, url, MODEL_INFO, timeout_s)
    running, waiting = await running_requests(session, url, timeout_s)
    return {
        "model": model.get("model_path"),
        "version": server.get("version"),
        "context_length": context_length_of(server),
        "max_running_requests": server.get("max_running_requests"),
        "running_requests": running,
        "waiting_requests": waiting,
    }


async def endpoint_status(
    session: aiohttp.ClientSession,
    url: str,
    timeout_s: float = TIMEOUT_S,
    may_ask: Callable[[str], bool] = lambda url: True,
) -> dict[str, Any]:
    """One endpoint (a server, or a router and the workers it lists), or what went wrong asking it."""
    status: dict[str, Any] = {"url": url, "health": None, "router": False, "error": None}
    try:
        server = await get_either(session, url, SERVER_INFO, timeout_s)
        if not server.get("router_manager"):
            status["health"] = await _health(session, url, "/health", timeout_s)
            return {**status, **await _server(session, url, timeout_s)}
        status |= {"router": True, "health": await _health(session, url, "/health_generate", timeout_s)}
        workers = router_workers(await get_json(session, f"{url}/workers", timeout_s))
        asked = [w for w in workers if _may_ask(may_ask, w.url)]
        served = await asyncio.gather(*(_server(session, w.url, timeout_s) for w in asked), return_exceptions=True)
        reached = [s for s in served if isinstance(s, dict)]
        return {
            **status,
            "workers": [
                {"url": w.url, "healthy": w.healthy, **({} if w in asked else {"asked": NOT_ASKED})} for w in workers
            ],
            "model": ", ".join(sorted({w.model_path for w in workers if w.model_path})) or None,
            "version": ", ".join(sorted({str(s["version"]) for s in reached if s["version"]})) or None,
            "context_length": min((s["context_length"] for s in reached if s["context_length"]), default=None),
            "max_running_requests": _sum_known([s["max_running_requests"] for s in reached], len(workers)),
            "running_requests": _sum_known([s["running_requests"] for s in reached], len(workers)),
            "waiting_requests": _sum_known([s["waiting_requests"] for s in reached], len(workers)),
        }
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, LookupError, Unauthorized) as e:
        return {**status, "error": describe(e)[:300]}


NOT_ASKED = "not asked: outside governance.allowed_endpoints"


def _may_ask(may_ask: Callable[[str], bool], url: str) -> bool:
    try:
        return may_ask(url)
    except ValueError:  # not a base URL this pipeline would send to
        return False


def _sum_known(values: list[Any], expected: int) -> int | None:
    """A fleet total, known only when every worker answered."""
    return sum(values) if len(values) == expected and all(isinstance(v, int) for v in values) else None


async def ask_fleet(
    endpoints: Sequence[str | Endpoint],
    timeout_s: float = TIMEOUT_S,
    api_keys: ApiKeys = NO_KEYS,
    may_ask: Callable[[str], bool] = lambda url: True,
) -> list[dict[str, Any]]:
    """Every endpoint's status, asked at once; an endpoint that does not answer within `timeout_s` says so. A
    router's workers are asked only where `may_ask` allows it (the page asks from Airflow's API server: a router
    must not be able to send it anywhere)."""
    targets = [Endpoint.parse(url) for url in endpoints]  # asked at their base URLs; logins by the session
    async with api_keys.session(targets) as session:
        found = await asyncio.gather(*(endpoint_status(session, t.base, timeout_s, may_ask) for t in targets))
    return [redacted({**status, "url": str(t)}) for status, t in zip(found, targets, strict=True)]  # `***@` shown


def fleet_status(endpoints: Sequence[str | Endpoint], timeout_s: float = TIMEOUT_S) -> list[dict[str, Any]]:
    """`ask_fleet` outside an event loop."""
    return asyncio.run(ask_fleet(endpoints, timeout_s))
