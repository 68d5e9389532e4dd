"""Whose fault an answer is: an endpoint that answers what no SGLang server answers (a proxy's 404 page) is ejected
and its samples answered elsewhere; a 400 only one endpoint gives is asked again on another; a sample that never
gets an answer in time is rejected with its reason while the rest are kept; and a shard the servers rejected too
much of (refused, aborted or miscounted on every attempt) fails red, naming them and the reasons, instead of
publishing what is left (its rejected samples asked again next time)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from regen.chat import ChatRenderer
from regen.config import Sampling
from regen.layout import DatasetLocation
from regen.manifest import ShardManifest
from regen.sglang.fleet import FleetUnavailable
from regen.simulator.faults import abort_answer
from regen.stages.generate.checkpoints import Checkpoints, load_checkpoints
from regen.stages.generate.generate import (
    GenerateSettings,
    TooManyServerRejections,
    check_server_rejections,
    run_generate,
)
from regen.storage import LocalStorage
from tests.conftest import Simulator, prepare_sample, raw_answers, shard_prompt_ids, start_simulator
from tests.loopback import AppOnLoopback


class FixedAnswer(AppOnLoopback):
    """Answers every request with one status and body: a proxy's 404 page, a server launched with a smaller context
    that refuses every prompt with a 400. Counts the /generate requests it got."""

    def __init__(self, status: int, body: str, content_type: str = "text/html") -> None:
        super().__init__()
        self.status, self.body, self.content_type = status, body, content_type
        self.generates = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.generates += request.path == "/generate"
        return web.Response(status=self.status, text=self.body, content_type=self.content_type)


class SickWorker(AppOnLoopback):
    """A router in front of the simulator that sends some prompts, on every attempt, to a sick worker: their
    /generate is answered with an abort (HTTP 200, finish_reason abort, as after a retraction). Everything else is
    passed on to the simulator."""

    def __init__(self, target: str, doomed: list[list[int]]) -> None:
        super().__init__()
        self.target, self.doomed = target, doomed
        self.aborted = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.path == "/generate" and json.loads(body)["input_ids"] in self.doomed:
            self.aborted += 1
            return web.json_response(abort_answer(json.loads(body)["rid"], 0.0, 0.0))
        async with (
            aiohttp.ClientSession() as session,
            session.request(request.method, f"{self.target}{request.path_qs}", data=body) as answer,
        ):
            return web.Response(body=await answer.read(), status=answer.status, content_type=answer.content_type)


NOT_FOUND = "<html><body><h1>404 Not Found</h1>nginx</body></html>"
CONTEXT_400 = json.dumps({"error": {"message": "The input (31 tokens) is longer than the model's context (16)."}})


@pytest.fixture
def shard(tmp_path: Path, renderer: ChatRenderer) -> tuple[LocalStorage, ShardManifest]:
    prepared, storage = prepare_sample(tmp_path / "root", renderer, "B2_opencodeinstruct", 24, limit=24)
    return storage, prepared.shards[0]


@pytest.fixture
def proxy_404() -> Iterator[FixedAnswer]:
    with FixedAnswer(404, NOT_FOUND) as server:
        yield server


def settings(*endpoints: str, **overrides: float) -> GenerateSettings:
    values = {"concurrency": 6, "max_attempts": 5, "backoff_max_s": 0.05, "fleet_wait_s": 2.0, **overrides}
    return GenerateSettings(list(endpoints), Sampling().as_params(), **values)  # type: ignore[arg-type]


def rejections(storage: LocalStorage, manifest: ShardManifest) -> list[dict[str, Any]]:
    key = manifest.keys.rejected("generate")
    return [json.loads(line) for line in storage.get_bytes(key).splitlines()] if storage.exists(key) else []


def test_a_404_endpoint_beside_a_good_one_is_ejected_and_every_sample_answered_by_the_good_one(
    shard: tuple[LocalStorage, ShardManifest], simulator: Simulator, proxy_404: FixedAnswer
) -> None:
    storage, prompts = shard
    manifest = run_generate(prompts, storage, settings(proxy_404.url, simulator.url))
    answers = raw_answers(storage, manifest.raw_key)
    assert manifest.stats["generate"].kept == len(answers) == prompts.num_prompts  # nothing rejected
    assert {a["endpoint"] for a in answers} == {simulator.url}
    assert 1 <= proxy_404.generates <= 6  # ejected at its first answers, the requests in flight then at most
    assert manifest.generation is not None and manifest.generation.ejections >= 1


def test_a_fleet_of_only_a_404_endpoint_fails_the_task_instead_of_rejecting_every_sample(
    shard: tuple[LocalStorage, ShardManifest], proxy_404: FixedAnswer
) -> None:
    storage, prompts = shard
    with pytest.raises(FleetUnavailable, match="every SGLang endpoint is failing"):
        run_generate(prompts, storage, settings(proxy_404.url, fleet_wait_s=1.0))
    assert not load_checkpoints(storage, prompts).rejected  # no sample was written off


def test_a_400_only_one_endpoint_gives_is_answered_by_another(
    shard: tuple[LocalStorage, ShardManifest], simulator: Simulator
) -> None:
    storage, prompts = shard
    with FixedAnswer(400, CONTEXT_400, "application/json") as short_context:
        manifest = run_generate(prompts, storage, settings(short_context.url, simulator.url))
    answers = raw_answers(storage, manifest.raw_key)
    assert len(answers) == prompts.num_prompts and not rejections(storage, manifest)
    assert {a["endpoint"] for a in answers} == {simulator.url}
    assert short_context.generates >= 1  # it was asked, and refused


def test_a_shard_the_servers_reject_too_much_of_fails_red_and_a_mended_fleet_answers_it(
    shard: tuple[LocalStorage, ShardManifest], simulator: Simulator
) -> None:
    storage, prompts = shard
    with (
        FixedAnswer(400, CONTEXT_400, "application/json") as short_context,
        pytest.raises(TooManyServerRejections) as failed,
    ):
        run_generate(prompts, storage, settings(short_context.url))
    message = str(failed.value)
    assert f"lost {prompts.num_prompts} of {prompts.num_prompts} answers" in message
    assert short_context.url in message and "max_server_rejected_share" in message
    assert not storage.exists(prompts.keys.raw)  # nothing to publish
    manifest = run_generate(prompts, storage, settings(simulator.url))  # the fleet mended: asked again
    assert len(raw_answers(storage, manifest.raw_key)) == prompts.num_prompts
    assert not rejections(storage, manifest) and manifest.stats["generate"].dropped == 0


@pytest.mark.parametrize(
    "server_side,other,share,fails",
    [
        pytest.param({"server_rejected": 1}, 0, 0.0, False, id="one-alone-never"),
        pytest.param({"server_rejected": 2}, 0, 0.0, True, id="two-past-zero"),
        pytest.param({"server_rejected": 2}, 0, 0.1, False, id="two-of-24-within-10pc"),
        pytest.param({"server_rejected": 3}, 0, 0.1, True, id="three-of-24-past-10pc"),
        pytest.param({"server_aborted": 2}, 0, 0.0, True, id="aborts-count"),
        pytest.param({"count_mismatch": 2}, 0, 0.0, True, id="count-mismatches-count"),
        pytest.param({"server_aborted": 1}, 0, 0.0, False, id="one-abort-alone-never"),
        pytest.param({"server_rejected": 1, "server_aborted": 1, "count_mismatch": 1}, 0, 0.125, False, id="mixed-3"),
        pytest.param({"server_rejected": 2, "server_aborted": 1, "count_mismatch": 1}, 0, 0.125, True, id="mixed-4"),
        pytest.param({"server_rejected": 1}, 20, 0.0, False, id="timeouts-and-the-prompts-own-not-counted"),
    ],
)
def test_the_backstop_counts_server_side_rejections_only(
    server_side: dict[str, int], other: int, share: float, fails: bool
) -> None:
    """The backstop is for a fleet at fault: a refusal, an abort or a count mismatch on every attempt, of any one
    sample alone, is kept with its reason; past the share they fail the shard. A sample that timed out on working
    servers (the poison prompt) and one whose ids are out of the vocabulary are the sample's own, never counted."""
    done = Checkpoints()
    for reason, count in server_side.items():
        for i in range(count):
            done.rejected[f"{reason}{i}"] = {"reason": reason, "detail": "d", "endpoint": "http://gpu-1"}
    others = ["prompt_id_out_of_vocab", "sample_timeout"]  # a sample's own
    for i in range(other):
        done.rejected[f"o{i}"] = {"reason": others[i % 2], "detail": "d", "endpoint": "http://gpu-1"}
    shard = ShardManifest(DatasetLocation("/data", "kimi-k2.5-mini", "D", "v1"), 0, "p", "sha", 24)
    if fails:
        total = sum(server_side.values())
        with pytest.raises(TooManyServerRejections, match=rf"http://gpu-1': {total}\b") as failed:
            check_server_rejections(shard, 24, done, share)
        for reason, count in server_side.items():
            assert f"'{reason}': {count}" in str(failed.value)
    else:
        check_server_rejections(shard, 24, done, share)


