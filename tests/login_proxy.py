"""A proxy on loopback in front of a server, wanting one login as HTTP basic auth: what an endpoint URL's
`user:pass@` is for. Tests see whether every request carried the login."""

from __future__ import annotations

import asyncio
import base64
import threading
from typing import Any

from aiohttp import ClientSession, web

from tools.devstack import free_port

USER, SECRET = "alice", "s3cr3t-pw"


class LoginProxy:
    """A proxy on loopback that wants `Authorization: Basic alice:s3cr3t-pw` on every request (401 without it) and
    passes the request on to the simulator; every `refuse_every`-th /generate is refused with a 400 (a rejection the
    client records with the endpoint's URL)."""

    def __init__(self, target: str, refuse_every: int = 0) -> None:
        self.target, self.refuse_every = target, refuse_every
        self.port = free_port()
        self.seen: list[tuple[str, bool]] = []  # (path, the right login)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def with_login(self, password: str = SECRET) -> str:
        return f"http://{USER}:{password}@127.0.0.1:{self.port}"

    async def _handle(self, request: web.Request) -> web.Response:
        expected = "Basic " + base64.b64encode(f"{USER}:{SECRET}".encode()).decode()
        ok = request.headers.get("Authorization") == expected
        self.seen.append((request.path, ok))
        if not ok:
            return web.Response(status=401, text="login required")
        generates = sum(path == "/generate" for path, _ in self.seen)
        if request.path == "/generate" and self.refuse_every and generates % self.refuse_every == 0:
            return web.json_response({"error": {"message": "a refused prompt"}}, status=400)
        async with (
            ClientSession() as session,
            session.request(request.method, f"{self.target}{request.path_qs}", data=await request.read()) as answer,
        ):
            body = await answer.read()
            return web.Response(body=body, status=answer.status, content_type="application/json")

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> LoginProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *_: Any) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
