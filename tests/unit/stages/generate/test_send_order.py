"""The order a shard's samples are sent in: the longest answers of the dataset's last version first."""

from __future__ import annotations

import pyarrow as pa

from regen.records import ShardPrompts


def shard(expected: list[int | None] | None) -> ShardPrompts:
    columns = {"id": [f"s{i}" for i in range(5)], "prompt_ids": [[1, 2]] * 5}
    if expected is not None:
        columns["expected_tokens"] = expected
    return ShardPrompts(pa.table(columns))


def test_the_longest_go_first_and_an_unknown_one_where_the_median_would() -> None:
    prompts = shard([10, None, 300, 40, 300])
    # known: 10, 40, 300, 300 -> median 300 (the upper middle): s1 is taken as a 300, and equals keep their order
    assert prompts.longest_expected_first(["s0", "s1", "s2", "s3", "s4"]) == ["s1", "s2", "s4", "s3", "s0"]
    assert prompts.longest_expected_first(["s3", "s0"]) == ["s3", "s0"]  # a resumed shard: what is left, in order


def test_a_first_version_keeps_the_shards_order() -> None:
    todo = ["s4", "s0", "s2"]
    assert shard(None).longest_expected_first(todo) == todo  # prompts prepared before the column existed
    assert shard([None] * 5).longest_expected_first(todo) == todo
