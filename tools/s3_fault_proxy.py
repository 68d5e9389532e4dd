"""An HTTP proxy in front of an S3 API that fails a share of requests the ways S3 does, for resilience tests.

    python tools/s3_fault_proxy.py --upstream http://127.0.0.1:5000 --port 5001 --fault-rate 0.2

Each request is forwarded whole to the upstream (method, path, query, headers, body) unless a fault is drawn for it:
- 500 InternalError and 503 SlowDown, with S3's XML error body, before the upstream sees the request;
- a connection reset: the request is forwarded, then the connection is dropped without an answer, so the client
  cannot know whether its write landed (it must retry, and a retried PUT must be harmless).
Faults at a chosen request too: `drop_replies` (tests set it) lists (method, path suffix) pairs; the next request
matching one lands and loses its reply (a connection reset, counted as one), and the pair is used up; another
process arms one with `POST /__drop_reply?method=PUT&path=<suffix>` (the crash-point harness's tasks). And a store
that ignores some request headers: `strip_headers` (lower case) are never forwarded.
Draws come from one seeded stream, so a run is repeatable. `GET /__faults` reports what was injected. An outage:
`down` set (tests set the attribute) answers every request 503 until it is cleared; `POST /__outage?seconds=S` sets
it for S seconds (a bench's S3 going dark).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import struct
from collections import Counter
from typing import Any

import aiohttp
from aiohttp import web

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization"}
ERRORS = {
    500: ("InternalError", "We encountered an internal error. Please try again."),
    503: ("SlowDown", "Please reduce your request rate."),
}


def error_body(status: int, resource: str) -> bytes:
    code, message = ERRORS[status]
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
        f"<Resource>{resource}</Resource><RequestId>fault-proxy</RequestId></Error>"
    ).encode()


class FaultProxy:
    def __init__(self, upstream: str, fault_rate: float, seed: int = 0) -> None:
        self.upstream = upstream.rstrip("/")
        self.fault_rate = fault_rate
        self.rng = random.Random(seed)
        self.injected: Counter[str] = Counter()
        self.forwarded = 0
        self.down = False  # an outage: every request answered 503, none forwarded
        self.drop_replies: list[tuple[str, str]] = []  # (method, path suffix): the next such reply is dropped
        self.strip_headers: set[str] = set()  # request headers (lower case) never forwarded: a store ignoring them
        self.session: aiohttp.ClientSession | None = None

    def draw(self) -> str | None:
        if self.rng.random() >= self.fault_rate:
            return None
        return self.rng.choice(("500", "503", "reset"))

    def chosen(self, request: web.Request) -> str | None:
        """A reset for the first request matching a pair of `drop_replies` (the pair used up), else None."""
        for pair in self.drop_replies:
            if request.method == pair[0] and request.path.endswith(pair[1]):
                self.drop_replies.remove(pair)
                return "reset"
        return None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/__faults":
            return web.json_response({"injected": dict(self.injected), "forwarded": self.forwarded})
        if request.path == "/__outage" and request.method == "POST":
            self.down = True
            asyncio.get_running_loop().call_later(float(request.query["seconds"]), setattr, self, "down", False)
            return web.json_response({"down_for_s": float(request.query["seconds"])})
        if request.path == "/__drop_reply" and request.method == "POST":
            self.drop_replies.append((request.query["method"], request.query["path"]))
            return web.json_response({"armed": len(self.drop_replies)})
        fault = "outage" if self.down else self.chosen(request) or self.draw()
        body = await request.read()
        if fault == "outage":
            self.injected[fault] += 1
            return web.Response(status=503, body=error_body(503, request.path), content_type="application/xml")
        if fault in ("500", "503"):
            self.injected[fault] += 1
            status = int(fault)
            return web.Response(status=status, body=error_body(status, request.path), content_type="application/xml")
        assert self.session is not None
        kept_back = HOP_BY_HOP | {"host"} | self.strip_headers
        headers = {k: v for k, v in request.headers.items() if k.lower() not in kept_back}
        async with self.session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=body, allow_redirects=False
        ) as upstream:
            payload = await upstream.read()
            self.forwarded += 1
            if fault == "reset":  # the upstream did the work; the client never hears of it
                self.injected[fault] += 1
                transport = request.transport
                if transport is not None:
                    sock = transport.get_extra_info("socket")
                    if sock is not None:  # RST, not FIN: what a dropped connection looks like to the client
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    transport.close()
                raise asyncio.CancelledError
            # A HEAD answer keeps the object's Content-Length (clients size downloads by it); others carry the body.
            dropped = HOP_BY_HOP | ({"content-encoding"} if request.method == "HEAD" else {"content-length"})
            answer = [(name, value) for name, value in upstream.headers.items() if name.lower() not in dropped]
            if request.method == "HEAD":
                return web.Response(status=upstream.status, headers=answer)
            response = web.Response(status=upstream.status, body=payload)
            for name, value in answer:
                response.headers.add(name, value)
            return response

    async def start(self, app: web.Application) -> None:
        self.session = aiohttp.ClientSession(auto_decompress=False)

    async def stop(self, app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()


def build_app(proxy: FaultProxy) -> web.Application:
    app = web.Application(client_max_size=1 << 30)
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    app.on_startup.append(proxy.start)
    app.on_cleanup.append(proxy.stop)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", required=True, help="the S3 API's base URL")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--fault-rate", type=float, default=0.2, help="share of requests that fail (default 0.2)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    proxy = FaultProxy(args.upstream, args.fault_rate, args.seed)
    web.run_app(build_app(proxy), host=args.host, port=args.port, access_log=None, print=None)


def run_in_thread(upstream: str, port: int, fault_rate: float, seed: int = 0) -> tuple[FaultProxy, Any]:
    """The proxy on its own event loop in a daemon thread (for tests); returns it and a stop function."""
    import threading

    proxy = FaultProxy(upstream, fault_rate, seed)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(build_app(proxy), access_log=None)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def stop() -> None:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)

    return proxy, stop


if __name__ == "__main__":
    main()
