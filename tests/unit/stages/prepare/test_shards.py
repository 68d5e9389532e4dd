"""ShardWriter with the last version's answer lengths: the rows are dealt into shards longest first exactly as when
they were all held in memory (same shards, same order, same bytes), while its memory does not grow with the rows
and its spill file is gone however it ends."""

from __future__ import annotations

import json
import random
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from regen.config import DatasetConfig
from regen.layout import DatasetLocation
from regen.records import longest_first_order
from regen.samples import samples_of
from regen.stages.prepare.shards import PROMPT_SCHEMA, ShardWriter
from regen.storage import LocalStorage, Storage, write_table


def prompt(number: int, rng: random.Random) -> tuple[dict[str, Any], list[int]]:
    """A prompt row as tokenize_part hands it over, and its ids."""
    row = {
        "sample_id": f"p{number:05d}",
        "source_index": number,
        "source": "rows.jsonl",
        "messages": json.dumps([{"role": "user", "content": f"question {number} " * rng.randint(1, 30)}]),
        "tools": "[]",
        "meta": json.dumps({"n": number}),
        "later": None,
        "answers": 1,
    }
    return row, [rng.randrange(200_000) for _ in range(rng.randint(1, 300))]


def held_in_memory(
    storage: Storage, location: DatasetLocation, config: DatasetConfig, shard_size: int, first_shard: int, prompts: Any
) -> list[tuple[str, str, int]]:
    """The shards as ShardWriter wrote them before its rows were spilled: every row held, `longest_first_order`
    over them, `Table.from_pylist` of each shard's slice. (key, sha256, rows) a shard."""
    rows, lengths = [], prompts.lengths
    for row, ids in prompts.rows:
        shared = {name: row[name] for name in ("source_index", "source", "messages", "tools", "meta", "later")}
        array = np.asarray(ids, dtype=np.int32)
        for sample in samples_of(row["sample_id"], config.temperatures, config.samples_per_prompt):
            one = {"id": sample.id, **shared, "prompt_ids": array, "expected_tokens": lengths.get(sample.id)}
            rows.append({**one, "temperature": sample.temperature, "sampling_seed": sample.seed})
    rows = [rows[i] for i in longest_first_order([row["expected_tokens"] for row in rows])]
    shards = []
    for start in range(0, len(rows), shard_size):
        key = location.shard(first_shard + len(shards)).prompts
        table = pa.Table.from_pylist(rows[start : start + shard_size], schema=PROMPT_SCHEMA)
        shards.append((key, write_table(storage, key, table), len(rows[start : start + shard_size])))
    return shards


class Prompts:
    """Prompts and their samples' last answer lengths: ties, and samples with no length (new since then)."""

    def __init__(self, count: int, config: DatasetConfig, known: float, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.rows = [prompt(number, rng) for number in range(count)]
        samples = [
            s.id
            for row, _ in self.rows
            for s in samples_of(row["sample_id"], config.temperatures, config.samples_per_prompt)
        ]
        self.lengths = {s: rng.choice([5, 50, 50, 400, rng.randrange(2000)]) for s in samples if rng.random() < known}


@pytest.mark.parametrize(
    "options,known,shard_size,first_shard",
    [
        pytest.param({}, 1.0, 7, 0, id="every-length-known"),
        pytest.param({}, 0.6, 10, 3, id="some-new-prompts"),
        pytest.param({"samples_per_prompt": 2, "temperatures": [0.6, 1.0]}, 0.8, 9, 0, id="four-samples-a-prompt"),
        pytest.param({}, 1.0, 1000, 0, id="one-shard"),
    ],
)
def test_the_rows_are_dealt_as_when_they_were_held_in_memory(
    tmp_path: Path, options: dict[str, Any], known: float, shard_size: int, first_shard: int
) -> None:
    config = DatasetConfig(paths=["rows.jsonl"], **options)
    prompts = Prompts(60, config, known)
    storage = LocalStorage(tmp_path / "root")
    before = DatasetLocation(storage.root_uri, "profile", "held", "v1")
    now = DatasetLocation(storage.root_uri, "profile", "spilled", "v1")
    expected = held_in_memory(storage, before, config, shard_size, first_shard, prompts)

    (tmp_path / "spill").mkdir()
    with ShardWriter(now, storage, shard_size, config, first_shard, prompts.lengths, tmp_path / "spill") as writer:
        for row, ids in prompts.rows:
            writer.add(row, ids)
        writer.flush()
        writer.flush()  # a second flush (prepare's one-part path) writes nothing more

    written = [(s.prompts_key, s.prompts_sha256, s.num_prompts) for s in writer.shards]
    assert [(key.replace("/spilled/", "/held/"), digest, rows) for key, digest, rows in written] == expected
    assert [s.shard for s in writer.shards] == list(range(first_shard, first_shard + len(expected)))
    assert list((tmp_path / "spill").iterdir()) == []


def test_the_rows_waiting_to_be_dealt_are_not_held_in_memory(tmp_path: Path) -> None:
    """2,000 rows of 1,000-token prompts: held in memory they were 4 KB a row of ids alone (8 MB; with their
    messages, 8.7 KB a row in a real run). Spilled, the writer keeps 13 bytes a row, and its file's buffer (1 MB)."""
    config = DatasetConfig(paths=["rows.jsonl"])
    storage = LocalStorage(tmp_path / "root")
    location = DatasetLocation(storage.root_uri, "profile", "lengths", "v1")
    ids = list(range(1000, 2000))
    row, _ = prompt(0, random.Random(0))
    lengths = {f"p{number:05d}": number % 700 for number in range(2000)}
    held = []
    writer = ShardWriter(location, storage, 500, config, expected_tokens=lengths)
    tracemalloc.start()
    try:
        for number in range(2000):
            writer.add({**row, "sample_id": f"p{number:05d}", "source_index": number}, ids)
            if number in (499, 1999):
                held.append(tracemalloc.get_traced_memory()[0])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    writer.flush()
    assert (held[1] - held[0]) / 1500 < 64, held  # bytes a row
    assert peak < 2_000_000, peak
    assert [s.num_prompts for s in writer.shards] == [500] * 4


def test_the_spill_file_is_removed_when_preparing_fails(tmp_path: Path) -> None:
    config = DatasetConfig(paths=["rows.jsonl"])
    storage = LocalStorage(tmp_path / "root")
    location = DatasetLocation(storage.root_uri, "profile", "lengths", "v1")
    rng = random.Random(0)
    with (
        pytest.raises(RuntimeError, match="the tokenizer died"),
        ShardWriter(location, storage, 5, config, expected_tokens={"p00000": 3}, directory=tmp_path) as writer,
    ):
        for number in range(20):
            writer.add(*prompt(number, rng))
        assert [path.suffixes for path in tmp_path.iterdir() if path.is_file()] == [[".msgpack", ".zst"]]
        raise RuntimeError("the tokenizer died")
    assert [path for path in tmp_path.iterdir() if path.is_file()] == [] and writer.shards == []
