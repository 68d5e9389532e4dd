"""Test servers on loopback, each served from an event loop in a thread of its own, for tests that need a server to
misbehave in one way: a proxy wanting a login, a proxy's 404 page, a malformed header."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Self

from aiohttp import web

from tools.devstack import free_port


class OnLoopback:
    """Started by `with`; a subclass starts listening on `self.port` in `listen`."""

    def __init__(self) -> None:
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def listen(self) -> None:
        raise NotImplementedError

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self.listen())
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> Self:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *_: Any) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


class AppOnLoopback(OnLoopback):
    """Every request, whatever its method and path, answered by `handle`."""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    async def listen(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()


class RecordingProxy(AppOnLoopback):
    """Every request passed on to `target` as it came, and each /generate body kept, in the order they arrived."""

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target
        self.bodies: list[dict[str, Any]] = []

    async def handle(self, request: web.Request) -> web.Response:
        import json

        import aiohttp

        body = await request.read()
        if request.path == "/generate":
            self.bodies.append(json.loads(body))
        async with (
            aiohttp.ClientSession() as session,
            session.request(request.method, f"{self.target}{request.path_qs}", data=body, headers=request.headers) as r,
        ):
            return web.Response(body=await r.read(), status=r.status, content_type=r.content_type)
