"""The check_server stage: before any GPU time goes into shards, prove every endpoint serves the profile's model.

An endpoint is an SGLang server or an sglang-router in front of several. Each must answer /health (within a
deadline; at once when nothing listens there), report a model that the profile accepts in /get_model_info (a router
forwards it to a worker), and answer one probe prompt whose ids pass the same checks as a real record (a probe cut by
its small token budget may end with finish_reason length). A router is told by its /get_server_info
(`router_manager`); the fleet behind it is read from /workers, and every worker must serve an accepted model too.
The probe's `text` must be this pipeline's own decode of its `output_ids`: a server that detokenizes differently runs
another tokenizer, and every prompt it is sent would mean something else to it. A mismatch fails the run with a
message that says what differs. Each server's SGLang version (a router's: its workers') is recorded and logged; one
other than regen.sglang.parity's PROVEN_SGLANG_VERSION, or none, is a warning, here and in the run report.

Only endpoints that servers and the router both serve are used (SGLANG_API.md): /health, /get_model_info,
/get_server_info, /generate; the newer names /model_info and /server_info only as a fallback where the old ones 404.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from regen.chat import ChatRenderer
from regen.endpoints import Endpoint, redact_url
from regen.errors import FinalError
from regen.judge import judge
from regen.reasons import Reason
from regen.records import RawAnswer, text_digest
from regen.redaction import describe
from regen.sglang.auth import NO_KEYS, ApiKeys
from regen.sglang.client import Generation, SGLangClient, get_json, wait_healthy
from regen.sglang.fleet import EndpointPool, FleetUnavailable, NothingListens
from regen.sglang.parity import sglang_version_warnings
from regen.sglang.served_model import (
    context_length_of,
    fleet_seeds_honoured,
    gpus_of,
    priority_order,
    seeds_honoured,
    served_name,
    served_vocab,
)

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
MODEL_INFO = ("/get_model_info", "/model_info")  # a router serves only the first; servers both
SERVER_INFO = ("/get_server_info", "/server_info")


class ServerMismatch(FinalError):
    pass


@dataclass(frozen=True)
class WorkerInfo:
    """One server behind a router, as the router's /workers lists it."""

    url: str
    model_path: str
    healthy: bool
    # From the worker's own /get_server_info, when it can be reached from here (None when not):
    max_running_requests: int | None = None
    version: str | None = None
    context_length: int | None = None
    gpus: int | None = None
    seeds_honoured: bool | None = None
    priority_order: str | None = None  # regen.sglang.served_model.priority_order


@dataclass(frozen=True)
class EndpointInfo:
    url: str
    model_path: str
    version: str | None
    context_length: int | None
    max_running_requests: int | None  # the running slots behind this URL (a router: its healthy workers' sum)
    probe_output_tokens: int
    probe_finish_reason: dict[str, Any]
    gpus: int | None = None  # tp_size x dp_size of the server (a router: its healthy workers' sum); None: unknown
    router: bool = False
    workers: list[WorkerInfo] = field(default_factory=list)
    served_model_name: str = ""  # the name clients use (--served-model-name); model_path is --model-path
    vocab_size: int | None = None  # the served model's vocabulary (regen.sglang.served_model); None: unknown
    seeds_honoured: bool | None = None  # --enable-deterministic-inference: sampling_seed is applied; None: not said
    priority_order: str | None = None  # the waiting queue's order (served_model.priority_order); a router's: None


def model_matches(model_path: str, accepted: tuple[str, ...]) -> bool:
    """A served path like /models/moonshotai/Kimi-K2.5 matches "moonshotai/Kimi-K2.5" or "Kimi-K2.5"."""
    path = model_path.rstrip("/")
    return any(path == name or path.endswith("/" + name) for name in accepted)


def router_workers(workers: dict[str, Any]) -> list[WorkerInfo]:
    """The workers in a router's /workers answer (sglang-router 0.3: the model in each worker's metadata, which the
    router read from the worker, by the name clients use; "" when it has none)."""
    infos = []
    for worker in workers.get("workers", []):
        metadata = worker.get("metadata") or {}
        model_path = metadata.get("served_model_name") or metadata.get("model_path") or ""
        infos.append(WorkerInfo(str(worker["url"]).rstrip("/"), str(model_path), bool(worker.get("is_healthy"))))
    return infos


