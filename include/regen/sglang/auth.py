"""API keys for SGLang servers started with `--api-key`: sent as `Authorization: Bearer <key>` on every request, the
way SGLang's middleware checks them (srt/utils/auth.py: every path but health, readiness and metrics).

Keys are found by a server's origin (scheme, host and port), so a router's workers get theirs too; one key may serve
the whole fleet. A server that refuses the key (401, 403) fails the task at once with what to set: no retry brings a
key. Keys never reach a log, an error, XCom or storage: they live in the deployment's Airflow connection
(regen_airflow.tasks.sglang_api_keys) and in this object's memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
from yarl import URL

from regen.errors import FinalError
from regen.sglang.fleet import redact_url


class Unauthorized(FinalError):
    """A server refused the pipeline's API key, or wants one and none was given."""


class ApiKeys:
    """A key per server origin, and one for every other server (`fleet_key`). `source` says where keys are set, for
    the error that says what to fix."""

    def __init__(
        self,
        fleet_key: str | None = None,
        by_endpoint: Mapping[str, str] | None = None,
        source: str = "the run's API keys",
    ) -> None:
        self._fleet_key = fleet_key or None
        self._by_origin = {URL(url).origin(): key for url, key in (by_endpoint or {}).items() if key}
        self.source = source

    def __repr__(self) -> str:  # never the keys themselves
        return f"ApiKeys(fleet_key={'set' if self._fleet_key else 'none'}, endpoints={len(self._by_origin)})"

    def key_for(self, url: URL) -> str | None:
        if not self._by_origin:  # no per-endpoint keys: no URL origin to build on every request
            return self._fleet_key
        return self._by_origin.get(url.origin(), self._fleet_key)

    async def __call__(self, request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType) -> Any:
        """aiohttp client middleware: the request carries its server's key; a refusal is Unauthorized."""
        key = self.key_for(request.url)
        if key is not None:
            request.headers["Authorization"] = f"Bearer {key}"
        response = await handler(request)
        if response.status in (401, 403):
            response.release()
            given = "refused the API key given" if key is not None else "wants an API key and none was given"
            raise Unauthorized(
                f"{redact_url(str(request.url.origin()))} {given} (HTTP {response.status} for {request.url.path}): "
                f"set the key the server was started with (--api-key) in {self.source}"
            )
        return response

    def session(self, **options: Any) -> aiohttp.ClientSession:
        """A client session whose every request carries its server's key."""
        return aiohttp.ClientSession(middlewares=(self,), **options)


NO_KEYS = ApiKeys(source="the Airflow connection named by defaults.sglang_conn_id (none was found)")
