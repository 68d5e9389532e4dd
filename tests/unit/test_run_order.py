"""A run of several datasets lists its shard tasks in one order, the longest work prepare expects first, whatever
dataset it is in: the scheduler starts a mapped task's instances by map index, so no dataset's long work starts after
another's short work and ends the run alone. Only the order changes: every shard once, the same groups."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from regen import pipeline
from regen.stages.generate.drain_model import Settings, deal, drain, drain_shards, run_order
from regen.stages.generate.order import longest_work_first


def test_unknown_work_counts_as_the_median_and_equal_work_keeps_its_order() -> None:
    assert longest_work_first([5, None, 9, 5, 1]) == [2, 0, 1, 3, 4]  # known 1, 5, 5, 9: the median is 5
    assert longest_work_first([None, 1, None, 3]) == [0, 2, 3, 1]  # known 1, 3: the median is 3, ties in order
    assert longest_work_first([None, None]) == [0, 1] and longest_work_first([]) == []


def words(n: int) -> str:
    return " ".join(["word"] * n)


@pytest.fixture
def deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Four datasets of one night: short answers, long answers, on-policy conversations (a row's work is its turns'
    answers together) and prompts with no answer (nothing known of their work)."""
    chat = [
        {"messages": [m for k in range(1 + i % 4) for m in (
            {"role": "user", "content": f"Chat {i}, question {k}?"},
            {"role": "assistant", "content": words((i * 13 + k * 7) % 30 + 1)},
        )]}
        for i in range(12)
    ]  # fmt: skip
    sources = {
        "short": [{"input": f"Short {i}?", "output": words(i % 5 + 1)} for i in range(10)],
        "long": [{"input": f"Long {i}?", "output": words((i * 37) % 90 + 10)} for i in range(14)],
        "chats": chat,
        "plain": [{"input": f"Plain {i}?", "output": ""} for i in range(6)],
    }
    for name, rows in sources.items():
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    formats = {"short": "input_output", "long": "input_output", "chats": "openai_messages", "plain": "input_output"}
    config = {
        "defaults": {"storage_root": str(tmp_path / "storage"), "shard_size": 4, "tokenize_workers": 1},
        "governance": {"allowed_endpoints": ["127.0.0.1"]},
        "datasets": {
            name: {"format": formats[name], "paths": [str(tmp_path / f"{name}.jsonl")]}
            | ({"turns": "on_policy"} if name == "chats" else {})
            for name in sources
        },
    }
    (tmp_path / "regen.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("REGEN_CONFIG", str(tmp_path / "regen.yaml"))
    return tmp_path


def prepared_run(**params: Any) -> tuple[pipeline.RunSpec, list[dict[str, Any]]]:
    run = pipeline.RunSpec(**pipeline.plan({"endpoints": ["http://127.0.0.1:9"], **params}, "night"))
    return run, pipeline.finish_prepared(run, [pipeline.prepare_dataset(run, name) for name in run.datasets])


def longest_in_prompts(run: pipeline.RunSpec, group: dict[str, Any], root: Path) -> int | None:
    """A group's longest expected work, read from its shards' prompt files (not from the manifests' field)."""
    known = [
        n
        for shard in pipeline.group_shards(run, group)
        for n in pq.read_table(root / shard["prompts_key"])["expected_tokens"].to_pylist()
        if n is not None
    ]
    return max(known, default=None)


def test_the_shard_tasks_of_every_dataset_run_longest_expected_work_first(deployment: Path) -> None:
    run, prepared = prepared_run()
    listed = pipeline.run_groups(run, prepared)
    per_dataset = pipeline.shard_groups(prepared, run.shard_task_limit)
    assert sorted(map(json.dumps, listed)) == sorted(map(json.dumps, per_dataset))  # the same groups, each once
    assert len({g["dataset"] for g in listed}) == 4 and len(listed) > 8
    works = [longest_in_prompts(run, group, deployment / "storage") for group in listed]
    known = sorted(w for w in works if w is not None)
    assert works.count(None) == 2 and len(known) == len(works) - 2  # the plain prompts: nothing known
    median = known[len(known) // 2]
    ranked = [median if w is None else w for w in works]
    assert ranked == sorted(ranked, reverse=True)  # the longest first, the unknown where the median is
    assert [g["dataset"] for g in listed] != [g["dataset"] for g in per_dataset]  # across datasets, not after
    chats = next(g for g in listed if g["dataset"] == "chats" and g["first"] == 0)
    assert listed.index(chats) < max(listed.index(g) for g in listed if g["dataset"] == "long")  # interleaved
    for dataset in ("short", "long", "chats"):  # a dataset's own shards keep prepare's order, its longest first
        firsts = [g["first"] for g in listed if g["dataset"] == dataset]
        assert firsts == sorted(firsts)


def test_the_source_order_and_a_record_without_lengths_list_the_datasets_one_after_another(
    deployment: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = yaml.safe_load((deployment / "regen.yaml").read_text())
    source_order = {**config, "defaults": {**config["defaults"], "longest_first": False}}
    (deployment / "regen.yaml").write_text(yaml.safe_dump(source_order))
    run, prepared = prepared_run(version="source-order")
    assert pipeline.run_groups(run, prepared) == pipeline.shard_groups(prepared, run.shard_task_limit)
    (deployment / "regen.yaml").write_text(yaml.safe_dump(config))
    run, prepared = prepared_run()
    for summary in prepared:  # as an older release recorded them: no shard's longest work
        key = deployment / "storage" / run.location(summary["dataset"]).prepared
        record = json.loads(key.read_text())
        for shard in record["shards"]:
            del shard["longest_expected"]
        key.write_text(json.dumps(record))
    assert pipeline.run_groups(run, prepared) == pipeline.shard_groups(prepared, run.shard_task_limit)
    (deployment / "storage" / run.location("long").prepared).write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="regen.hints"):
        assert pipeline.run_groups(run, prepared) == pipeline.shard_groups(prepared, run.shard_task_limit)
    assert "the run's order of shard tasks across datasets" in caplog.text and "dataset after dataset" in caplog.text


def test_the_drain_model_takes_the_runs_order_across_datasets() -> None:
    """A dataset of short answers listed first, a long chain in the second, two shard tasks of 8 requests each.
    Dataset after dataset, the chain starts once the short work is done (4 shards of 2 waves of 0.45 s, 2 at a
    time: 1.8 s) and ends the run alone; in the run's order it starts first, and the short work runs beside it."""
    short, chain = [[(100, 100)]] * 64, [[(1000, 1000)] * 6]  # 0.45 s an answer; 6 turns of 4.5 s
    settings = Settings(shard_size=16, shard_tasks=2, in_flight=16, slots=16, task_gap_s=0.0)
    dealt = deal(short, settings) + deal(chain, settings)
    assert run_order(dealt, settings) == [dealt[-1], *dealt[:-1]]
    assert drain_shards(dealt, settings)["window_s"] == pytest.approx(1.8 + 27.0, abs=0.01)
    assert drain([short, chain], settings)["window_s"] == pytest.approx(27.0, abs=0.01)
    source = Settings(shard_size=16, shard_tasks=2, in_flight=16, slots=16, task_gap_s=0.0, longest_first=False)
    assert run_order(dealt, source) == dealt
