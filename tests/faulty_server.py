"""A server on loopback in front of the simulator that answers one route with a fault: a malformed `Content-Length`
(aiohttp's client raises a `ClientResponseError` whose repr carries the request's headers, `Authorization`
included) or a 502. Every other request is passed on to the simulator. As a `router`, it says it is an
sglang-router in its server info, and lists one worker, itself under `/worker`, so a router's routes
(/health_generate, /workers, a worker's /get_server_info) can be faulted too. Raw HTTP over asyncio streams: an HTTP
server library would not send a malformed header."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import ClientSession

from tests.loopback import OnLoopback

MALFORMED = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1x2\r\nConnection: close\r\n\r\n{}"
BAD_GATEWAY = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 11\r\nConnection: close\r\n\r\nBad Gateway"
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot found"
FAULTS = {"malformed": MALFORMED, "502": BAD_GATEWAY}
OLD_NAMES = {"/server_info": "/get_server_info", "/model_info": "/get_model_info"}  # 404 to reach the new names


class FaultyServer(OnLoopback):
    def __init__(self, target: str, route: str, fault: str, router: bool = False) -> None:
        super().__init__()
        self.target, self.route, self.fault, self.router = target, route, FAULTS[fault], router
        self.authorizations: list[tuple[str, str | None]] = []  # (path, its Authorization header)

    async def listen(self) -> None:
        await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        method, path, _ = head[0].split(" ", 2)
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        self.authorizations.append((path, headers.get("authorization")))
        writer.write(await self._answer(method, path, body))
        await writer.drain()
        writer.close()

    async def _answer(self, method: str, path: str, body: bytes) -> bytes:
        if path == self.route:
            return self.fault
        if OLD_NAMES.get(self.route) == path:
            return NOT_FOUND
        if self.router and path == "/workers":
            return _json({"workers": [{"url": f"{self.url}/worker", "is_healthy": True}]})
        async with (
            ClientSession() as session,
            session.request(method, f"{self.target}{path.removeprefix('/worker')}", data=body) as answer,
        ):
            data = await answer.read()
            if self.router and path in ("/get_server_info", "/server_info"):
                data = json.dumps({**json.loads(data), "router_manager": True}).encode()
            return _json(data, answer.status)


def _json(data: Any, status: int = 200) -> bytes:
    body = data if isinstance(data, bytes) else json.dumps(data).encode()
    head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return f"{head}Connection: close\r\n\r\n".encode() + body
