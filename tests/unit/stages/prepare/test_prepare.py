from __future__ import annotations

import gzip
import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from regen.chat import ChatRenderer
from regen.config import DatasetConfig, HubDataset, load_config
from regen.layout import DatasetLocation
from regen.manifest import PreparedDataset
from regen.stages.prepare.prepare import PrepareSettings, run_prepare
from regen.storage import LocalStorage, Storage
from tests.conftest import prepare_sample


def prepare(tmp_path: Path, renderer: ChatRenderer, dataset: str, shard_size: int = 10, limit: int | None = None):
    return prepare_sample(tmp_path / "root", renderer, dataset, shard_size, limit)


def prepare_config(
    tmp_path: Path,
    renderer: ChatRenderer,
    config: DatasetConfig,
    name: str = "d",
    limit: int | None = None,
    **kwargs: Any,
) -> tuple[PreparedDataset, Storage]:
    storage = LocalStorage(tmp_path / "root")
    location = DatasetLocation(storage.root_uri, renderer.profile.name, name, "v1")
    options = {"workers": 1, **kwargs}
    resolve = lambda p: p if "://" in p else str(tmp_path / p)  # noqa: E731  (as RegenConfig.resolve does)
    return run_prepare(config, location, storage, renderer, PrepareSettings(10, limit, resolve, **options)), storage


def shard_rows(storage: Storage, prepared: PreparedDataset) -> list[dict[str, Any]]:
    return [row for s in prepared.shards for row in pq.read_table(storage.uri(s.prompts_key)).to_pylist()]


