"""Generation is durable: checkpointed answers survive, a rerun requests only what is missing, no duplicates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from regen.chat import ChatRenderer
from regen.config import Sampling
from regen.stages.generate import generate
from regen.stages.generate.checkpoints import load_checkpoints
from regen.stages.generate.generate import GenerateSettings, run_generate
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
    parts = [k for k in storage.list_keys(location.shard(0).checkpoints) if "/part-" in k]
    # Flushed as they finished, not at the end: a part once 5 answers were in it, whatever the machine's load.
    assert len(parts) >= 2
    assert not storage.exists(shard.keys.raw)

    # ... and lost its last checkpoint too.
    storage.delete(parts[-1])
    found = load_checkpoints(storage, shard)
    survived = found.answers
    [first_try] = found.tries.values()
    assert first_try.answered == len(survived)  # the try's counts as of its last surviving part
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
    # The report counts both tries: the first up to its last surviving checkpoint, the second whole.
    assert second.generation is not None and second.generation.tries == 2
    assert second.generation.answered == 48 and second.generation.requests >= 48
    assert storage.list_keys(location.shard(0).checkpoints) == []  # the raw file replaced the checkpoints


def test_a_finished_shard_is_not_generated_again(tmp_path: Path, renderer: ChatRenderer, simulator: Simulator) -> None:
    prepared, storage = prepare_sample(tmp_path, renderer, "B1_glaive", 8, limit=8)
    settings = GenerateSettings([simulator.url], Sampling().as_params(), concurrency=8)
    run_generate(prepared.shards[0], storage, settings)
    before = len(simulator.records())
    again = run_generate(prepared.shards[0], storage, settings)
    assert len(simulator.records()) == before
    assert again.stats["generate"].total == 8


def test_answers_are_flushed_within_the_interval_even_when_no_more_arrive(tmp_path: Path) -> None:
    """A lull (every request left in flight is a long one) must not hold finished answers back."""
    import asyncio
    import time

    from regen.layout import DatasetLocation
    from regen.manifest import GenerationReport, ShardManifest
    from regen.stages.generate.checkpoints import MERGE_AFTER, Checkpointer
    from regen.storage import LocalStorage

    storage = LocalStorage(tmp_path)
    shard = ShardManifest(DatasetLocation(str(tmp_path), "p", "d", "v1"), 0, "", "", 100)
    counts = GenerationReport(time.time(), time.time(), requests=1, answered=1, request_seconds=0.1, output_tokens=5)

    async def scenario() -> tuple[list[str], list[str]]:
        checkpointer = Checkpointer(storage, shard, next_part=7, every=1000, seconds=0.02)
        flusher = checkpointer.start(lambda: counts)
        checkpointer.add(b'{"id": "a", "output_ids": [1]}')
        for _ in range(1000):  # nothing else arrives (1000 records would wake it): only the interval flushes it
            if checkpointer.flushed:
                break
            await asyncio.sleep(0.01)
        after_lull = storage.list_keys("p/d/v1/raw/shard-00000/")
        for n in range(MERGE_AFTER + 3):  # one part each (the next waits for it): enough parts for a merge
            checkpointer.add(answer_line(f"s{n}"))
            while checkpointer.flushed < n + 2:  # a loaded machine may take longer than the interval
                await asyncio.sleep(0.005)
        merged = storage.list_keys("p/d/v1/raw/shard-00000/")
        checkpointer.stop()
        await flusher
        return after_lull, merged

    after_lull, merged = asyncio.run(scenario())
    assert after_lull == ["p/d/v1/raw/shard-00000/part-00007.jsonl"]
    assert len(merged) < MERGE_AFTER  # the try's small parts were merged into one
    found = load_checkpoints(storage, shard)
    assert set(found.answers) == {"a", *(f"s{n}" for n in range(MERGE_AFTER + 3))}
    assert found.tries == {7: counts} and found.next_part > 7 + MERGE_AFTER


def test_parts_are_whole_parts_of_every_records_however_answers_and_writes_are_timed(tmp_path: Path) -> None:
    """Answers that arrive in bursts while a slow write is under way, or one at a time: the same parts (the crash
    points name a try's parts by their number, so a replay must write the ones the traced run wrote)."""
    import asyncio
    import random
    import time

    from regen.layout import DatasetLocation
    from regen.manifest import GenerationReport, ShardManifest
    from regen.stages.generate.checkpoints import Checkpointer
    from regen.storage import LocalStorage

    class SlowStorage(LocalStorage):
        def put_bytes(self, key: str, data: bytes) -> None:
            time.sleep(delays.uniform(0, 0.03))
            super().put_bytes(key, data)

    counts = GenerationReport(time.time(), time.time(), requests=1, answered=1, request_seconds=0.1, output_tokens=5)

    def parts(seed: int) -> list[list[str]]:
        root = tmp_path / str(seed)
        storage = SlowStorage(root)
        shard = ShardManifest(DatasetLocation(str(root), "p", "d", "v1"), 0, "", "", 100)
        arrivals = random.Random(seed)

        async def scenario() -> None:
            checkpointer = Checkpointer(storage, shard, next_part=0, every=3, seconds=60)
            flusher = checkpointer.start(lambda: counts)
            for n in range(11):
                checkpointer.add(answer_line(f"s{n}"))
                await asyncio.sleep(arrivals.choice([0, 0, 0.001, 0.02]))
            checkpointer.stop()
            await flusher

        asyncio.run(scenario())
        found = []
        for key in storage.list_keys("p/d/v1/raw/shard-00000/"):
            if key.endswith(".jsonl"):
                lines = [json.loads(line) for line in storage.get_bytes(key).splitlines()]
                found.append([line["id"] for line in lines if "id" in line])
        return found

    delays = random.Random(0)
    expected = [["s0", "s1", "s2"], ["s3", "s4", "s5"], ["s6", "s7", "s8"], ["s9", "s10"]]
    assert [parts(seed) for seed in range(6)] == [expected] * 6


def answer_line(sample_id: str) -> bytes:
    return json.dumps({"id": sample_id, "output_ids": [1, 2]}).encode()


def test_a_prompt_id_outside_the_vocabulary_is_rejected_and_never_sent(
    tmp_path: Path, renderer: ChatRenderer, simulator: Simulator
) -> None:
    """One such id kills an SGLang 0.5.23 server (no range check): a corrupted prompt file must not take the fleet
    down. The bound is the vocabulary of the tokenizer the prompts were prepared with (prompts/prepare.json)."""
    import dataclasses

    import pyarrow as pa

    from regen.storage import read_table, write_table

    prepared, storage = prepare_sample(tmp_path, renderer, "B1_glaive", 8, limit=8)
    shard = prepared.shards[0]
    table = read_table(storage, shard.prompts_key)
    rows = table.to_pylist()
    rows[3]["prompt_ids"] = [*rows[3]["prompt_ids"][:5], renderer.roles.vocab_size, *rows[3]["prompt_ids"][5:]]
    corrupted_id = rows[3]["id"]
    digest = write_table(storage, shard.prompts_key, pa.Table.from_pylist(rows, schema=table.schema))
    shard = dataclasses.replace(shard, prompts_sha256=digest)
    before = {r["rid"] for r in simulator.records()}

    done = run_generate(shard, storage, GenerateSettings([simulator.url], Sampling().as_params(), concurrency=4))
    sent = [r for r in simulator.records() if r["rid"] not in before]
    assert len(sent) == 7 and all(max(r["input_ids"]) < renderer.roles.vocab_size for r in sent)
    stats = done.stats["generate"]
    assert stats.kept == 7 and stats.dropped_by_reason == {"prompt_id_out_of_vocab": 1}
    [line] = storage.get_bytes(shard.keys.rejected("generate")).decode().splitlines()
    rejection = json.loads(line)
    assert rejection["id"] == corrupted_id and rejection["reason"] == "prompt_id_out_of_vocab"
    assert "prompt id 163840 is outside the vocabulary of 163840 ids" in rejection["detail"]


def test_a_try_owns_its_files_a_dead_tries_rejections_and_checkpoints_are_not_published(
    tmp_path: Path, renderer: ChatRenderer, simulator: Simulator
) -> None:
    """A try that uploaded rejections and died before the raw file: the next try answers those samples, and the
    stale rejections must go, or a later try (the raw file there) lists them beside the answers. A try that died
    removing its checkpoint parts leaves them to the next, which removes them: no version lists them."""
    prepared, storage = prepare_sample(tmp_path, renderer, "B2_opencodeinstruct", 6)
    shard = prepared.shards[0]
    stale = b'{"id": "x", "stage": "generate", "reason": "server_aborted", "detail": "a dead try"}\n'
    storage.put_bytes(shard.keys.rejected("generate"), stale)
    settings = GenerateSettings([simulator.url], Sampling().as_params(), concurrency=2)
    generated = run_generate(shard, storage, settings)
    assert generated.stats["generate"].dropped == 0
    assert not storage.exists(shard.keys.rejected("generate"))  # answered now: the dead try's file is gone
    leftover = f"{shard.keys.checkpoints}part-00009.jsonl"
    storage.put_bytes(leftover, b"")  # a try that died removing its parts
    again = run_generate(shard, storage, settings)  # the raw file there: summarized, not generated
    assert storage.list_keys(shard.keys.checkpoints) == []
    assert again.files == generated.files and shard.keys.rejected("generate") not in again.files
