"""Whose fault an answer is: an endpoint that answers what no SGLang server answers (a proxy's 404 page) is ejected
and its samples answered elsewhere; a 400 only one endpoint gives is asked again on another; a sample that never
gets an answer in time is rejected with its reason while the rest are kept; and a shard the servers rejected too
much of fails red, naming them, instead of publishing what is left (its rejected samples asked again next time)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from regen.chat import ChatRenderer
from regen.config import Sampling
from regen.layout import DatasetLocation
from regen.manifest import ShardManifest
from regen.sglang.fleet import FleetUnavailable
from regen.stages.generate.checkpoints import Checkpoints, load_checkpoints
from regen.stages.generate.generate import (
    GenerateSettings,
    TooManyServerRejections,
    check_server_rejections,
    run_generate,
)
from regen.storage import LocalStorage
from tests.conftest import Simulator, prepare_sample, raw_answers, start_simulator
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
    assert f"rejected {prompts.num_prompts} of {prompts.num_prompts} samples" in message
    assert short_context.url in message and "max_server_rejected_share" in message
    assert not storage.exists(prompts.keys.raw)  # nothing to publish
    manifest = run_generate(prompts, storage, settings(simulator.url))  # the fleet mended: asked again
    assert len(raw_answers(storage, manifest.raw_key)) == prompts.num_prompts
    assert not rejections(storage, manifest) and manifest.stats["generate"].dropped == 0


@pytest.mark.parametrize(
    "server_side,other,share,fails",
    [
        pytest.param(1, 0, 0.0, False, id="one-alone-never"),
        pytest.param(2, 0, 0.0, True, id="two-past-zero"),
        pytest.param(2, 0, 0.1, False, id="two-of-24-within-10pc"),
        pytest.param(3, 0, 0.1, True, id="three-of-24-past-10pc"),
        pytest.param(1, 20, 0.0, False, id="other-reasons-not-counted"),
    ],
)
def test_the_backstop_counts_server_side_rejections_only(
    server_side: int, other: int, share: float, fails: bool
) -> None:
    """The backstop is for a fleet at fault: one prompt a server refuses is that prompt's, kept with its reason."""
    done = Checkpoints()
    for i in range(server_side):
        done.rejected[f"s{i}"] = {"reason": "server_rejected", "detail": "too long", "endpoint": "http://gpu-1"}
    others = ["prompt_id_out_of_vocab", "sample_timeout", "count_mismatch", "server_aborted"]  # a sample's own
    for i in range(other):
        done.rejected[f"o{i}"] = {"reason": others[i % 4], "detail": "d", "endpoint": "http://gpu-1"}
    shard = ShardManifest(DatasetLocation("/data", "kimi-k2.5-mini", "D", "v1"), 0, "p", "sha", 24)
    if fails:
        with pytest.raises(TooManyServerRejections, match=r"http://gpu-1': " + str(server_side)):
            check_server_rejections(shard, 24, done, share)
    else:
        check_server_rejections(shard, 24, done, share)


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
