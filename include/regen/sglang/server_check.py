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
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp

from regen.chat import ChatRenderer
from regen.reasons import Reason
from regen.records import RawAnswer, text_digest
from regen.sglang.client import Generation, SGLangClient, get_json, wait_healthy
from regen.sglang.fleet import EndpointPool
from regen.validate import judge

log = logging.getLogger(__name__)
PROBES = (
    "Reply with one short sentence: what is 2 + 2?",
    "Name one primary colour, in one word.",
    "Say hello in French, in one word.",
)
PROBE_MAX_NEW_TOKENS = 64
# Properties of the server, not of one sampled answer: one probe that shows them fails the check.
SERVER_FAULTS = frozenset(
    {Reason.TEXT_MISMATCH, Reason.PROMPT_TOKENS_MISMATCH, Reason.ID_OUT_OF_VOCAB, Reason.EMPTY_OUTPUT}
)


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
    generation = await _probe(session, url, renderer, sampling)
    return EndpointInfo(
        url=url,
        model_path=model_path,
        version=server.get("version"),
        context_length=server.get("context_length") or server.get("max_req_input_len"),
        max_running_requests=server.get("max_running_requests"),
        probe_output_tokens=len(generation.output_ids),
        probe_finish_reason=generation.finish_reason,
    )


async def _probe(
    session: aiohttp.ClientSession, url: str, renderer: ChatRenderer, sampling: dict[str, Any]
) -> Generation:
    """Probe answers judged like records. A tokenizer that disagrees fails at once; a sampled answer that is
    merely defective (a model sometimes runs on) is tolerated as long as one probe passes."""
    client = SGLangClient(EndpointPool([url], session), session, request_timeout_s=600, max_attempts=3)
    probe_sampling = {**sampling, "max_new_tokens": min(int(sampling["max_new_tokens"]), PROBE_MAX_NEW_TOKENS)}
    failures = []
    for question in PROBES:
        prompt_ids = renderer.render_ids([{"role": "user", "content": question}], None)
        generation = await client.generate(prompt_ids, probe_sampling, "regen-probe")
        answer = RawAnswer("regen-probe", generation.output_ids, generation.meta_info, *text_digest(generation.text))
        verdict = judge(prompt_ids, answer, renderer.roles, None, renderer.decode)
        if verdict.verdict == Reason.TEXT_MISMATCH:
            difference = first_difference(generation.text, renderer.decode(generation.output_ids))
            raise ServerMismatch(
                f"{url}: tokenizer mismatch: the server's text for a probe is not this pipeline's decode of the same "
                f"output_ids ({difference}). The server runs another tokenizer than profile "
                f"{renderer.profile.name!r} ({renderer.profile.tokenizer}): point the run at the right fleet, or "
                "start the servers with the profile's tokenizer"
            )
        if verdict.verdict in SERVER_FAULTS:
            raise ServerMismatch(
                f"{url}: the server's answer to a probe is unusable ({verdict.verdict}: {verdict.detail})"
            )
        if verdict.split is not None:
            return generation
        failures.append(f"{verdict.verdict}: {verdict.detail}")
        log.warning("%s: a probe answer failed validation (%s); trying another probe", url, failures[-1])
    raise ServerMismatch(f"{url}: every probe answer failed validation: {failures}")


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


def first_difference(text: str | None, decoded: str) -> str:
    if text is None:
        return "the server sent no text"
    at = next((i for i, (a, b) in enumerate(zip(text, decoded, strict=False)) if a != b), min(len(text), len(decoded)))
    return f"first difference at char {at}: server {text[at : at + 30]!r}, decode {decoded[at : at + 30]!r}"
