"""Answers the fleet lost are the fleet's, never the data's (docs/guarantees.md): an answer refused, aborted or
miscounted on every attempt, and every later turn of the on-policy conversation it ended, count against
max_server_rejected_share of the dataset version's answers, over all of its shards. A version past it is never
published green: publish refuses it naming them, the run report names them with the Resume that asks them again, and
that Resume does. A conversation the data ends (an answer cut by max_new_tokens) is never the fleet's loss."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from regen.chat import ChatRenderer
from regen.config import DatasetConfig, Sampling
from regen.layout import DatasetLocation, run_report_key
from regen.manifest import PreparedDataset, ShardManifest
from regen.run_report import IncompleteRun, write_run_report
from regen.samples import sample_of, turn_id
from regen.sglang.client import answer_id_of
from regen.simulator.faults import abort_answer
from regen.stages.export import run_export
from regen.stages.generate.checkpoints import load_checkpoints
from regen.stages.generate.generate import GenerateSettings, TooManyServerRejections, run_generate
from regen.stages.prepare.prepare import run_prepare
from regen.stages.prepare.settings import PrepareSettings
from regen.stages.publish.publish import run_publish
from regen.stages.validate import run_validate
from regen.storage import LocalStorage, Storage
from tests.conftest import Simulator, prepare_sample, shard_prompt_ids
from tests.loopback import AppOnLoopback


class Meddler(AppOnLoopback):
    """A router in front of the simulator that, by answer id, aborts some answers on every attempt (a sick worker)
    and cuts others short (max_new_tokens lowered to 4: the answer ends `length`, as a long one would). Everything
    else is passed on as it is."""

    def __init__(self, target: str, aborted: Collection[str] = (), cut: Collection[str] = ()) -> None:
        super().__init__()
        self.target, self.aborted, self.cut = target, aborted, cut

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.path == "/generate":
            payload = json.loads(body)
            answer_id = answer_id_of(payload["rid"])  # the client's rid: answer id, nonce, attempt
            if answer_id in self.aborted:
                return web.json_response(abort_answer(payload["rid"], 0.0, 0.0))
            if answer_id in self.cut:
                payload["sampling_params"] = {**payload["sampling_params"], "max_new_tokens": 4}
                body = json.dumps(payload).encode()
        async with (
            aiohttp.ClientSession() as session,
            session.request(request.method, f"{self.target}{request.path_qs}", data=body) as answer,
        ):
            return web.Response(body=await answer.read(), status=answer.status, content_type=answer.content_type)


def settings(url: str) -> GenerateSettings:
    return GenerateSettings([url], Sampling().as_params(), concurrency=8, max_attempts=3, backoff_max_s=0.05)


def finish(shards: list[ShardManifest], storage: Storage, renderer: ChatRenderer, url: str) -> list[ShardManifest]:
    """Each shard through generate, validate and export, as the DAG's shard tasks run them."""
    generated = [run_generate(s, storage, settings(url), renderer) for s in shards]
    return [run_export(run_validate(s, storage, renderer), storage) for s in generated]


def rejections(storage: Storage, shard: ShardManifest) -> dict[str, dict[str, Any]]:
    key = shard.keys.rejected("generate")
    lines = storage.get_bytes(key).splitlines() if storage.exists(key) else []
    return {r["id"]: r for r in map(json.loads, lines)}


def ten_turn_chats(folder: Path, renderer: ChatRenderer) -> tuple[PreparedDataset, LocalStorage]:
    """10 conversations of 10 user turns each, prepared on-policy into one shard: 100 answers."""
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "chats.jsonl"
    rows = [
        {
            "id": f"chat-{c}",
            "conversations": [
                message
                for t in range(10)
                for message in (
                    {"from": "human", "value": f"Chat {c}, question {t}: how would you sort {c * 10 + t} numbers?"},
                    {"from": "gpt", "value": f"Reference {c}.{t}, off-policy."},
                )
            ],
        }
        for c in range(10)
    ]
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    storage = LocalStorage(folder / "root")
    location = DatasetLocation(storage.root_uri, renderer.profile.name, "chats", "v1")
    config = DatasetConfig(paths=[str(source)], turns="on_policy")
    prepared = run_prepare(config, location, storage, renderer, PrepareSettings(shard_size=10, workers=1))
    assert isinstance(prepared, PreparedDataset) and [s.num_answers for s in prepared.shards] == [100]
    return prepared, storage


def test_a_first_turn_the_fleet_aborts_loses_the_rest_of_its_conversation_to_the_fleet_too(
    tmp_path: Path, renderer: ChatRenderer, simulator: Simulator
) -> None:
    """The reproduction: the first turn of 2 of a shard's 10 ten-turn conversations is aborted on every attempt, and
    their 18 later turns are never asked. That is 20 of the version's 100 answers lost to the fleet, past 2%: red,
    not a green shard with a fifth of its answers gone. A mended fleet then answers all 100."""
    prepared, storage = ten_turn_chats(tmp_path, renderer)
    [shard] = prepared.shards
    doomed = sorted(shard_prompt_ids(storage, shard))[:2]
    with (
        Meddler(simulator.url, aborted={turn_id(c, 1) for c in doomed}) as router,
        pytest.raises(TooManyServerRejections) as failed,
    ):
        run_generate(shard, storage, settings(router.url), renderer)
    message = str(failed.value)
    assert "lost 20 of 100 answers" in message
    assert "'earlier_turn_unusable after server_aborted': 18" in message and "'server_aborted': 2" in message
    assert not storage.exists(shard.keys.raw)  # nothing to publish
    later = {i: r for i, r in load_checkpoints(storage, shard).rejected.items() if r["reason"] != "server_aborted"}
    assert set(later) == {turn_id(c, k) for c in doomed for k in range(2, 11)}
    ended_by = {i: {"turn": turn_id(sample_of(i), 1), "reason": "server_aborted"} for i in later}
    assert {i: r.get("ended_by") for i, r in later.items()} == ended_by  # the turn that ended it, and why
    mended = run_generate(shard, storage, settings(simulator.url), renderer)  # every lost turn asked again
    assert mended.stats["generate"].kept == 100