def fleet_capacity(workers: list[WorkerInfo]) -> int | None:
    """The healthy workers' running slots: None unless every one of them is known."""
    slots = [w.max_running_requests for w in workers if w.healthy]
    return sum(s for s in slots if s is not None) if slots and None not in slots else None


def fleet_gpus(workers: list[WorkerInfo]) -> int | None:
    """The healthy workers' GPUs: None unless every one of them is known."""
    gpus = [w.gpus for w in workers if w.healthy]
    return sum(g for g in gpus if g) if gpus and all(gpus) else None


def fleet_version(workers: list[WorkerInfo]) -> str | None:
    """The workers' SGLang versions, each once (a fleet mid-upgrade shows both)."""
    versions = sorted({w.version for w in workers if w.version})
    return ", ".join(versions) or None


def fleet_context_length(workers: list[WorkerInfo]) -> int | None:
    """The smallest context a worker reports: a prompt must fit on whichever worker the router picks."""
    lengths = [w.context_length for w in workers if w.context_length]
    return min(lengths) if lengths else None


async def get_either(
    session: aiohttp.ClientSession, url: str, paths: tuple[str, ...], timeout_s: float = 10.0
) -> dict[str, Any]:
    """The first alias of an endpoint that url serves: a router lacks some of a server's names, and a newer server
    may drop the deprecated ones."""
    for path in paths[:-1]:
        try:
            return dict(await get_json(session, f"{url}{path}", timeout_s))
        except aiohttp.ClientResponseError as e:
            if e.status != 404:
                raise
    return dict(await get_json(session, f"{url}{paths[-1]}", timeout_s))


def _check_model(url: str, name: str, renderer: ChatRenderer) -> None:
    if not model_matches(name, renderer.profile.served_model_names):
        raise ServerMismatch(
            f"{redact_url(url)} serves {name!r} (its --served-model-name), but profile {renderer.profile.name!r} "
            f"expects one of {list(renderer.profile.served_model_names)}: point the run at the right fleet, pick the "
            "right profile, or start the servers with --served-model-name set to one of those"
        )


def check_vocab(url: str, vocab: int | None, renderer: ChatRenderer) -> None:
    """The profile's tokenizer must fit the served model's vocabulary (one id past it kills an SGLang 0.5.23 server:
    no range check), and a vocab_size the profile declares must be it. Checked before any prompt; unknown: a warning."""
    size = renderer.roles.vocab_size
    if vocab is None:
        log.warning(
            "%s does not say its model's vocabulary (and its model_path is no folder here with a config.json): "
            "prompt ids are kept below the tokenizer's %d, which is all this run can check",
            redact_url(url),
            size,
        )
    elif size > vocab:
        raise ServerMismatch(
            f"{redact_url(url)} serves a model with a vocabulary of {vocab} ids, but profile "
            f"{renderer.profile.name!r}'s tokenizer ({renderer.profile.tokenizer}) has {size}: an id of {vocab} or "
            "more would kill the server (SGLang does not range-check input ids). Serve the profile's model, or pick "
            "the profile of the model served"
        )
    elif renderer.profile.vocab_size not in (None, vocab):  # the draft mapping's target vocabulary
        raise ServerMismatch(
            f"{redact_url(url)} serves a model with a vocabulary of {vocab} ids, but profile {renderer.profile.name!r} "
            f"declares vocab_size {renderer.profile.vocab_size}: serve its model, or declare the served one's"
        )


PARSERS = ("tool_call_parser", "reasoning_parser")


def check_parsers(url: str, server: dict[str, Any], renderer: ChatRenderer) -> None:
    """The server reads answers with the parsers the profile names (its /server_info, as launched with
    --tool-call-parser and --reasoning-parser): validation and on-policy reading follow the profile's, so a server
    with others would return messages this pipeline does not expect. A profile that names none checks none; a server
    info that does not say (a router's own) is judged by its workers'."""
    profile = renderer.profile
    differ = [
        f"{key} {server.get(key)!r} (the profile names {getattr(profile, key)!r})"
        for key in PARSERS
        if getattr(profile, key) is not None and key in server and server.get(key) != getattr(profile, key)
    ]
    if differ:
        raise ServerMismatch(
            f"{redact_url(url)} was started with {' and '.join(differ)}: start the servers with "
            + " ".join(f"--{key.replace('_', '-')} {getattr(profile, key)}" for key in PARSERS if getattr(profile, key))
            + f", or pick the profile of the model they serve (profile {profile.name!r})"
        )


