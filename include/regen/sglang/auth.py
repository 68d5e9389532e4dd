"""API keys for SGLang servers started with `--api-key`: sent as `Authorization: Bearer <key>` on every request, the
way SGLang's middleware checks them (srt/utils/auth.py: every path but health, readiness and metrics).

Keys are found by a server's origin (scheme, host and port), so a router's workers get theirs too; one key may serve
the whole fleet. A server that refuses the key (401, 403) fails the task at once with what to set: no retry brings a
key. Keys never reach a log, an error, XCom or storage: they live in the deployment's Airflow connection
(regen_airflow.tasks.sglang_api_keys) and in this object's memory.

The user and password of an endpoint's URL (`http://user:pass@proxy`, regen.endpoints) go the same way, as
`Authorization: Basic` to that origin (a bearer key, where one is set, wins): the URLs requests are sent to carry
none, so no error or log line built from one can show it. A task gets the logins from the deployment's config and
the run's params (the run spec in XCom holds `***` in their place).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import aiohttp
from yarl import URL

from regen.endpoints import Endpoint, redact_url
from regen.errors import FinalError
from regen.redaction import remember


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
        logins: Iterable[Endpoint] = (),
    ) -> None:
        self._fleet_key = fleet_key or None
        self._by_origin = {URL(url).origin(): key for url, key in (by_endpoint or {}).items() if key}
        remember(self._fleet_key, *self._by_origin.values())  # scrubbed from every log line and alert from now on
        self.source = source
        self._logins = {e.origin: aiohttp.encode_basic_auth(*auth) for e in logins if (auth := e.basic_auth())}

    def __repr__(self) -> str:  # never the keys themselves
        keys = f"fleet_key={'set' if self._fleet_key else 'none'}, endpoints={len(self._by_origin)}"
        return f"ApiKeys({keys}, logins={len(self._logins)})"

    def with_logins(self, endpoints: Iterable[str | Endpoint]) -> ApiKeys:
        """These keys, and the logins the endpoints carry; MissingLogin for one whose URL had a login that is not
        known here (its `***` stand-in read back from the run spec, and neither the config nor the run gave it)."""
        parsed = [Endpoint.parse(e) for e in endpoints]
        known = {**self._logins, **{e.origin: aiohttp.encode_basic_auth(*a) for e in parsed if (a := e.basic_auth())}}
        missing = [str(e) for e in parsed if e.needs_login and e.origin not in known]
        if missing:
            raise MissingLogin(
                f"{missing}: the user and password of these endpoints are not known to this task; give them in the "
                "config's defaults.endpoints or in the run's endpoints (http://user:password@host:port)"
            )
        keys = ApiKeys(self._fleet_key, None, self.source)
        keys._by_origin, keys._logins = self._by_origin, known
        return keys

    def login_for(self, url: URL) -> str | None:
        """The `Authorization: Basic` value for the URL's origin, if its endpoint has a login."""
        if not self._logins:
            return None
        host = url.host or ""
        return self._logins.get(f"{url.scheme}://{f'[{host}]' if ':' in host else host}:{url.port}")

    def key_for(self, url: URL) -> str | None:
        if not self._by_origin:  # no per-endpoint keys: no URL origin to build on every request
            return self._fleet_key
        return self._by_origin.get(url.origin(), self._fleet_key)

    async def __call__(self, request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType) -> Any:
        """aiohttp client middleware: the request carries its server's key; a refusal is Unauthorized."""
        key, login = self.key_for(request.url), self.login_for(request.url)
        if key is not None:
            request.headers["Authorization"] = f"Bearer {key}"
        elif login is not None:
            request.headers["Authorization"] = login
        response = await handler(request)
        if response.status in (401, 403):
            response.release()
            where = f"{redact_url(str(request.url.origin()))} (HTTP {response.status} for {request.url.path})"
            if key is None and login is not None:
                raise Unauthorized(
                    f"{where} refused the user and password of its URL: correct them in the endpoint's URL (the "
                    "config's defaults.endpoints or the run's endpoints)"
                )
            given = "refused the API key given" if key is not None else "wants an API key and none was given"
            raise Unauthorized(f"{where} {given}: set the key the server was started with (--api-key) in {self.source}")
        return response

    def session(self, endpoints: Iterable[str | Endpoint] = (), **options: Any) -> aiohttp.ClientSession:
        """A client session whose every request carries its server's key, or its endpoint's login."""
        return aiohttp.ClientSession(middlewares=(self.with_logins(endpoints),), **options)


class MissingLogin(Unauthorized):
    """An endpoint's URL had a user and password, and this task was not given them."""


NO_KEYS = ApiKeys(source="the Airflow connection named by defaults.sglang_conn_id (none was found)")
