"""Storage going down mid-generate, for real: moto's S3 behind the fault proxy (tools/s3_fault_proxy.py), which
answers every request 503 while `down`. An outage shorter than the bound costs nothing: every answer is kept, none
asked twice. Storage that stays down fails the task within seconds, and the retry asks only for what did not land.

Then the checkpointer on its own, on local disk with storage's faults played by a stand-in, timed against its bound
(outage_s): an outage or a slow write inside it costs nothing, a hung write or storage gone for good fails the try at
about the bound; the parts' numbers, the tries' counts, merging, and a reopened shard's part beside the next try's."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import msgspec
import pytest
import tenacity

from regen.chat import ChatRenderer
from regen.config import Sampling
from regen.layout import DatasetLocation
from regen.manifest import GenerationReport, ShardManifest
from regen.reasons import Reason
from regen.records import RawAnswer, encode_answer, write_raw
from regen.stages.generate import checkpoints
from regen.stages.generate.checkpoints import (
    REOPENED,
    Checkpointer,
    Checkpoints,
    CheckpointsUnwritable,
    load_checkpoints,
    rejection_line,
    reopen,
)
from regen.stages.generate.generate import GenerateSettings, run_generate
from regen.storage import LocalStorage, S3Storage, Storage
from tests.conftest import Simulator, prepare_sample, raw_answers, start_simulator
from tools.devstack import free_port, moto_client
from tools.s3_fault_proxy import FaultProxy, run_in_thread

SAMPLES = 48  # B2_opencodeinstruct keeps 48 prompts
ATTEMPTS = 2  # botocore's: it gives up fast, and the outage reaches the checkpointer


@pytest.fixture
def proxy(s3_endpoint: str) -> Iterator[tuple[FaultProxy, str]]:
    port = free_port()
    proxy, stop = run_in_thread(s3_endpoint, port, fault_rate=0.0)
    yield proxy, f"http://127.0.0.1:{port}"
    stop()


@pytest.fixture
def shard(
    tmp_path: Path, renderer: ChatRenderer, s3_endpoint: str, proxy: tuple[FaultProxy, str]
) -> tuple[S3Storage, S3Storage, ShardManifest]:
    """One prepared shard on S3: storage through the proxy (what generate uses), and straight to moto."""
    bucket = f"outage-{tmp_path.name.lower().replace('_', '-')}"[:60]
    moto_client(s3_endpoint, ATTEMPTS).create_bucket(Bucket=bucket)
    prepared, local = prepare_sample(tmp_path / "root", renderer, "B2_opencodeinstruct", 100)
    direct = S3Storage(bucket, "runs", moto_client(s3_endpoint, ATTEMPTS))
    for key in local.list_keys(""):
        direct.put_bytes(key, local.get_bytes(key))
    return S3Storage(bucket, "runs", moto_client(proxy[1], ATTEMPTS)), direct, prepared.shards[0]


@pytest.fixture
def slow_sim(tmp_path: Path) -> Iterator[Simulator]:
    sim = start_simulator(tmp_path, "--decode-ms-per-token", "3")  # a few seconds of answers: time for an outage
    yield sim
    sim.stop()


def settings(url: str, outage_s: float) -> GenerateSettings:
    return GenerateSettings(
        [url], Sampling().as_params(), concurrency=4, checkpoint_every=4, checkpoint_s=0.2, checkpoint_outage_s=outage_s
    )


def outage_after_parts(proxy: FaultProxy, direct: S3Storage, shard: ShardManifest, lasts_s: float | None) -> list:
    """Storage goes down once two parts have landed, for `lasts_s` (None: for good); returns [when it went down]."""
    began: list[float] = []

    def run() -> None:
        deadline = time.monotonic() + 60
        while len(direct.list_keys(shard.keys.checkpoints)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        proxy.down = True
        began.append(time.monotonic())
        if lasts_s is not None:
            time.sleep(lasts_s)
            proxy.down = False

    threading.Thread(target=run, daemon=True).start()
    return began


def test_an_outage_shorter_than_the_bound_loses_nothing_and_asks_nothing_twice(
    shard: tuple[S3Storage, S3Storage, ShardManifest],
    proxy: tuple[FaultProxy, str],
    slow_sim: Simulator,
    caplog: pytest.LogCaptureFixture,
) -> None:
    storage, direct, prompts = shard
    outage_after_parts(proxy[0], direct, prompts, lasts_s=2.0)
    with caplog.at_level(logging.WARNING, logger="regen.stages.generate.checkpoints"):
        manifest = run_generate(prompts, storage, settings(slow_sim.url, outage_s=20.0))
    assert proxy[0].injected["outage"] > 0
    assert "checkpoint part not written" in caplog.text  # a part was due while storage was down, and was kept
    records = raw_answers(direct, manifest.raw_key)
    assert len(records) == len({r["id"] for r in records}) == SAMPLES
    sent = slow_sim.records()
    assert len(sent) == SAMPLES  # no answer lost and asked again
    assert {r["rid"] for r in records} == {r["rid"] for r in sent}
    assert direct.list_keys(prompts.keys.checkpoints) == []


def test_storage_down_for_good_fails_the_task_in_seconds_and_the_retry_redoes_only_what_did_not_land(
    shard: tuple[S3Storage, S3Storage, ShardManifest], proxy: tuple[FaultProxy, str], slow_sim: Simulator
) -> None:
    storage, direct, prompts = shard
    began = outage_after_parts(proxy[0], direct, prompts, lasts_s=None)
    with pytest.raises(CheckpointsUnwritable, match=r"storage took no checkpoint for 1.5 s .*wait in memory"):
        run_generate(prompts, storage, settings(slow_sim.url, outage_s=1.5))
    failed_after = time.monotonic() - began[0]
    assert failed_after < 10, failed_after  # the bound, tried once more on the way out, and botocore's last try

    proxy[0].down = False
    time.sleep(1.0)  # requests the failed try left in flight are answered and dropped by the server
    landed = load_checkpoints(direct, prompts).answers
    assert 0 < len(landed) < SAMPLES
    before = len(slow_sim.records())
    manifest = run_generate(prompts, storage, settings(slow_sim.url, outage_s=20.0))
    assert len(slow_sim.records()) - before == SAMPLES - len(landed)  # only what did not land is asked again
    records = raw_answers(direct, manifest.raw_key)
    assert len(records) == len({r["id"] for r in records}) == SAMPLES
    by_id = {r["id"]: r for r in records}
    assert all(by_id[i]["rid"] == json.loads(line)["rid"] for i, line in landed.items())


# The checkpointer on its own, on local disk, storage's faults played by a stand-in: fast, and timed to the bound.

DATASET = "spare-part-kits"  # holds "part-" too: a part's number is read from the end of its key
WITHIN = 30.0  # seconds any wait of these tests may take (a hang, not a slow machine)
T = TypeVar("T")
REAL_SLEEP = asyncio.sleep


class Faulty(LocalStorage):
    """Local storage whose every put first goes through `fault(key)`, which may sleep, raise or hang; deleting the
    file named `undeletable` fails."""

    def __init__(self, root: Path, fault: Callable[[str], None] = lambda key: None) -> None:
        super().__init__(root)
        self.fault = fault
        self.puts: list[str] = []  # every put asked, in order, with the keys' folders left out
        self.undeletable: str | None = None

    def put_bytes(self, key: str, data: bytes) -> str:
        self.puts.append(key.rsplit("/", 1)[1])
        self.fault(key)
        return super().put_bytes(key, data)

    def delete(self, key: str) -> None:
        if key.rsplit("/", 1)[1] == self.undeletable:
            raise OSError("storage down")
        super().delete(key)


def down(key: str) -> None:
    raise OSError("storage down")


async def within(awaitable: Awaitable[T], seconds: float = WITHIN) -> T:
    """What a checkpointer that never ends (a mutant's, say) fails the test with, rather than hanging it."""
    return await asyncio.wait_for(awaitable, seconds)


def local_shard(tmp_path: Path, fault: Callable[[str], None] = lambda key: None) -> tuple[Faulty, ShardManifest]:
    storage = Faulty(tmp_path, fault)
    return storage, ShardManifest(DatasetLocation(str(tmp_path), "p", DATASET, "v1"), 0, "", "", 8)


def answer(sample_id: str) -> bytes:
    return encode_answer(RawAnswer(sample_id, [1, 2], {}))


def checkpointer(storage: Storage, shard: ShardManifest, next_part: int = 0, **options: Any) -> Checkpointer:
    """A try's checkpointer: parts of 2 records (`every`), an interval longer than any test (`seconds`)."""
    return Checkpointer(storage, shard, next_part, **{"every": 2, "seconds": 60.0, **options})


def started(checkpointer: Checkpointer, progress: bool = False) -> asyncio.Task[None]:
    """The flusher, with the try's counts as its records arrive: a request and a second per record, from the try's
    first part's number on (so each try's counts tell apart); `progress`: {"flushed": n} after each part."""
    start = float(checkpointer.part)

    def counts() -> GenerationReport:
        taken = checkpointer.flushed + checkpointer.waiting
        return GenerationReport(
            start, start + taken, requests=taken, answered=taken, request_seconds=0.0, output_tokens=0
        )

    return checkpointer.start(counts, (lambda flushed: {"flushed": flushed}) if progress else None)


def write_try(storage: Storage, shard: ShardManifest, next_part: int, records: list[bytes], **options: Any) -> None:
    """A try whose records all arrive before its flusher first runs, then finished: parts of 2 in arrival order."""

    async def run() -> None:
        writer = checkpointer(storage, shard, next_part, **options)
        flusher = started(writer, progress=True)
        for record in records:
            writer.add(record)
        await within(writer.finish(flusher))

    asyncio.run(run())


def parts(storage: Storage, shard: ShardManifest) -> dict[str, list[str]]:
    """Each part's records: the ids, then "try N" for its counts' line."""
    found = {}
    for key in storage.list_keys(shard.keys.checkpoints):
        if key.endswith(".jsonl"):
            lines = [json.loads(line) for line in storage.get_bytes(key).splitlines()]
            found[key.rsplit("/", 1)[1]] = [f"try {r['try']}" if "try" in r else r["id"] for r in lines]
    return found


def test_a_storage_outage_shorter_than_the_bound_is_ridden_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    began: list[float] = []  # storage goes down at the first put, for 0.25 s

    def down_for_a_while(key: str) -> None:
        began[:] = began or [time.monotonic()]
        if time.monotonic() < began[0] + 0.25:
            raise OSError("storage down")

    storage, shard = local_shard(tmp_path, down_for_a_while)
    with caplog.at_level(logging.WARNING, logger="regen.stages.generate.checkpoints"):
        write_try(storage, shard, 0, [answer("a"), answer("b")], outage_s=0.6)
    assert parts(storage, shard) == {"part-00000.jsonl": ["a", "b", "try 0"]}
    assert storage.puts.count("part-00000.jsonl") > 1  # failed, retried, landed
    assert "checkpoint part not written (OSError: storage down); retrying" in caplog.text


def test_a_slow_write_is_waited_for_not_cut_short(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Over a second (a large part on a slow link), half the bound: the one try has the bound to land in."""
    storage, shard = local_shard(tmp_path, lambda key: time.sleep(1.25) if key.endswith(".jsonl") else None)
    with caplog.at_level(logging.WARNING, logger="regen.stages.generate.checkpoints"):
        write_try(storage, shard, 0, [answer("a"), answer("b")], outage_s=2.5)
    assert storage.puts == ["part-00000.jsonl", "progress.json"]  # each once: the first try landed
    assert "retrying" not in caplog.text


def test_a_write_that_hangs_is_cut_off_at_the_bound(tmp_path: Path) -> None:
    released = threading.Event()
    storage, shard = local_shard(tmp_path, lambda key: released.wait(60))

    async def run() -> float:
        writer = checkpointer(storage, shard, outage_s=0.3)
        flusher = started(writer)
        writer.add(answer("a"))
        writer.add(answer("b"))
        began = time.monotonic()
        try:
            with pytest.raises(CheckpointsUnwritable, match=r"for 0.3 s .*TimeoutError.*; 2 answers and rejections"):
                await within(flusher, 30.0)  # a try never cut off would hang the flusher for good
            return time.monotonic() - began
        finally:
            released.set()  # the hung thread ends: asyncio.run waits for it

    took = asyncio.run(run())
    assert 0.3 <= took < 10, took  # (the upper bound loose: a loaded machine is slow, a hang is a minute)
    # One try, cut off at the bound; tenacity times the bound from just after it began, so a last short try may
    # follow. A try cut off sooner would leave time for more.
    assert storage.puts in (["part-00000.jsonl"], ["part-00000.jsonl"] * 2), storage.puts


def test_storage_down_for_good_fails_after_the_bound_naming_what_waits_in_memory(tmp_path: Path) -> None:
    storage, shard = local_shard(tmp_path, down)

    async def run() -> tuple[float, str]:
        writer = checkpointer(storage, shard, every=3, outage_s=0.5)
        flusher = started(writer)
        for record in [answer("a"), answer("b"), answer("c")]:  # a part closed
            writer.add(record)
        writer.add(answer("d"))  # and a record of the next
        began = time.monotonic()
        with pytest.raises(CheckpointsUnwritable) as failed:
            await within(flusher)
        return time.monotonic() - began, str(failed.value)

    took, message = asyncio.run(run())
    assert 0.5 <= took < 10, took
    assert re.fullmatch(
        r"storage took no checkpoint for 0.5 s \(.*/part-00000.jsonl: OSError: storage down\); "
        r"4 answers and rejections wait in memory",
        message,
    ), message
    assert 3 <= storage.puts.count("part-00000.jsonl") <= 20  # retried, with waits between the tries


class Clock:
    """Simulated time for the checkpointer and tenacity, which moves only when tenacity waits between tries."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await REAL_SLEEP(0)


class Inline(concurrent.futures.ThreadPoolExecutor):
    """Runs what asyncio.to_thread hands it at once, in the event loop's thread: a try's put is made as the try
    begins, however loaded the machine."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as e:
            future.set_exception(e)
        return future


@pytest.mark.parametrize(
    ("outage_s", "tries_at"),
    [
        (0.8, [0, 0.1, 0.3, 0.5, 0.7, 0.9]),
        (None, [0, 0.1, 0.3, 0.7, 1.5, 3.1, 6.3, 11.3, 16.3, 21.3, 26.3, 31.3]),
    ],
    ids=["a short bound: waits of a quarter of it at most", "the default bound: waits of 5 s at most"],
)
def test_a_part_is_tried_on_its_schedule_up_to_the_bound_and_once_past_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outage_s: float | None, tries_at: list[float]
) -> None:
    """Storage down for good, on a simulated clock (no wall clock: the same on a loaded machine), every wait between
    tries its longest: the waits double from 0.1 s up to a quarter of the bound (5 s at most), and the try that
    begins past the bound is still made (a try is cut off at what is left of the bound, but never given less than
    0.05 s)."""
    clock = Clock()
    monkeypatch.setattr(checkpoints, "time", clock)
    monkeypatch.setattr(tenacity, "time", clock)  # stop_after_delay's
    monkeypatch.setattr(asyncio, "sleep", clock.sleep)  # tenacity's waits
    monkeypatch.setattr(tenacity.wait, "random", SimpleNamespace(uniform=lambda low, high: high))
    tried: list[float] = []
    cut_off_at: list[float] = []  # each try's time limit, as the checkpointer gives it to the put's thread
    real_wait_for = asyncio.wait_for

    async def timed(awaitable: Awaitable[T], timeout: float | None) -> T:
        if getattr(awaitable, "__name__", "") == "to_thread":
            assert timeout is not None
            cut_off_at.append(timeout)
        return await real_wait_for(awaitable, timeout)

    monkeypatch.setattr(asyncio, "wait_for", timed)

    def down_since_1000(key: str) -> None:
        tried.append(clock.now - 1000.0)
        down(key)

    storage, shard = local_shard(tmp_path, down_since_1000)

    async def run() -> str:
        asyncio.get_running_loop().set_default_executor(Inline())
        writer = checkpointer(storage, shard, **({} if outage_s is None else {"outage_s": outage_s}))
        flusher = started(writer)
        writer.add(answer("a"))
        writer.add(answer("b"))
        with pytest.raises(CheckpointsUnwritable) as failed:
            await within(flusher)
        return str(failed.value)

    message = asyncio.run(run())
    assert tried == pytest.approx(tries_at)
    bound = outage_s or 30
    assert cut_off_at == pytest.approx([max(bound - at, 0.05) for at in tries_at])
    assert message.startswith(f"storage took no checkpoint for {bound:g} s (")


def test_what_storage_takes_back_on_the_way_out_lands_and_the_task_still_fails(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    outage = threading.Event()
    outage.set()
    storage, shard = local_shard(tmp_path, lambda key: down(key) if outage.is_set() else None)

    async def run() -> None:
        writer = checkpointer(storage, shard, outage_s=0.2)
        flusher = started(writer)
        writer.add(answer("a"))
        writer.add(answer("b"))
        await asyncio.wait([flusher], timeout=WITHIN)  # failed: storage stays down past the bound
        writer.add(answer("c"))
        outage.clear()
        await within(writer.finish(flusher))

    with caplog.at_level(logging.WARNING), pytest.raises(CheckpointsUnwritable):
        asyncio.run(run())  # a retry resumes from what landed
    # Under the next numbers: the part's first key may yet land (a PUT that timed out); a resume reads it once.
    assert parts(storage, shard) == {"part-00001.jsonl": ["a", "b", "try 0"], "part-00002.jsonl": ["c", "try 0"]}
    assert "writing the answers waiting once more before the task fails" in caplog.text
    assert "could not be checkpointed" not in caplog.text


def test_storage_still_down_on_the_way_out_names_what_a_retry_asks_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage, shard = local_shard(tmp_path, down)

    async def run() -> None:
        writer = checkpointer(storage, shard, outage_s=0.2)
        flusher = started(writer)
        for record in [answer("a"), answer("b"), rejection_line("c", Reason.PROMPT_ID_OUT_OF_VOCAB, "")]:
            writer.add(record)
        await within(writer.finish(flusher))

    with caplog.at_level(logging.WARNING), pytest.raises(CheckpointsUnwritable, match="3 answers and rejections"):
        asyncio.run(run())
    assert "3 answers and rejections could not be checkpointed" in caplog.text
    assert parts(storage, shard) == {}


def test_fewer_records_than_a_part_leave_once_the_interval_passes(tmp_path: Path) -> None:
    storage, shard = local_shard(tmp_path)

    async def run() -> None:
        writer = checkpointer(storage, shard, every=100, seconds=0.1)
        flusher = started(writer)
        writer.add(answer("a"))
        await asyncio.sleep(0.4)
        assert parts(storage, shard) == {"part-00000.jsonl": ["a", "try 0"]}  # not waiting for 99 more
        await within(writer.finish(flusher))

    asyncio.run(run())
    assert list(parts(storage, shard)) == ["part-00000.jsonl"]


def test_counts_and_part_numbers_go_on_across_tries(tmp_path: Path) -> None:
    storage, shard = local_shard(tmp_path)
    assert load_checkpoints(storage, shard) == Checkpoints()  # nothing yet: the first try's first part is 0

    aborted = rejection_line("c", Reason.SERVER_ABORTED, "")  # the fleet's: the next try asks it again
    unusable = rejection_line("h", Reason.EARLIER_TURN_UNUSABLE, "")  # a turn the fleet's rejection spoilt: asked again
    own = rejection_line("d", Reason.PROMPT_ID_OUT_OF_VOCAB, "")  # the sample's own: not asked again
    write_try(storage, shard, 0, [answer("a"), aborted, own, unusable])
    assert parts(storage, shard) == {"part-00000.jsonl": ["a", "c", "try 0"], "part-00001.jsonl": ["d", "h", "try 0"]}
    assert msgspec.json.decode(storage.get_bytes(shard.keys.progress)) == {"flushed": 4}  # after the last part
    first = load_checkpoints(storage, shard)
    assert (first.next_part, sorted(first.answers), sorted(first.rejected)) == (2, ["a"], ["c", "d", "h"])
    assert len(first) == 4
    assert {t: report.requests for t, report in first.tries.items()} == {0: 4}  # the try's last part has its counts
    assert "a" in first and "c" in first and "e" not in first

    write_try(storage, shard, 2, [answer("c"), answer("h"), answer("e"), answer("f")])
    assert list(parts(storage, shard))[2:] == ["part-00002.jsonl", "part-00003.jsonl"]
    second = load_checkpoints(storage, shard)
    assert (second.next_part, sorted(second.answers), sorted(second.rejected)) == (4, [*"acefh"], ["d"])
    assert len(second) == 6  # answers and rejections
    assert {t: (report.started_at, report.requests) for t, report in second.tries.items()} == {0: (0.0, 4), 2: (2.0, 4)}


@pytest.mark.parametrize(
    "flushes",
    [[(20.0, 3), (20.0, 5)], [(30.0, 5), (20.0, 3)]],
    ids=["the later part in the same second", "an earlier part with the later flush"],
)
def test_a_try_counts_as_its_latest_flush(tmp_path: Path, flushes: list[tuple[float, int]]) -> None:
    """Each part ends with the try's counts so far: the latest of them (a part of rejections may carry the time of
    the try's last answer, with more requests), whichever part holds it."""
    storage, shard = local_shard(tmp_path)
    for part, (finished_at, requests) in enumerate(flushes):
        counts = GenerationReport(
            10.0, finished_at, requests=requests, answered=1, request_seconds=0.0, output_tokens=0
        )
        trailer = msgspec.json.encode({"try": 0, "generation": dataclasses.asdict(counts)})
        storage.put_bytes(f"{shard.keys.checkpoints}part-{part:05d}.jsonl", trailer + b"\n")
    assert load_checkpoints(storage, shard).tries[0].requests == 5


def test_a_part_of_the_default_size_leaves_as_soon_as_it_is_full(tmp_path: Path) -> None:
    storage, shard = local_shard(tmp_path)
    every = GenerateSettings([], {}).checkpoint_every  # 1024: past the small ints CPython keeps one object of

    async def run() -> None:
        writer = checkpointer(storage, shard, every=every)
        flusher = started(writer)
        for i in range(every):
            writer.add(answer(f"s{i}"))
        for _ in range(100):  # the interval is a minute: only being full sends it
            if parts(storage, shard):
                break
            await asyncio.sleep(0.02)
        assert [len(records) for records in parts(storage, shard).values()] == [every + 1]
        await within(writer.finish(flusher))

    asyncio.run(run())


def test_asked_again_are_the_server_side_rejections_and_the_turns_they_made_unusable() -> None:
    def rejected(*turns: tuple[str, Reason]) -> dict[str, dict[str, Any]]:
        return {turn: json.loads(rejection_line(turn, reason, ""))["rejected"] for turn, reason in turns}

    found = Checkpoints(
        answers={"a/turn-1": answer("a/turn-1")},
        rejected=rejected(
            ("a/turn-2", Reason.SERVER_ABORTED),  # the fleet's: asked again with the turns it made unusable
            ("a/turn-3", Reason.EARLIER_TURN_UNUSABLE),
            ("a/turn-4", Reason.DIVERGED_TOOL_CALL),  # of the same conversation, but the sample's own: kept
            ("a/turn-5", Reason.PROMPT_ID_OUT_OF_VOCAB),
            ("b", Reason.SAMPLE_TIMEOUT),
            ("c/turn-1", Reason.PROMPT_ID_OUT_OF_VOCAB),  # the sample's own: kept, and the turns it made unusable
            ("c/turn-2", Reason.EARLIER_TURN_UNUSABLE),
        ),
    )
    assert found.ask_again() == ["a/turn-2", "a/turn-3", "b"]
    assert sorted(found.rejected) == ["a/turn-4", "a/turn-5", "c/turn-1", "c/turn-2"]  # forgotten: asked for
    assert "a/turn-1" in found and "c/turn-2" in found and "b" not in found


def test_turns_ended_by_a_turn_a_later_try_answered_are_asked_again() -> None:
    """A conversation's first turn lost to the fleet ended it (its later turns rejected, each naming that turn); a
    Resume's try answered the first two and was killed: its retry asks the third again, not a turn short."""
    ended_by = {"turn": "a/turn-1", "reason": Reason.SERVER_ABORTED.value}
    found = Checkpoints(
        answers={"a/turn-1": answer("a/turn-1"), "a/turn-2": answer("a/turn-2")},
        rejected={
            "a/turn-3": json.loads(rejection_line("a/turn-3", Reason.EARLIER_TURN_UNUSABLE, "", None, ended_by))[
                "rejected"
            ],
            "c/turn-2": json.loads(
                rejection_line("c/turn-2", Reason.EARLIER_TURN_UNUSABLE, "", None, {"turn": "c/turn-1"})
            )["rejected"],  # ended by a turn still rejected (the sample's own): kept
            "c/turn-1": json.loads(rejection_line("c/turn-1", Reason.PROMPT_ID_OUT_OF_VOCAB, ""))["rejected"],
        },
    )
    assert found.ask_again() == ["a/turn-3"] and sorted(found.rejected) == ["c/turn-1", "c/turn-2"]


@pytest.mark.parametrize("fails", [None, "part-00032.jsonl", "progress.json", "deleting part-00030.jsonl"])
def test_every_32_parts_of_a_try_merge_into_one_and_a_failed_merge_or_progress_costs_nothing(
    tmp_path: Path, fails: str | None
) -> None:
    storage, shard = local_shard(tmp_path, lambda key: down(key) if key.endswith(f"/{fails}") else None)
    storage.undeletable = fails and fails.removeprefix("deleting ")
    ids = [f"s{i:02d}" for i in range(33)]
    write_try(storage, shard, 0, [answer(i) for i in ids], every=1)
    merged = {"part-00032.jsonl": [line for i in ids[:32] for line in (i, "try 0")]}
    if fails == "part-00032.jsonl":  # the small parts stay, read as they are
        expected = {f"part-{i:05d}.jsonl": [sample, "try 0"] for i, sample in enumerate(ids) if i != 32}
    elif fails == "deleting part-00030.jsonl":  # the merge cut short: its last small parts stay beside it, read once
        expected = {"part-00030.jsonl": [ids[30], "try 0"], "part-00031.jsonl": [ids[31], "try 0"], **merged}
    else:
        expected = merged
    assert parts(storage, shard) == {**expected, "part-00033.jsonl": [ids[32], "try 0"]}
    found = load_checkpoints(storage, shard)
    assert (sorted(found.answers), found.next_part, found.tries[0].requests) == (ids, 34, 33)
    if fails != "progress.json":
        assert msgspec.json.decode(storage.get_bytes(shard.keys.progress)) == {"flushed": 33}


@pytest.mark.parametrize("left_parts", [False, True], ids=["parts removed", "parts left by a dying try"])
def test_try_ids_never_clash_after_a_reopen(tmp_path: Path, left_parts: bool) -> None:
    storage, shard = local_shard(tmp_path)
    records = [answer("a"), answer("b"), answer("x"), answer("y"), rejection_line("c", Reason.SERVER_ABORTED, "")]
    write_try(storage, shard, 0, records)  # parts 0 to 2
    done = load_checkpoints(storage, shard)
    # The try finished the shard: its counts, rejections and raw file; then it removed its parts (or died doing so).
    storage.put_bytes(shard.keys.generation, msgspec.json.encode(GenerationReport.combined([*done.tries.values()])))
    lost = {"id": "c", "stage": "generate", "reason": "server_aborted", "detail": ""}
    storage.put_bytes(shard.keys.rejected("generate"), msgspec.json.encode(lost) + b"\n")
    write_raw(tmp_path / "raw.jsonl.zst", [done.answers[i] for i in "abxy"])
    storage.put_file(shard.keys.raw, tmp_path / "raw.jsonl.zst")
    if not left_parts:
        for key in storage.list_keys(shard.keys.checkpoints):
            storage.delete(key)
    for stale in (shard.keys.report, shard.location.fleet_losses):  # the finished shard's, and its version's list
        storage.put_bytes(stale, b"{}")

    assert reopen(storage, shard)
    assert not storage.exists(shard.keys.report) and not storage.exists(shard.location.fleet_losses)
    reopened = "part-00003.jsonl" if left_parts else "part-00000.jsonl"
    assert parts(storage, shard) == {reopened: ["c", "a", "b", "x", "y", f"try {REOPENED}"]}
    resumed = load_checkpoints(storage, shard)
    assert resumed.ask_again() == ["c"]
    write_try(storage, shard, resumed.next_part, [answer("c")])
    found = load_checkpoints(storage, shard)
    assert set(found.tries) == {REOPENED, resumed.next_part}  # the try's own counts beside every earlier try's
    assert GenerationReport.combined([*found.tries.values()]).requests == 5 + 1
    assert sorted(found.answers) == [*"abcxy"] and not found.rejected