async def _check_one(
    session: aiohttp.ClientSession, url: str, renderer: ChatRenderer, sampling: dict[str, Any], deadline_s: float
) -> EndpointInfo:
    give_up = asyncio.get_running_loop().time() + deadline_s
    await wait_healthy(session, url, deadline_s)
    server = await get_either(session, url, SERVER_INFO)
    workers: list[WorkerInfo] = []
    if server.get("router_manager"):
        workers = await _router_fleet(session, url, give_up - asyncio.get_running_loop().time(), renderer)
        for worker in (w for w in workers if w.model_path):  # one without metadata is judged by the probe alone
            _check_model(f"{redact_url(url)} (worker {redact_url(worker.url)})", worker.model_path, renderer)
    else:
        check_parsers(url, server, renderer)
    info = await get_either(session, url, MODEL_INFO)
    model_path, name = str(info.get("model_path", "")), served_name(server, info)
    _check_model(url, name, renderer)
    vocab = served_vocab(server, info)  # a router: the worker it forwarded /get_model_info to
    check_vocab(url, vocab, renderer)
    generation = await _probe(session, url, renderer, sampling)
    version = fleet_version(workers) if workers else server.get("version")
    served_by = f"SGLang {version}" if version else "an SGLang that does not say its version"
    model = name if model_path in ("", name) else f"{name} (from {model_path})"
    log.info("%s serves %s on %s; its probe answer passed", redact_url(url), model, served_by)
    seeds = fleet_seeds_honoured([asdict(w) for w in workers if w.healthy]) if workers else seeds_honoured(server)
    if seeds is False:
        log.warning(
            "%s does not run --enable-deterministic-inference: sampling_seed has no effect there, so the seeds the "
            "records carry do not reproduce their answers (docs/operations.md)",
            redact_url(url),
        )
    return EndpointInfo(
        url=url,
        model_path=model_path,
        served_model_name=name,
        vocab_size=vocab,
        seeds_honoured=seeds,
        version=version,
        context_length=fleet_context_length(workers) if workers else context_length_of(server),
        max_running_requests=fleet_capacity(workers) if workers else server.get("max_running_requests"),
        gpus=fleet_gpus(workers) if workers else gpus_of(server),
        probe_output_tokens=len(generation.output_ids),
        probe_finish_reason=generation.finish_reason,
        router=bool(server.get("router_manager")),
        workers=workers,
        priority_order=None if workers else priority_order(server),
    )


async def _router_fleet(
    session: aiohttp.ClientSession, url: str, deadline_s: float, renderer: ChatRenderer
) -> list[WorkerInfo]:
    """The workers behind a router, once one is healthy. A router answers /health with no worker at all, so its
    readiness is /health_generate (200 once a worker is healthy). Each worker's own /get_server_info, where it can be
    reached from here, gives its running slots, version and context length."""
    try:
        await wait_healthy(session, url, max(deadline_s, 0.0), path="/health_generate")
    except NothingListens:
        raise
    except FleetUnavailable as e:
        raise FleetUnavailable(
            f"{e}: the sglang-router at {redact_url(url)} has no healthy worker (its log says which worker URLs it "
            "cannot reach)"
        ) from e
    workers = router_workers(await get_json(session, f"{url}/workers"))
    if not workers:
        raise FleetUnavailable(f"{redact_url(url)} is an sglang-router, and its /workers lists no worker")
    for worker in workers:
        if not worker.healthy:
            log.warning(
                "%s: router worker %s is not healthy; it is left out of the fleet's capacity",
                redact_url(url),
                redact_url(worker.url),
            )
    served = await asyncio.gather(*(_worker_server_info(session, w.url) for w in workers))
    for worker, info in zip(workers, served, strict=True):
        where = f"{redact_url(url)} (worker {redact_url(worker.url)})"
        check_parsers(where, info, renderer)
        if (vocab := served_vocab(info, {})) is not None:  # each worker's own model, where this process reads it
            check_vocab(where, vocab, renderer)
    log.info(
        "%s is an sglang-router in front of %d workers: %s",
        redact_url(url),
        len(workers),
        [redact_url(w.url) for w in workers],
    )
    return [
        dataclasses.replace(
            w,
            max_running_requests=s.get("max_running_requests"),
            version=s.get("version"),
            context_length=context_length_of(s),
            gpus=gpus_of(s),
            seeds_honoured=seeds_honoured(s),
            priority_order=priority_order(s),
        )
        for w, s in zip(workers, served, strict=True)
    ]


