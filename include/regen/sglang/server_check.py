"""Stage 2: before any GPU time goes into shards, prove every endpoint serves the profile's model correctly.

Each endpoint must answer /health (within a deadline), report a model that the profile accepts in /model_info, and
answer one probe prompt whose ids pass the same checks as a real record (a probe cut by its small token budget may
end with finish_reason length). The probe's `text` must be this pipeline's own decode of its `output_ids`: a server
that detokenises differently runs another tokenizer, and every prompt it is sent would mean something else to it. A
mismatch fails the run with a message that says what differs.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

import aiohttp

from regen.chat import ChatRenderer
from regen.reasons import Reason
from regen.records import RawAnswer
from regen.sglang.client import SGLangClient, get_json, wait_healthy
from regen.sglang.fleet import EndpointPool
from regen.validate import judge

PROBE_MESSAGES = [{"role": "user", "content": "Reply with one short sentence: what is 2 + 2?"}]
PROBE_MAX_NEW_TOKENS = 64


class ServerMismatch(Exception):
    pass


@dataclass(frozen=True)
class EndpointInfo:
    url: str
    model_path: str
    version: str | None
    context_length: int | None
    max_running_requests: int | None  # the server's running slots: the fleet's capacity
    probe_output_tokens: int
    probe_finish_reason: dict[str, Any]


def model_matches(model_path: str, accepted: tuple[str, ...]) -> bool:
    """A served path like /models/moonshotai/Kimi-K2.5 matches "moonshotai/Kimi-K2.5" or "Kimi-K2.5"."""
    path = model_path.rstrip("/")
    return any(path == name or path.endswith("/" + name) for name in accepted)


async def _check_one(
    session: aiohttp.ClientSession, url: str, renderer: ChatRenderer, sampling: dict[str, Any], deadline_s: float
) -> EndpointInfo:
    await wait_healthy(session, url, deadline_s)
    info = await get_json(session, f"{url}/model_info")
    model_path = str(info.get("model_path", ""))
    if not model_matches(model_path, renderer.profile.served_model_names):
        raise ServerMismatch(
            f"{url} serves {model_path!r}, but profile {renderer.profile.name!r} expects one of "
            f"{list(renderer.profile.served_model_names)}: point the run at the right fleet or pick the right profile"
        )
    server = await get_json(session, f"{url}/server_info")
    prompt_ids = renderer.render_ids(PROBE_MESSAGES, None)
    client = SGLangClient(EndpointPool([url], session), session, request_timeout_s=600, max_attempts=3)
    probe_sampling = {**sampling, "max_new_tokens": min(int(sampling["max_new_tokens"]), PROBE_MAX_NEW_TOKENS)}
    generation = await client.generate(prompt_ids, probe_sampling, "regen-probe")
    answer = RawAnswer("regen-probe", generation.output_ids, generation.meta_info, generation.text)
    verdict = judge(prompt_ids, answer, renderer.roles, None, renderer.decode)
    if verdict.verdict == Reason.TEXT_MISMATCH:
        raise ServerMismatch(
            f"{url}: tokenizer mismatch: the server's text for the probe is not this pipeline's decode of the same "
            f"output_ids ({verdict.detail}). The server runs another tokenizer than profile "
            f"{renderer.profile.name!r} ({renderer.profile.tokenizer}): point the run at the right fleet, or start "
            "the servers with the profile's tokenizer"
        )
    if verdict.split is None:
        raise ServerMismatch(
            f"{url}: the probe answer failed validation ({verdict.verdict}: {verdict.detail}): "
            f"{generation.output_ids[:32]}..."
        )
    return EndpointInfo(
        url=url,
        model_path=model_path,
        version=server.get("version"),
        context_length=server.get("context_length") or server.get("max_req_input_len"),
        max_running_requests=server.get("max_running_requests"),
        probe_output_tokens=len(generation.output_ids),
        probe_finish_reason=generation.finish_reason,
    )


async def _check_all(
    endpoints: list[str], renderer: ChatRenderer, sampling: dict[str, Any], deadline_s: float
) -> list[EndpointInfo]:
    async with aiohttp.ClientSession() as session:
        return list(
            await asyncio.gather(
                *(_check_one(session, u.rstrip("/"), renderer, sampling, deadline_s) for u in endpoints)
            )
        )


def check_fleet(
    endpoints: list[str], renderer: ChatRenderer, sampling: dict[str, Any], deadline_s: float = 600.0
) -> list[dict[str, Any]]:
    return [dataclasses.asdict(e) for e in asyncio.run(_check_all(endpoints, renderer, sampling, deadline_s))]
