from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from regen.chat import ChatRenderer
from regen.config import DatasetConfig, load_config
from regen.datasets.prepare import run_prepare
from regen.manifest import DatasetLocation
from regen.storage import LocalStorage


def prepare(tmp_path: Path, renderer: ChatRenderer, dataset: str, shard_size: int = 10, limit: int | None = None):
    config = load_config()
    storage = LocalStorage(tmp_path / "root")
    location = DatasetLocation(storage.root_uri, renderer.profile.name, dataset, "v1")
    prepared = run_prepare(config.dataset(dataset), location, storage, renderer, shard_size, limit, config.resolve)
    return prepared, storage


def test_sample_dataset_is_sharded_with_every_row_accounted_for(tmp_path: Path, renderer: ChatRenderer) -> None:
    prepared, storage = prepare(tmp_path, renderer, "B1_glaive")
    stats = prepared.stats
    assert stats.total == 40 and stats.kept == 36
    assert stats.dropped_by_reason == {"duplicate": 1, "malformed_json": 1, "no_user_turn": 1, "unknown_role": 1}
    assert prepared.duplicates == 1
    assert [s.num_prompts for s in prepared.shards] == [10, 10, 10, 6]
    rejected = storage.get_bytes("kimi-k2.5-mini/B1_glaive/v1/rejected/prepare.jsonl").decode().splitlines()
    assert sorted(json.loads(r)["reason"] for r in rejected) == sorted(stats.dropped_by_reason)
    ids = []
    for shard in prepared.shards:
        table = pq.read_table(storage.uri(shard.prompts_key))
        ids += table.column("id").to_pylist()
        for row in table.to_pylist():
            messages, tools = json.loads(row["messages"]), json.loads(row["tools"])
            assert row["prompt_ids"] == renderer.render_ids(messages, tools)
            assert messages[-1]["role"] != "assistant"
    assert len(ids) == len(set(ids)) == 36


def test_prepare_is_idempotent_for_a_version(tmp_path: Path, renderer: ChatRenderer) -> None:
    first, storage = prepare(tmp_path, renderer, "B2_opencodeinstruct", shard_size=20)
    shard_file = Path(storage.uri(first.shards[0].prompts_key))
    before = shard_file.stat().st_mtime_ns
    second, _ = prepare(tmp_path, renderer, "B2_opencodeinstruct", shard_size=20)
    assert second.to_dict() == first.to_dict()
    assert shard_file.stat().st_mtime_ns == before  # reused, not rewritten


def test_limit_counts_kept_prompts(tmp_path: Path, renderer: ChatRenderer) -> None:
    prepared, _ = prepare(tmp_path, renderer, "B2_opencodeinstruct", limit=7)
    assert prepared.stats.kept == 7 and sum(s.num_prompts for s in prepared.shards) == 7


def test_prompts_over_the_profile_limit_are_rejected(tmp_path: Path, renderer: ChatRenderer) -> None:
    source = tmp_path / "long.jsonl"
    rows = [{"input": "short question"}, {"input": "word " * 9000}]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    storage = LocalStorage(tmp_path / "root")
    location = DatasetLocation(storage.root_uri, renderer.profile.name, "long", "v1")
    config = DatasetConfig(paths=[str(source)], format="input_output")
    prepared = run_prepare(config, location, storage, renderer, 10, None)
    assert prepared.stats.kept == 1 and prepared.stats.dropped_by_reason == {"prompt_too_long": 1}
