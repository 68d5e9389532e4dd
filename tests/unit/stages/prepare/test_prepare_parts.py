"""A dataset prepared in parts (one reader, several tokenizing tasks) gives what one task gives: the same prompts in
the same order, the same counts and rejections, dedupe exact across the parts."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from regen.chat import ChatRenderer
from regen.config import DatasetConfig, load_config
from regen.layout import DatasetLocation
from regen.manifest import PreparedDataset
from regen.stages.prepare.prepare import (
    PartsNotPrepared,
    PreparedParts,
    PrepareSettings,
    finish_parts,
    prepare_part,
    run_prepare,
)
from regen.storage import LocalStorage, Storage


def rows_of(storage: Storage, prepared: PreparedDataset) -> list[dict[str, Any]]:
    return [row for s in prepared.shards for row in pq.read_table(storage.uri(s.prompts_key)).to_pylist()]


def rejected(storage: Storage, prepared: PreparedDataset) -> list[dict[str, Any]]:
    keys = [key for key in prepared.files if "/rejected/" in key]
    return sorted(
        (json.loads(line) for key in keys for line in storage.get_bytes(key).decode().splitlines()),
        key=lambda r: (r["source_index"], r["reason"]),
    )


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    """Repeats of every sample dataset's rows (duplicates across parts, bad lines still bad), plus prompts too long
    to keep, spread through the file: what the index drops and what only tokenizing rejects."""
    config = load_config()
    lines = []
    for name in ("B1_glaive", "B2_opencodeinstruct"):
        lines += Path(config.resolve(f"../data/samples/{name}.jsonl")).read_text().splitlines()
    lines = [line for _ in range(3) for line in lines]
    for i in range(0, len(lines), 40):
        lines.insert(i, json.dumps({"input": f"too long {i} " + "word " * 9000}))
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def prepare_whole_and_in_parts(
    tmp_path: Path, renderer: ChatRenderer, config: DatasetConfig, shard_size: int, part_prompts: int
) -> tuple[Storage, PreparedDataset, PreparedDataset, PreparedParts]:
    storage = LocalStorage(tmp_path / "root")
    whole_at = DatasetLocation(storage.root_uri, renderer.profile.name, "whole", "v1")
    parts_at = DatasetLocation(storage.root_uri, renderer.profile.name, "parts", "v1")
    whole = run_prepare(
        config, whole_at, storage, renderer, PrepareSettings(shard_size=shard_size, limit=None, workers=1)
    )
    parts = run_prepare(
        config,
        parts_at,
        storage,
        renderer,
        PrepareSettings(shard_size=shard_size, limit=None, workers=1, part_prompts=part_prompts),
    )
    assert isinstance(whole, PreparedDataset) and isinstance(parts, PreparedParts)
    for part in range(parts.parts):
        prepare_part(config, parts_at, storage, renderer, part, workers=1)
    return storage, whole, finish_parts(config, parts_at, storage), parts


@pytest.mark.parametrize(
    "options,part_prompts,shards_per_part",
    [
        pytest.param({}, 20, 2, id="one-sample"),
        pytest.param({"samples_per_prompt": 3}, 20, 2, id="three-samples-span-shards"),  # 6 prompts, 18 rows a part
    ],
)
def test_parts_give_the_prompts_counts_and_rejections_of_one_task(
    tmp_path: Path,
    renderer: ChatRenderer,
    mixed: Path,
    options: dict[str, Any],
    part_prompts: int,
    shards_per_part: int,
) -> None:
    config = DatasetConfig(paths=[str(mixed)], **options)
    storage, whole, in_parts, parts = prepare_whole_and_in_parts(tmp_path, renderer, config, 10, part_prompts)
    assert parts.parts > 3
    assert in_parts.stats == whole.stats and in_parts.stats.dropped_by_reason["prompt_too_long"] == 7
    assert (in_parts.duplicates, in_parts.rows_read) == (whole.duplicates, whole.rows_read)
    assert in_parts.duplicates > 50  # repeats of the first copy are found in later parts: dedupe is across parts
    assert rows_of(storage, in_parts) == rows_of(storage, whole)
    assert [r | {"id": None} for r in rejected(storage, in_parts)] == [
        r | {"id": None} for r in rejected(storage, whole)
    ]
    # Each part's shards are numbered from part x shards_per_part: known before any part was tokenized.
    # (a part whose prompts were all rejected leaves a gap in the numbers: nothing else may assume none)
    by_part: dict[int, list[int]] = {}
    for shard in in_parts.shards:
        by_part.setdefault(shard.shard // shards_per_part, []).append(shard.shard)
    assert set(by_part) <= set(range(parts.parts)) and len(by_part) >= parts.parts - 1
    assert all(
        numbers == list(range(p * shards_per_part, p * shards_per_part + len(numbers)))
        for p, numbers in by_part.items()
    )
    assert all(s.prompts_key.endswith(f"{s.name}.parquet") for s in in_parts.shards)
    assert storage.list_keys(f"{in_parts.location.prefix}/prompts/parts/") == []  # the parts are gone once finished
    record = json.loads(storage.get_bytes(in_parts.location.prepared))
    assert PreparedDataset.from_dict(record) == in_parts


def test_an_on_policy_dataset_in_parts_counts_the_same_turns(tmp_path: Path, renderer: ChatRenderer) -> None:
    config = load_config()
    source = config.dataset("C1_multiturn")
    paths = [config.resolve(p) for p in source.paths or []]
    storage, whole, in_parts, _ = prepare_whole_and_in_parts(
        tmp_path, renderer, source.model_copy(update={"paths": paths}), 4, 8
    )
    assert [s.num_answers for s in in_parts.shards] == [s.num_answers for s in whole.shards]
    assert rows_of(storage, in_parts) == rows_of(storage, whole)


def test_parts_are_retried_alone_and_finish_waits_for_every_one(
    tmp_path: Path, renderer: ChatRenderer, mixed: Path
) -> None:
    storage = LocalStorage(tmp_path / "root")
    config = DatasetConfig(paths=[str(mixed)])
    location = DatasetLocation(storage.root_uri, renderer.profile.name, "d", "v1")
    parts = run_prepare(
        config, location, storage, renderer, PrepareSettings(shard_size=10, limit=None, workers=1, part_prompts=20)
    )
    assert isinstance(parts, PreparedParts)
    index = Path(storage.uri(location.prepare_index))
    written = index.stat().st_mtime_ns
    assert (
        run_prepare(
            config, location, storage, renderer, PrepareSettings(shard_size=10, limit=None, workers=1, part_prompts=20)
        )
        == parts
    )
    assert index.stat().st_mtime_ns == written  # a retried reader reuses its parts, it does not read again

    first = prepare_part(config, location, storage, renderer, 0, workers=1)
    shard = Path(storage.uri(first["shards"][0]["prompts_key"]))
    before = shard.stat().st_mtime_ns
    assert prepare_part(config, location, storage, renderer, 0, workers=1) == first
    assert shard.stat().st_mtime_ns == before  # a retried part returns its record, nothing tokenized again
    assert parts.parts > 2
    with pytest.raises(PartsNotPrepared, match=re.escape(f"parts {list(range(1, parts.parts))} of {parts.parts}")):
        finish_parts(config, location, storage)
    for part in range(1, parts.parts):
        prepare_part(config, location, storage, renderer, part, workers=1)
    finished = finish_parts(config, location, storage)
    read_and_dropped = finished.stats.dropped - finished.stats.dropped_by_reason["prompt_too_long"]
    assert finished.stats.total == parts.prompts + read_and_dropped  # what the reader passed on, and what it dropped
    again = run_prepare(
        config, location, storage, renderer, PrepareSettings(shard_size=10, limit=None, workers=1, part_prompts=20)
    )
    assert again == finished == finish_parts(config, location, storage)


def test_a_limit_or_a_dataset_of_one_part_is_prepared_in_one_task(
    tmp_path: Path, renderer: ChatRenderer, mixed: Path
) -> None:
    storage = LocalStorage(tmp_path / "root")
    config = DatasetConfig(paths=[str(mixed)])
    at = [DatasetLocation(storage.root_uri, renderer.profile.name, name, "v1") for name in ("limited", "one", "two")]
    limited = run_prepare(
        config, at[0], storage, renderer, PrepareSettings(shard_size=10, limit=30, workers=1, part_prompts=20)
    )
    one_part = run_prepare(
        config, at[1], storage, renderer, PrepareSettings(shard_size=10, limit=None, workers=1, part_prompts=10**6)
    )
    whole = run_prepare(config, at[2], storage, renderer, PrepareSettings(shard_size=10, limit=None, workers=1))
    assert isinstance(limited, PreparedDataset) and limited.stats.kept == 30
    assert isinstance(one_part, PreparedDataset) and one_part.stats == whole.stats  # type: ignore[union-attr]
    assert rows_of(storage, one_part) == rows_of(storage, whole)  # type: ignore[arg-type]
    assert storage.list_keys(f"{one_part.location.prefix}/prompts/parts/") == []