def test_a_shard_whose_samples_a_sick_worker_aborts_on_every_attempt_fails_red_naming_it_and_the_reason(
    shard: tuple[LocalStorage, ShardManifest], simulator: Simulator
) -> None:
    """A router that keeps sending 4 of 24 prompts to a sick worker: each is aborted on every attempt. Over 2% of the
    shard, that is the fleet's fault, not the data's: the shard fails instead of publishing 20 answers."""
    storage, prompts = shard
    doomed = list(shard_prompt_ids(storage, prompts).values())[:4]
    with SickWorker(simulator.url, doomed) as router, pytest.raises(TooManyServerRejections) as failed:
        run_generate(prompts, storage, settings(router.url))
    message = str(failed.value)
    assert f"lost 4 of {prompts.num_prompts} answers" in message
    assert router.url in message and "'server_aborted': 4" in message and "max_server_rejected_share" in message
    assert router.aborted == 4 * 5  # every attempt of each
    assert not storage.exists(prompts.keys.raw)  # nothing to publish
    manifest = run_generate(prompts, storage, settings(simulator.url))  # the fleet mended: asked again
    assert len(raw_answers(storage, manifest.raw_key)) == prompts.num_prompts and not rejections(storage, manifest)


def test_one_sample_aborted_on_every_attempt_alone_is_rejected_and_the_shard_goes_on(
    shard: tuple[LocalStorage, ShardManifest], simulator: Simulator
) -> None:
    storage, prompts = shard
    doomed = list(shard_prompt_ids(storage, prompts).values())[:1]
    with SickWorker(simulator.url, doomed) as router:
        manifest = run_generate(prompts, storage, settings(router.url, max_server_rejected_share=0.0))
    assert [r["reason"] for r in rejections(storage, manifest)] == ["server_aborted"]
    assert len(raw_answers(storage, manifest.raw_key)) == prompts.num_prompts - 1