def three_shards_each_losing_one(
    folder: Path, renderer: ChatRenderer, simulator: Simulator
) -> tuple[PreparedDataset, LocalStorage, list[str]]:
    """24 prompts in shards of 8, the first of each aborted on every attempt: each shard alone keeps its one."""
    prepared, storage = prepare_sample(folder, renderer, "B2_opencodeinstruct", 8, limit=24)
    assert len(prepared.shards) == 3
    lost = sorted(min(shard_prompt_ids(storage, s)) for s in prepared.shards)
    with Meddler(simulator.url, aborted=set(lost)) as router:
        shards = finish(prepared.shards, storage, renderer, router.url)
    assert [s.stats["generate"].dropped_by_reason for s in shards] == [{"server_aborted": 1}] * 3
    return prepared, storage, lost


def test_the_share_is_the_dataset_versions_so_shards_each_losing_one_answer_are_not_published_green(
    tmp_path: Path, renderer: ChatRenderer, simulator: Simulator
) -> None:
    """One lost answer alone never fails a shard of 8 (though it is 12% of it), but 3 of the version's 24 are past
    its allowance (2% of 24, and one always): publish refuses the version, naming them. A Resume asks exactly them
    again, keeps the rest, and publishes it green."""
    prepared, storage, lost = three_shards_each_losing_one(tmp_path, renderer, simulator)
    location = prepared.location
    with pytest.raises(TooManyServerRejections) as failed:
        run_publish(prepared, storage, fleet=[], run_id="manual__v1")
    message = str(failed.value)
    assert "lost 3 of 24 answers" in message and all(sample_id in message for sample_id in lost)
    assert "airflow dags trigger eagle3_regen" in message
    assert not storage.exists(location.manifest)
    listed = [json.loads(line) for line in storage.get_bytes(location.fleet_losses).splitlines()]
    assert sorted(r["id"] for r in listed) == lost and {r["reason"] for r in listed} == {"server_aborted"}

    seen = len(simulator.records())
    finish(prepared.shards, storage, renderer, simulator.url)  # the Resume's shard tasks
    assert sorted({answer_id_of(r["rid"]) for r in simulator.records()[seen:]}) == lost  # only they were asked
    published = run_publish(prepared, storage, fleet=[], run_id="manual__v1")
    assert published["stages"]["generate"] == {"total": 24, "kept": 24, "dropped": 0, "dropped_by_reason": {}}
    assert "fleet_losses" not in published and not storage.exists(location.fleet_losses)


def test_a_conversation_the_data_ends_is_not_the_fleets_loss(
    tmp_path: Path, renderer: ChatRenderer, simulator: Simulator
) -> None:
    """Three conversations cut by max_new_tokens at their first turn end there (their 27 later turns unusable: the
    data's), and one loses its ninth turn to aborts (its ninth and tenth: the fleet's). 2 of 100 answers are the
    fleet's, within 2%: the version is published, naming those 2 and not the 27."""
    prepared, storage = ten_turn_chats(tmp_path, renderer)
    [shard] = prepared.shards
    chats = sorted(shard_prompt_ids(storage, shard))
    aborted, cut = {turn_id(chats[0], 9)}, {turn_id(c, 1) for c in chats[1:4]}
    with Meddler(simulator.url, aborted=aborted, cut=cut) as router:
        [done] = finish([shard], storage, renderer, router.url)
    rejected = rejections(storage, done)
    by_data = {i: r for i, r in rejected.items() if sample_of(i) in chats[1:4]}
    assert len(by_data) == 27 and all("cut by max_new_tokens" in r["detail"] for r in by_data.values())
    assert all(r.get("ended_by") == {"turn": turn_id(sample_of(i), 1)} for i, r in by_data.items())
    last = rejected[turn_id(chats[0], 10)]
    assert last.get("ended_by") == {"turn": turn_id(chats[0], 9), "reason": "server_aborted"}
    published = run_publish(prepared, storage, fleet=[], run_id="manual__v1")
    assert published.get("fleet_losses", {}).get("lost") == 2
    assert sorted(published["fleet_losses"]["ids"]) == [turn_id(chats[0], 10), turn_id(chats[0], 9)]


def test_the_run_report_names_the_lost_answers_and_the_resume_that_asks_them_again(
    tmp_path: Path, renderer: ChatRenderer, simulator: Simulator
) -> None:
    prepared, storage, lost = three_shards_each_losing_one(tmp_path, renderer, simulator)
    location = prepared.location
    with contextlib.suppress(TooManyServerRejections):  # refused (the test above)
        run_publish(prepared, storage, fleet=[], run_id="manual__v1")
    run = {"profile": location.profile, "version": location.version, "run_id": "manual__v1"}
    with pytest.raises(IncompleteRun) as incomplete:
        write_run_report(storage, run, [location.dataset], [], [], {})
    report = json.loads(storage.get_bytes(run_report_key(location.profile, location.version)))
    named = (report.get("fleet_losses") or [{}])[0]
    assert named.get("lost") == 3 and sorted(named["ids"]) == lost
    assert named["list"] == storage.uri(location.fleet_losses) and not named["published"]
    conf = json.dumps({"datasets": [location.dataset], "version": location.version})
    assert named["resume"] == f"airflow dags trigger eagle3_regen --conf '{conf}'"
    assert named["resume"] in str(incomplete.value) and report["resume"] == named["resume"]
