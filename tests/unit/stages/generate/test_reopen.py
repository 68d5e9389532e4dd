"""A finished shard reopened to ask its fleet losses again (checkpoints.reopen): the next try resumes from what the
shard finished, each earlier try counted once, however the try that finished it or the reopen itself was cut short."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgspec
import pytest

from regen.layout import DatasetLocation
from regen.manifest import GenerationReport, ShardManifest
from regen.reasons import Reason
from regen.records import RawAnswer, encode_answer, write_raw
from regen.stages.generate.checkpoints import load_checkpoints, rejection_line, reopen
from regen.storage import LocalStorage

TRY_0 = GenerationReport(100.0, 110.0, requests=5, answered=2, request_seconds=1.0, output_tokens=10)
ABORTED = {"id": "c", "stage": "generate", "reason": "server_aborted", "detail": "aborted"}


def finished_shard(tmp_path: Path, left_parts: bool) -> tuple[LocalStorage, ShardManifest]:
    """A shard whose one try answered a and b and lost c to the fleet, then wrote its generation counts, its
    rejections and its raw file: the shard is finished. `left_parts`: the try died removing its checkpoint parts."""
    storage = LocalStorage(tmp_path)
    shard = ShardManifest(DatasetLocation(str(tmp_path), "p", "d", "v1"), 0, "", "", 3)
    answers = [encode_answer(RawAnswer("a", [1], {})), encode_answer(RawAnswer("b", [2], {}))]
    if left_parts:
        counts = msgspec.json.encode({"try": 0, "generation": dataclasses.asdict(TRY_0)})
        lines = [*answers, rejection_line("c", Reason.SERVER_ABORTED, "aborted"), counts]
        storage.put_bytes(f"{shard.keys.checkpoints}part-00000.jsonl", b"".join(line + b"\n" for line in lines))
    combined = GenerationReport.combined([TRY_0])
    storage.put_bytes(shard.keys.generation, msgspec.json.encode(dataclasses.asdict(combined)))
    storage.put_bytes(shard.keys.rejected("generate"), msgspec.json.encode(ABORTED) + b"\n")
    raw = tmp_path / "raw.jsonl.zst"
    write_raw(raw, answers)
    storage.put_file(shard.keys.raw, raw)
    return storage, shard


def parts(storage: LocalStorage, shard: ShardManifest) -> list[str]:
    return [k.rsplit("/", 1)[1] for k in storage.list_keys(shard.keys.checkpoints) if k.endswith(".jsonl")]


def assert_resumes_with_each_try_once(storage: LocalStorage, shard: ShardManifest) -> None:
    assert not storage.exists(shard.keys.raw)  # no longer finished: the next try resumes
    found = load_checkpoints(storage, shard)
    assert sorted(found.answers) == ["a", "b"] and found.ask_again() == ["c"]
    counts = GenerationReport.combined(list(found.tries.values()))
    assert (counts.requests, counts.answered, counts.output_tokens) == (5, 2, 10)
    assert counts.request_seconds == pytest.approx(1.0)


@pytest.mark.parametrize("left_parts", [False, True], ids=["parts removed", "parts left by a dying try"])
def test_a_reopened_shard_counts_each_earlier_try_once(tmp_path: Path, left_parts: bool) -> None:
    storage, shard = finished_shard(tmp_path, left_parts)
    assert reopen(storage, shard)
    assert parts(storage, shard) == ["part-00001.jsonl" if left_parts else "part-00000.jsonl"]  # numbers go on
    assert_resumes_with_each_try_once(storage, shard)


def test_a_reopen_cut_short_before_the_raw_file_went_is_redone_whole(tmp_path: Path) -> None:
    storage, shard = finished_shard(tmp_path, left_parts=True)
    raw = storage.get_bytes(shard.keys.raw)
    assert reopen(storage, shard)
    storage.put_bytes(shard.keys.raw, raw)  # as if the reopen had died before removing it
    assert reopen(storage, shard)
    assert parts(storage, shard) == ["part-00002.jsonl"]
    assert_resumes_with_each_try_once(storage, shard)


def test_a_shard_without_fleet_losses_or_of_a_published_version_is_left_as_it_is(tmp_path: Path) -> None:
    storage, shard = finished_shard(tmp_path / "published", left_parts=True)
    storage.put_bytes(shard.location.manifest, b"{}")
    before = {k: storage.get_bytes(k) for k in storage.list_keys("")}
    assert not reopen(storage, shard)
    assert {k: storage.get_bytes(k) for k in storage.list_keys("")} == before

    storage, shard = finished_shard(tmp_path / "no losses", left_parts=False)
    storage.put_bytes(shard.keys.rejected("generate"), b'{"id": "c", "stage": "generate", "reason": "empty"}\n')
    assert not reopen(storage, shard)
    assert storage.exists(shard.keys.raw) and parts(storage, shard) == []


def test_a_record_already_read_stands_unless_it_is_a_rejection_a_later_try_asks_again(tmp_path: Path) -> None:
    """A later part repeats an id when it is a merge of earlier parts, or when a try asked again what an earlier one
    lost to the fleet: only then does its record replace the first."""
    storage = LocalStorage(tmp_path)
    shard = ShardManifest(DatasetLocation(str(tmp_path), "p", "d", "v1"), 0, "", "", 4)
    first = [
        encode_answer(RawAnswer("a", [1], {})),
        rejection_line("b", Reason.DIVERGED_TOOL_CALL, "a call the history does not hold"),
        rejection_line("c", Reason.SERVER_ABORTED, "aborted"),
        rejection_line("d#1", Reason.EARLIER_TURN_UNUSABLE, "d#0 unusable", ended_by={"turn": "d#0"}),
    ]
    later = [
        rejection_line("a", Reason.SERVER_REJECTED, "400"),
        encode_answer(RawAnswer("b", [2], {})),
        encode_answer(RawAnswer("c", [3], {})),
        encode_answer(RawAnswer("d#1", [4], {})),
    ]
    for number, lines in enumerate([first, later]):
        storage.put_bytes(f"{shard.keys.checkpoints}part-{number:05d}.jsonl", b"".join(line + b"\n" for line in lines))
    found = load_checkpoints(storage, shard)
    assert sorted(found.answers) == ["a", "c", "d#1"] and found.answers["a"] == first[0]
    assert list(found.rejected) == ["b"] and found.rejected["b"]["reason"] == "diverged_tool_call"
    assert found.next_part == 2