def test_a_shard_the_server_miscounts_on_every_attempt_fails_red_naming_it_and_the_reason(
    tmp_path: Path, shard: tuple[LocalStorage, ShardManifest]
) -> None:
    """completion_tokens off from len(output_ids), drawn from the prompt and seed: every attempt of those samples
    carries it. A server that says so of a fifth of a shard is broken, not the prompts. (One request at a time and
    3 attempts a sample: a lone endpoint is ejected after 16 failures in a row, which would fail the task before
    the backstop is reached.)"""
    storage, prompts = shard
    with start_simulator(tmp_path, "--defect-count-mismatch-rate", "0.2") as miscounting:
        with pytest.raises(TooManyServerRejections) as failed:
            run_generate(prompts, storage, settings(miscounting.url, concurrency=1, max_attempts=3))
        miscounted = {r["rid"].split("-")[0] for r in miscounting.records() if r["defect"] == "count_mismatch"}
    message = str(failed.value)
    assert len(miscounted) > 1 and f"lost {len(miscounted)} of {prompts.num_prompts} answers" in message
    assert miscounting.url in message and f"'count_mismatch': {len(miscounted)}" in message


def test_a_sample_that_always_times_out_is_rejected_with_its_reason_and_the_rest_are_kept(
    tmp_path: Path, shard: tuple[LocalStorage, ShardManifest]
) -> None:
    storage, prompts = shard
    with (
        start_simulator(tmp_path, "--hang-prompt-rate", "0.1", "--hang-s", "5", "--decode-ms-per-token", "2") as first,
        start_simulator(tmp_path, "--hang-prompt-rate", "0.1", "--hang-s", "5", "--decode-ms-per-token", "2") as second,
    ):
        run = settings(first.url, second.url, request_timeout_s=2.0, max_server_rejected_share=0.5)
        manifest = run_generate(prompts, storage, run)
    timed_out = [r for r in rejections(storage, manifest) if r["reason"] == "sample_timeout"]
    answers = raw_answers(storage, manifest.raw_key)
    assert timed_out and len(answers) + len(timed_out) == prompts.num_prompts  # the rest answered
    assert all("no answer in 2s" in r["detail"] for r in timed_out)
    assert manifest.generation is not None and manifest.generation.ejections == 0  # the servers were fine


def test_samples_that_always_time_out_never_fail_the_shard_however_many(
    tmp_path: Path, shard: tuple[LocalStorage, ShardManifest]
) -> None:
    """The poison prompt is the data's: it times out on servers that answer others, and is not the fleet's fault,
    so the backstop leaves it out even at a share of 0."""
    storage, prompts = shard
    hangs = ("--hang-prompt-rate", "0.25", "--hang-s", "5", "--decode-ms-per-token", "2")
    with start_simulator(tmp_path, *hangs) as first, start_simulator(tmp_path, *hangs) as second:
        run = settings(first.url, second.url, request_timeout_s=2.0, max_server_rejected_share=0.0)
        manifest = run_generate(prompts, storage, run)
    reasons = [r["reason"] for r in rejections(storage, manifest)]
    assert len(reasons) > 1 and set(reasons) == {"sample_timeout"}
    assert len(raw_answers(storage, manifest.raw_key)) + len(reasons) == prompts.num_prompts
