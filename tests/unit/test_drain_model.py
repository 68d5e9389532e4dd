"""The drain model (regen.stages.generate.drain_model) on runs small enough to work out by hand: what it says of a run
is what the run report and bench_drain.py set beside the run measured, so its arithmetic must be right where it can be
checked."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from drain_model import conversations

from regen.layout import VERDICTS_SUFFIX, DatasetLocation
from regen.samples import turn_id
from regen.stages.generate.drain_model import Settings, drain, run_figures, run_model, version_shards
from regen.storage import LocalStorage

MS = 1.0  # a token a millisecond: an answer of 1,000 tokens takes a second


def test_one_conversation_on_one_slot_keeps_it_busy_for_its_turns_in_sequence() -> None:
    run = drain([[[(1, 1000), (1, 2000)]]], Settings(shard_size=1, shard_tasks=1, in_flight=1, slots=1, decode_ms=MS))
    assert run == {"utilization": 1.0, "window_s": 3.0}


def test_a_task_s_share_caps_what_it_sends_and_the_next_shard_waits_for_its_pool_slot() -> None:
    rows = [[(1, 1000)]] * 4
    one_at_a_time = Settings(shard_size=2, shard_tasks=1, in_flight=1, slots=2, decode_ms=MS, task_gap_s=0.5)
    # a share of 1: four answers in turn, a half-second gap between the two shards, one of the two slots busy
    assert drain([rows], one_at_a_time) == {"utilization": pytest.approx(4 / (2 * 4.5), abs=1e-4), "window_s": 4.5}
    both = Settings(shard_size=2, shard_tasks=1, in_flight=2, slots=2, decode_ms=MS, task_gap_s=0.5)
    assert drain([rows], both) == {"utilization": pytest.approx(4 / (2 * 2.5), abs=1e-4), "window_s": 2.5}


def test_chain_priority_admits_the_conversation_with_the_most_work_left_first() -> None:
    # Two slots, all sent at once: a chain of two 4-second turns, then three 3-second answers predicted short.
    # t=0 the chain's first turn and one answer run; at 3 the second answer; at 4 the chain's second turn arrives
    # behind the third answer. By arrival it waits for a slot until 6 and ends at 10; by priority (4,000 tokens
    # left, level 4, against a predicted 100, level 0) it takes the slot at 4 and ends at 8, the third answer at 9.
    rows = [[(4000, 4000), (4000, 4000)], [(100, 3000)], [(100, 3000)], [(100, 3000)]]
    by_arrival = Settings(shard_size=4, shard_tasks=1, in_flight=4, slots=2, decode_ms=MS)
    assert drain([rows], by_arrival) == {"utilization": pytest.approx(17 / 20, abs=1e-4), "window_s": 10.0}
    by_priority = Settings(shard_size=4, shard_tasks=1, in_flight=4, slots=2, chain_priority=True, decode_ms=MS)
    assert drain([rows], by_priority) == {"utilization": pytest.approx(17 / 18, abs=1e-4), "window_s": 9.0}


def test_the_bench_s_conversations_are_seeded_and_capped() -> None:
    rows = conversations(140)
    assert rows == conversations(140) and len(rows) == 140
    assert sum(len(r) for r in rows) == 620  # the turns docs/benchmarks.md counts
    assert all(1 <= len(r) <= 8 and all(2 <= answer <= 6000 for _, answer in r) for r in rows)


def write_verdicts(storage: LocalStorage, location: DatasetLocation, shard: int, rows: list[tuple]) -> None:
    """A shard's verdicts as validate writes them, but for the columns the model reads: (id, output_len, expected)."""
    ids, lengths, expected = (list(column) for column in zip(*rows, strict=True))
    table = pa.table({"id": ids, "output_len": lengths, "expected_tokens": pa.array(expected, pa.int32())})
    path = storage.root / "verdicts.parquet"
    pq.write_table(table, path)
    storage.put_file(f"{location.prefix}/reports/shard-{shard:05d}{VERDICTS_SUFFIX}", path)


def test_a_run_s_figures_from_its_versions_verdicts(tmp_path: Path) -> None:
    """One task, one slot, an answer token a millisecond (the run's own time per token): shard 0 is a conversation of
    two turns (1 s, then 2 s), shard 1 a row of 0.5 s with no expected length; the next shard starts 3 s after."""
    storage = LocalStorage(tmp_path)
    location = DatasetLocation(storage.root_uri, "p", "chats", "v1")
    write_verdicts(storage, location, 1, [("b", 500, None)])
    write_verdicts(storage, location, 0, [(turn_id("a", 2), 2000, 2000), (turn_id("a", 1), 1000, 1000)])
    assert version_shards(storage, location) == [[[(1000, 1000), (2000, 2000)]], [[(None, 500)]]]

    run = {"datasets": ["chats"], "profile": "p", "concurrency": 1, "shard_tasks": 1}
    measured = {"utilization": 0.4, "slots": 1, "output_tokens": 3500, "request_seconds": 3.5, "server_side": None}
    figures = run_figures(storage, run, [{"dataset": "chats", "version": "v1", "generation": [{}]}], measured)
    assert figures["with_answer_lengths"] == pytest.approx(3.5 / 6.5, abs=1e-4) and figures["window_s"] == 6.5
    # Predicted, b counts as the median of the lengths known (2,000 of 1,000 and 2,000): 5 s busy in 8.
    assert figures["predicted"] == pytest.approx(5 / 8, abs=1e-4)
    assert (figures["answers"], figures["predicted_answers"], figures["settings"]["decode_ms"]) == (3, 2, 1.0)
    # The servers' own busy time sets the time a token where they said it: 2 ms, the task's gap weighs less.
    server_side = {**measured, "server_side": 0.5, "window_s": 14.0}
    assert run_model(run, server_side, version_shards(storage, location))["with_answer_lengths"] == pytest.approx(
        7 / 10, abs=1e-4
    )


def test_a_run_with_nothing_to_model_says_why() -> None:
    run = {"datasets": [], "profile": "p", "concurrency": 1, "shard_tasks": 1}
    assert "reason" in run_model(run, {"slots": None, "output_tokens": 0}, [])


def test_a_run_past_the_answers_the_report_models_gets_a_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from regen.stages.generate import drain_model

    monkeypatch.setattr(drain_model, "MAX_ANSWERS", 2)
    run = {"datasets": ["d"], "profile": "p", "concurrency": 1, "shard_tasks": 1}
    published = [{"dataset": "d", "version": "v1", "generation": [{}], "stages": {"generate": {"kept": 3}}}]
    assert run_figures(LocalStorage(tmp_path), run, published, {"slots": 1}) == {
        "reason": "3 answers: more than the 2 the model works out in the report task"
    }