def write_jsonl(path: Path, rows: list[Any]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_sample_dataset_is_sharded_with_every_row_accounted_for(tmp_path: Path, renderer: ChatRenderer) -> None:
    prepared, storage = prepare(tmp_path, renderer, "B1_glaive")
    stats = prepared.stats
    assert stats.total == 40 and stats.kept == 36
    assert stats.dropped_by_reason == {"duplicate": 1, "malformed_json": 1, "no_user_turn": 1, "unknown_role": 1}
    assert prepared.duplicates == 1
    assert [s.num_prompts for s in prepared.shards] == [10, 10, 10, 6]
    rejected = storage.get_bytes("kimi-k2.5-mini/B1_glaive/v1/rejected/prepare.jsonl").decode().splitlines()
    assert sorted(json.loads(r)["reason"] for r in rejected) == sorted(stats.dropped_by_reason)
    rows = shard_rows(storage, prepared)
    for row in rows:
        messages, tools = json.loads(row["messages"]), json.loads(row["tools"])
        assert row["prompt_ids"] == renderer.render_ids(messages, tools)
        assert messages[-1]["role"] != "assistant"
    assert len(rows) == len({r["id"] for r in rows}) == 36
    results = [m for row in rows for m in json.loads(row["messages"]) if m["role"] == "tool"]
    assert results and all(m["tool_call_id"].startswith("functions.") for m in results)
    assert not any("name" in m for m in results)  # as given: the sample's tool results carry no name
    manifest = json.loads(storage.get_bytes(prepared.location.prepared))
    assert manifest["rows_read"] == 40 and manifest["turns"] == "final"


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
    write_jsonl(tmp_path / "long.jsonl", [{"input": "short question"}, {"input": "word " * 9000}])
    prepared, _ = prepare_config(tmp_path, renderer, DatasetConfig(paths=["long.jsonl"], format="input_output"))
    assert prepared.stats.kept == 1 and prepared.stats.dropped_by_reason == {"prompt_too_long": 1}


def test_every_assistant_turn_makes_one_sample_per_turn(tmp_path: Path, renderer: ChatRenderer) -> None:
    conversation = [
        {"from": "human", "value": "What is 2+2?"},
        {"from": "gpt", "value": "4"},
        {"from": "human", "value": "And 3+3?"},
        {"from": "gpt", "value": "6"},
    ]
    rows = [{"conversations": conversation}, {"conversations": conversation[:2]}, {"conversations": [{"from": "x"}]}]
    write_jsonl(tmp_path / "chat.jsonl", rows)
    config = DatasetConfig(paths=["chat.jsonl"], turns="every_assistant_turn")
    prepared, storage = prepare_config(tmp_path, renderer, config)
    # Row 0 gives two prompts, row 1 repeats row 0's first, row 2 gives none: 4 candidates from 3 rows.
    assert prepared.stats.to_dict() == {
        "total": 4,
        "kept": 2,
        "dropped": 2,
        "dropped_by_reason": {"duplicate": 1, "unknown_role": 1},
    }
    assert [len(json.loads(r["messages"])) for r in shard_rows(storage, prepared)] == [1, 3]
    assert json.loads(storage.get_bytes(prepared.location.prepared))["rows_read"] == 3


def test_sample_ids_do_not_depend_on_file_order(tmp_path: Path, renderer: ChatRenderer) -> None:
    write_jsonl(tmp_path / "a.jsonl", [{"prompt": "one"}, {"prompt": "two"}])
    write_jsonl(tmp_path / "b.jsonl", [{"prompt": "two"}, {"prompt": "three"}])
    forward, storage = prepare_config(tmp_path, renderer, DatasetConfig(paths=["a.jsonl", "b.jsonl"]), "fwd")
    backward, _ = prepare_config(tmp_path, renderer, DatasetConfig(paths=["b.jsonl", "a.jsonl"]), "bwd")
    assert forward.duplicates == backward.duplicates == 1
    assert {r["id"] for r in shard_rows(storage, forward)} == {r["id"] for r in shard_rows(storage, backward)}


def test_a_hugging_face_dataset_saved_to_disk_is_prepared(tmp_path: Path, renderer: ChatRenderer) -> None:
    import datasets

    rows = [
        {
            "system": "SYSTEM: You are a helpful assistant, with no access to external functions.",
            "chat": f"USER: Question {i}?\n\n\nASSISTANT: Answer {i}. <|endoftext|>\n",
        }
        for i in range(3)
    ]
    datasets.Dataset.from_list([*rows, {"system": "", "chat": "garbled"}]).save_to_disk(str(tmp_path / "glaive"))
    config = DatasetConfig(hf=HubDataset(path="glaive"), format="glaive")
    prepared, storage = prepare_config(tmp_path, renderer, config)
    assert prepared.stats.kept == 3 and prepared.stats.dropped_by_reason == {"bad_messages": 1}
    assert shard_rows(storage, prepared)[0]["source"] == "glaive[train]:row 1"


def test_an_s3_source_is_prepared(tmp_path: Path, renderer: ChatRenderer, s3_client: Any) -> None:
    bucket = f"prep-{uuid.uuid4().hex[:8]}"
    s3_client.create_bucket(Bucket=bucket)
    for part in range(2):
        body = gzip.compress("".join(json.dumps({"input": f"task {part}-{i}"}) + "\n" for i in range(3)).encode())
        s3_client.put_object(Bucket=bucket, Key=f"oci/part-{part}.jsonl.gz", Body=body)
    config = DatasetConfig(paths=[f"s3://{bucket}/oci/*.jsonl.gz"])
    prepared, _ = prepare_config(tmp_path, renderer, config, s3_client=lambda: s3_client)
    assert prepared.stats.kept == 6


@pytest.mark.parametrize("workers", [pytest.param(2, id="two-workers")])
def test_parallel_tokenization_gives_the_same_shards_as_one_process(
    tmp_path: Path, renderer: ChatRenderer, workers: int, caplog: pytest.LogCaptureFixture
) -> None:
    source = Path(load_config().resolve("../data/samples/B1_glaive.jsonl")).read_text().splitlines()
    rows = [line for _ in range(4) for line in source]  # 160 rows: repeats become duplicates, bad lines stay bad
    rows += [json.dumps({"input": f"extra task {i}"}) for i in range(1000)]  # enough to start workers
    (tmp_path / "mixed.jsonl").write_text("\n".join(rows) + "\n")
    config = DatasetConfig(paths=["mixed.jsonl"])
    one, storage = prepare_config(tmp_path, renderer, config, "one")
    with caplog.at_level(logging.INFO, logger="regen.stages.prepare.tokenize"):
        many, _ = prepare_config(tmp_path, renderer, config, "many", workers=workers)
    assert f"tokenizing with {workers} worker processes" in caplog.text
    assert many.stats == one.stats and many.stats.kept == 1036
    assert shard_rows(storage, many) == shard_rows(storage, one)
    rejected = [storage.get_bytes(p.location.prepare_rejections) for p in (one, many)]
    assert rejected[0] == rejected[1]


def test_limit_with_workers_stops_early_and_keeps_input_order(tmp_path: Path, renderer: ChatRenderer) -> None:
    write_jsonl(tmp_path / "many.jsonl", [{"input": f"task {i}"} for i in range(2000)])
    prepared, storage = prepare_config(tmp_path, renderer, DatasetConfig(paths=["many.jsonl"]), workers=2, limit=25)
    assert prepared.stats.to_dict()["total"] == prepared.stats.kept == 25
    assert [r["source_index"] for r in shard_rows(storage, prepared)] == list(range(25))
