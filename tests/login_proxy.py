"""A proxy on loopback in front of a server, wanting one login as HTTP basic auth: what an endpoint URL's
`user:pass@` is for. Tests see whether every request carried the login."""

from __future__ import annotations

import base64

from aiohttp import ClientSession, web

from tests.loopback import AppOnLoopback

USER, SECRET = "alice", "s3cr3t-pw"


class LoginProxy(AppOnLoopback):
    """A proxy on loopback that wants `Authorization: Basic alice:s3cr3t-pw` on every request (401 without it) and
    passes the request on to the simulator; every `refuse_every`-th /generate is refused with a 400 (a rejection the
    client records with the endpoint's URL)."""

    def __init__(self, target: str, refuse_every: int = 0) -> None:
        super().__init__()
        self.target, self.refuse_every = target, refuse_every
        self.seen: list[tuple[str, bool]] = []  # (path, the right login)

    def with_login(self, password: str = SECRET) -> str:
        return f"http://{USER}:{password}@127.0.0.1:{self.port}"

    async def handle(self, request: web.Request) -> web.Response:
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