async def _worker_server_info(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    """A worker's own server info, or {} when it cannot be had from here (a worker on a network only the router
    reaches): its capacity is then unknown, which the report handles."""
    try:
        return await get_either(session, url, SERVER_INFO)
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        log.warning(
            "router worker %s: no /get_server_info from here (%s); its running slots are unknown",
            redact_url(url),
            describe(e),
        )
        return {}


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
                f"{redact_url(url)}: tokenizer mismatch: the server's text for a probe is not this pipeline's decode "
                f"of the same output_ids ({difference}). The server runs another tokenizer than profile "
                f"{renderer.profile.name!r} ({renderer.profile.tokenizer}): point the run at the right fleet, or "
                "start the servers with the profile's tokenizer"
            )
        if verdict.verdict in SERVER_FAULTS:
            raise ServerMismatch(
                f"{redact_url(url)}: the server's answer to a probe is unusable ({verdict.verdict}: {verdict.detail})"
            )
        if verdict.split is not None:
            return generation
        failures.append(f"{verdict.verdict}: {verdict.detail}")
        log.warning("%s: a probe answer failed validation (%s); trying another probe", redact_url(url), failures[-1])
    raise ServerMismatch(f"{redact_url(url)}: every probe answer failed validation: {failures}")


async def _check_all(
    endpoints: Sequence[str | Endpoint],
    renderer: ChatRenderer,
    sampling: dict[str, Any],
    deadline_s: float,
    api_keys: ApiKeys,
) -> list[EndpointInfo]:
    targets = [Endpoint.parse(url) for url in endpoints]  # requests go to their base URLs; logins by the session
    async with api_keys.session(targets) as session:
        found = await asyncio.gather(*(_check_one(session, t.base, renderer, sampling, deadline_s) for t in targets))
    return [dataclasses.replace(info, url=str(t)) for info, t in zip(found, targets, strict=True)]  # `***@` shown


def check_fleet(
    endpoints: Sequence[str | Endpoint],
    renderer: ChatRenderer,
    sampling: dict[str, Any],
    deadline_s: float = 600.0,
    api_keys: ApiKeys = NO_KEYS,
) -> list[dict[str, Any]]:
    """Every endpoint's EndpointInfo as a dict. A fleet that serves another SGLang version than the one the pipeline
    is proven against (regen.sglang.parity), or does not say which, passes with a warning (here and in the run
    report)."""
    fleet = [
        redacted(dataclasses.asdict(e))
        for e in asyncio.run(_check_all(endpoints, renderer, sampling, deadline_s, api_keys))
    ]
    for warning in sglang_version_warnings(fleet):
        log.warning("%s", warning)
    return fleet


def redacted(endpoint: dict[str, Any]) -> dict[str, Any]:
    """An endpoint's record without the credentials a URL may carry: it goes to XCom, the manifest and the report."""
    workers = [{**w, "url": redact_url(w["url"])} for w in endpoint.get("workers") or []]
    return {**endpoint, "url": redact_url(endpoint["url"]), **({"workers": workers} if workers else {})}


def first_difference(text: str | None, decoded: str) -> str:
    if text is None:
        return "the server sent no text"
    at = next((i for i, (a, b) in enumerate(zip(text, decoded, strict=False)) if a != b), min(len(text), len(decoded)))
    return f"first difference at char {at}: server {text[at : at + 30]!r}, decode {decoded[at : at + 30]!r}"
