"""Generation is durable: checkpointed answers survive, a rerun requests only what is missing, no duplicates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from regen import generate
from regen.chat import ChatRenderer
from regen.config import Sampling
from regen.generate import GenerateSettings, load_checkpoints, run_generate
from tests.conftest import Simulator, prepare_sample, raw_answers


def crash(*args: object) -> None:
    raise SystemExit("killed")


def test_rerun_after_a_crash_requests_only_the_missing_samples(
    tmp_path: Path, renderer: ChatRenderer, simulator: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepared, storage = prepare_sample(tmp_path, renderer, "B2_opencodeinstruct", 100)
    location, shard = prepared.location, prepared.shards[0]
    settings = GenerateSettings([simulator.url], Sampling().as_params(), concurrency=4, checkpoint_every=5)
    with monkeypatch.context() as patched:  # the task dies before the raw file is written
        patched.setattr(generate, "_write_raw", crash)
        with pytest.raises(SystemExit):
            run_generate(shard, storage, settings)
    parts = storage.list_keys(location.key("raw", "shard-00000/"))
    assert len(parts) >= 48 // 5
    assert not storage.exists(shard.key("raw", ".jsonl.zst"))

    # ... and lost its last three checkpoints too.
    for key in parts[-3:]:
        storage.delete(key)
    survived = load_checkpoints(storage, shard).answers
    requests_before = len(simulator.records())

    second = run_generate(shard, storage, settings)
    assert len(simulator.records()) - requests_before == 48 - len(survived)
    records = raw_answers(storage, second.raw_key)
    assert len(records) == len({r["id"] for r in records}) == 48
    by_id = {r["id"]: r for r in records}
    assert all(
        by_id[i]["rid"] == json.loads(line)["rid"] for i, line in survived.items()
    )  # finished answers were not redone
    assert second.stats["generate"].kept == 48
    assert storage.list_keys(location.key("raw", "shard-00000/")) == []  # the raw file replaced the checkpoints


def test_a_finished_shard_is_not_generated_again(tmp_path: Path, renderer: ChatRenderer, simulator: Simulator) -> None:
    prepared, storage = prepare_sample(tmp_path, renderer, "B1_glaive", 8, limit=8)
    settings = GenerateSettings([simulator.url], Sampling().as_params(), concurrency=8)
    run_generate(prepared.shards[0], storage, settings)
    before = len(simulator.records())
    again = run_generate(prepared.shards[0], storage, settings)
    assert len(simulator.records()) == before
    assert again.stats["generate"].total == 8
