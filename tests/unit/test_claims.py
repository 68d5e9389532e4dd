"""One writer per version: two runs of one version at once (a second deployment, a `dags test` beside the scheduler)
never both write it; a run that died leaves a claim that expires, and a Resume takes the version over."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from regen import claims
from regen.claims import VersionBusy, claim, held
from regen.layout import DatasetLocation
from regen.storage import LocalStorage, Storage
from regen.verify import verify_published
from tests.conftest import ROOT, local_or_s3, project_config_in
from tools.devstack import Simulator, start_simulator


@pytest.fixture
def location(tmp_path: Path) -> tuple[LocalStorage, DatasetLocation]:
    storage = LocalStorage(tmp_path)
    return storage, DatasetLocation(storage.root_uri, "kimi-k2.5-mini", "B1_glaive", "night-1")


@pytest.fixture(params=["local", "s3"])
def either(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Storage, DatasetLocation]:
    """A version's location on local storage or on S3 (boto3 over HTTP to moto's server)."""
    storage = local_or_s3(request, tmp_path, "regen")
    return storage, DatasetLocation(storage.root_uri, "kimi-k2.5-mini", "B1_glaive", "night-1")


WRITES = ("put_bytes", "create", "replace", "delete", "delete_if")


class Paused:
    """A storage whose first write after a read waits until `go` is set: `waiting` is set once it does. What a
    slow claimant looks like: it read the claim, and writes only after others have acted."""

    def __init__(self, inner: Storage) -> None:
        self.inner, self.read = inner, False
        self.waiting, self.go = threading.Event(), threading.Event()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if name in ("get_bytes", "get_tagged"):
            self.read = True
        if name not in WRITES:
            return attribute

        def paused(*args: Any, **kwargs: Any) -> Any:
            if self.read and not self.waiting.is_set():
                self.waiting.set()
                assert self.go.wait(30)
            return attribute(*args, **kwargs)

        return paused


def in_thread(call: Any) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as e:
            outcome.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_a_slow_taker_of_a_stale_claim_cannot_take_it_from_the_one_that_took_it(
    either: tuple[Storage, DatasetLocation],
) -> None:
    """B reads a stale claim, A takes it over, then B writes: B's write was conditional on the claim it read, so B
    is refused and A is the one holder (an unconditional takeover would leave both believing they hold it)."""
    storage, where = either
    storage.put_bytes(where.writer, json.dumps({"run_id": "dead", "renewed_at": 0}).encode())
    slow = Paused(storage)
    thread, outcome = in_thread(lambda: claim(cast(Storage, slow), where, "run-b"))
    assert slow.waiting.wait(30)  # B has read the stale claim and is about to write
    claim(storage, where, "run-a")
    slow.go.set()
    thread.join(30)
    assert isinstance(outcome[0], VersionBusy) and "run run-a" in str(outcome[0]), outcome
    assert json.loads(storage.get_bytes(where.writer))["run_id"] == "run-a"


def test_a_release_never_deletes_the_claim_another_took_over_meanwhile(
    either: tuple[Storage, DatasetLocation],
) -> None:
    """A's release reads its own (stale) claim; B takes it over; A's delete comes after: B's claim stays."""
    storage, where = either
    storage.put_bytes(where.writer, json.dumps({"run_id": "run-a", "renewed_at": 0}).encode())
    slow = Paused(storage)
    thread, outcome = in_thread(lambda: claims.release(cast(Storage, slow), where, "run-a"))
    assert slow.waiting.wait(30)
    claim(storage, where, "run-b")
    slow.go.set()
    thread.join(30)
    assert outcome == [None]
    assert json.loads(storage.get_bytes(where.writer))["run_id"] == "run-b"
    with pytest.raises(VersionBusy, match="run run-b"):
        claim(storage, where, "run-a")


def test_two_tries_of_one_run_are_told_apart(either: tuple[Storage, DatasetLocation]) -> None:
    """A run planned again (a new try token) does not share the claim of its earlier try while that is fresh, and
    once it took the claim over, the earlier try's renewal is refused (its block fails, nothing it wrote is
    published) and its release leaves the new try's claim."""
    storage, where = either
    claim(storage, where, "run-a", "try-1")
    claim(storage, where, "run-a", "try-1")  # the tasks of one try share it
    with pytest.raises(VersionBusy, match="another try of this run run-a"):
        claim(storage, where, "run-a", "try-2")
    stale = {"run_id": "run-a", "token": "try-1", "renewed_at": time.time() - claims.EXPIRES_S - 1}
    storage.put_bytes(where.writer, json.dumps(stale).encode())
    claim(storage, where, "run-a", "try-2")
    with pytest.raises(VersionBusy, match="another try"):
        claim(storage, where, "run-a", "try-1")
    claims.release(storage, where, "run-a", "try-1")
    assert json.loads(storage.get_bytes(where.writer))["token"] == "try-2"
    claims.release(storage, where, "run-a", "try-2")
    assert not storage.exists(where.writer)


CONTENDER = """
import json, os, sys, time
from regen import claims
from regen.layout import DatasetLocation
from regen.storage import LocalStorage, S3Storage, Storage

class Logged(LocalStorage):
    def replace(self, key, data, tag):  # every change that took effect, with the tag it replaced
        digest = super().replace(key, data, tag)
        with open(sys.argv[2], "a") as log:
            log.write(json.dumps([tag, digest]) + "\\n")
        return digest

claims.EXPIRES_S = 0.0  # every claim is stale at once: each call is a takeover, all contenders at once
storage = Logged(__import__("pathlib").Path(sys.argv[1]))
where = DatasetLocation(storage.root_uri, "kimi-k2.5-mini", "B1_glaive", "night-1")
while not os.path.exists(sys.argv[1] + "/go"):
    time.sleep(0.001)
held = 0
for i in range(150):
    try:
        claims.claim(storage, where, sys.argv[3], f"try-{i}")
        held += 1
    except claims.VersionBusy:
        pass
print(held)
"""


def test_processes_taking_one_claim_over_and_over_leave_one_history(tmp_path: Path) -> None:
    """Four processes take one claim over 150 times each, all at once (every claim stale at once): every change
    that took effect replaced a different version of the claim, so the changes form one line, each from the one
    before: never two holders from one state. The claim at the end is the last change's."""
    root, log = tmp_path / "root", tmp_path / "changes.jsonl"
    storage = LocalStorage(root)
    where = DatasetLocation(storage.root_uri, "kimi-k2.5-mini", "B1_glaive", "night-1")
    storage.put_bytes(where.writer, json.dumps({"run_id": "dead", "renewed_at": 0}).encode())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "include"), str(ROOT)])}
    contenders = [
        subprocess.Popen(
            [sys.executable, "-c", CONTENDER, str(root), str(log), f"run-{i}"],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    time.sleep(1.0)
    (root / "go").touch()
    held = [int(c.communicate(timeout=120)[0]) for c in contenders]
    changes = [tuple(json.loads(line)) for line in log.read_text().splitlines()]
    assert sum(held) == len(changes) > 150
    replaced = [tag for tag, _ in changes]
    assert len(set(replaced)) == len(replaced)  # no state was replaced twice
    chain = dict(changes)
    start = hashlib.sha256(json.dumps({"run_id": "dead", "renewed_at": 0}).encode()).hexdigest()
    walked = [start]
    while walked[-1] in chain:
        walked.append(chain[walked[-1]])
    assert len(walked) == len(changes) + 1  # one line through every change
    assert hashlib.sha256(storage.get_bytes(where.writer)).hexdigest() == walked[-1]


def test_a_fresh_claim_of_another_run_refuses_and_a_stale_one_is_taken_over(
    location: tuple[LocalStorage, DatasetLocation], monkeypatch: pytest.MonkeyPatch
) -> None:
    storage, where = location
    claim(storage, where, "run-a")
    claim(storage, where, "run-a")  # its own tasks renew it
    with pytest.raises(VersionBusy, match="being written by run run-a"):
        claim(storage, where, "run-b")
    stale = {"run_id": "run-a", "renewed_at": time.time() - claims.EXPIRES_S - 1}
    storage.put_bytes(where.writer, json.dumps(stale).encode())
    claim(storage, where, "run-b")  # run-a went silent: a Resume continues the version
    assert json.loads(storage.get_bytes(where.writer))["run_id"] == "run-b"
    with pytest.raises(VersionBusy, match="run run-b"):
        claim(storage, where, "run-a")  # and the run that went silent may not write again


def test_a_released_claim_lets_another_run_write_at_once(location: tuple[LocalStorage, DatasetLocation]) -> None:
    storage, where = location
    claim(storage, where, "run-a")
    claims.release(storage, where, "run-b")  # only the holder releases
    with pytest.raises(VersionBusy):
        claim(storage, where, "run-b")
    claims.release(storage, where, "run-a")
    claim(storage, where, "run-b")
    assert json.loads(storage.get_bytes(where.writer))["run_id"] == "run-b"


def test_a_claim_is_renewed_while_its_block_writes_and_a_lost_one_fails_the_block(
    location: tuple[LocalStorage, DatasetLocation], monkeypatch: pytest.MonkeyPatch
) -> None:
    storage, where = location
    monkeypatch.setattr(claims, "RENEW_S", 0.05)
    with held(storage, where, "run-a"):
        first = json.loads(storage.get_bytes(where.writer))["renewed_at"]
        time.sleep(0.3)
        assert json.loads(storage.get_bytes(where.writer))["renewed_at"] > first
    with pytest.raises(VersionBusy, match="run run-b"), held(storage, where, "run-a"):
        storage.put_bytes(where.writer, json.dumps({"run_id": "run-b", "renewed_at": time.time()}).encode())
        time.sleep(0.3)  # a renewal finds run-b holding the version


def test_a_renewal_never_recreates_a_claim_its_run_released(
    location: tuple[LocalStorage, DatasetLocation], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard task still writes when its run's report releases the claim (a sibling's failure ended the dataset's
    wait): its renewal must not take the claim again as if nothing happened, since another run may take the version
    the moment it is released. The block fails, and the version stays free."""
    storage, where = location
    monkeypatch.setattr(claims, "RENEW_S", 0.05)
    with pytest.raises(VersionBusy, match="released while it still wrote"), held(storage, where, "run-a", "try-1"):
        claims.release(storage, where, "run-a", "try-1")  # what report does as the run ends
        time.sleep(0.3)  # renewals come and go
        assert not storage.exists(where.writer)
    claim(storage, where, "run-b")  # a Resume takes the version at once


def test_takers_of_one_stale_claim_at_once_leave_exactly_one_holder(
    location: tuple[LocalStorage, DatasetLocation],
) -> None:
    storage, where = location
    storage.put_bytes(where.writer, json.dumps({"run_id": "dead", "renewed_at": 0}).encode())
    outcomes: dict[str, str] = {}

    def take(run_id: str) -> None:
        try:
            claim(storage, where, run_id)
            outcomes[run_id] = "holds"
        except VersionBusy:
            outcomes[run_id] = "busy"

    takers = [threading.Thread(target=take, args=(f"run-{i}",)) for i in range(4)]
    for taker in takers:
        taker.start()
    for taker in takers:
        taker.join()
    assert sorted(outcomes.values()) == ["busy", "busy", "busy", "holds"]
    [holder] = [run for run, outcome in outcomes.items() if outcome == "holds"]
    assert json.loads(storage.get_bytes(where.writer))["run_id"] == holder


WRITER = """
import json, pathlib, sys, time
from regen import pipeline
ready = pathlib.Path(sys.argv[2]).parent / "ready"
ready.mkdir(exist_ok=True)
(ready / sys.argv[3]).touch()
while len(list(ready.iterdir())) < 2:  # both imported: start together
    time.sleep(0.01)
run = pipeline.RunSpec(**pipeline.plan({"endpoints": [sys.argv[1]], "version": "shared", "datasets": ["B1_glaive"],
                                        "limit": 24, "storage_root": sys.argv[2], "skip_unchanged": False},
                                       sys.argv[3]))
try:
    [prepared] = [pipeline.prepare_dataset(run, name) for name in run.datasets]
    for shard in [s.to_dict() for s in pipeline.prepared_version(run, prepared["dataset"]).shards]:
        pipeline.export_shard(run, pipeline.validate_shard(run, pipeline.generate_shard(run, shard)))
    published = pipeline.publish_dataset(run, prepared, [], pipeline.verify_dataset(run, prepared))
    print(json.dumps({"published": published["manifest"]}))
except Exception as e:
    print(json.dumps({"refused": type(e).__name__, "why": str(e)}))
"""


@pytest.fixture(scope="module")
def slow_simulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Simulator]:
    with start_simulator(tmp_path_factory.mktemp("slow"), "--decode-ms-per-token", "2") as sim:
        yield sim


def test_two_processes_writing_one_version_at_once_publish_it_exactly_once(
    tmp_path: Path, slow_simulator: Simulator
) -> None:
    """Two runs of one version started together, each prepare -> generate -> validate -> export -> verify -> publish
    as the DAG runs them: one publishes, the other is refused with why before writing anything, and the published
    version verifies whole."""
    root = tmp_path / "storage"
    config = project_config_in(tmp_path, allowed_storage_roots=[str(root)])
    env = {"REGEN_CONFIG": str(config), "PYTHONPATH": str(ROOT)}
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, slow_simulator.url, str(root), f"manual__writer-{i}"],
            stdout=subprocess.PIPE,
            env={**os.environ, **env},
            text=True,
        )
        for i in range(2)
    ]
    outcomes = [json.loads(writer.communicate(timeout=300)[0].strip().splitlines()[-1]) for writer in writers]
    published = [o["published"] for o in outcomes if "published" in o]
    refused = [o for o in outcomes if "refused" in o]
    assert len(published) == 1 and len(refused) == 1, outcomes
    assert refused[0]["refused"] == "VersionBusy" and "being written by run manual__writer-" in refused[0]["why"]
    assert verify_published(published[0])["records"] > 0  # raises, naming every problem, unless the version is whole
    winner = next(f"manual__writer-{i}" for i, o in enumerate(outcomes) if "published" in o)
    assert json.loads(Path(published[0]).read_text())["run_id"] == winner
    assert not (root / "kimi-k2.5-mini" / "B1_glaive" / "shared" / "writer.json").exists()  # released once published


def test_many_tasks_of_one_try_claiming_at_once_all_hold_it(location: tuple[LocalStorage, DatasetLocation]) -> None:
    """A run's shard tasks start together and all claim the version: none is refused for the claim changing under
    it (a sibling's renewal is as good as its own), and the claim names the try."""
    from concurrent.futures import ThreadPoolExecutor

    storage, where = location
    barrier = threading.Barrier(32)

    def task(_: int) -> None:
        barrier.wait()
        claim(storage, where, "run-a", "try-1")

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(task, range(32)))  # raises if any was refused
    assert json.loads(storage.get_bytes(where.writer))["token"] == "try-1"


def test_each_plan_of_a_run_is_a_try_of_its_own(tmp_roots_allowed: Path) -> None:
    """A run planned again (cleared whole) gets a new try token; its tasks then claim as a try of their own, and
    are refused while the earlier try's claim is fresh."""
    from regen import pipeline

    params = {"storage_root": str(tmp_roots_allowed / "store"), "datasets": ["B1_glaive"]}
    first, again = (pipeline.RunSpec(**pipeline.plan(params, "manual__1")) for _ in range(2))
    assert first.run_id == again.run_id and first.try_token != again.try_token
    storage, where = LocalStorage(tmp_roots_allowed / "store"), first.location("B1_glaive")
    claim(storage, where, first.run_id, first.try_token)
    with pytest.raises(VersionBusy, match="another try of this run manual__1"):
        claim(storage, where, again.run_id, again.try_token)


def test_a_refusal_says_when_the_claim_expires_and_a_just_renewed_claim_is_left_as_it_is(
    location: tuple[LocalStorage, DatasetLocation], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a clock of the test's own, in the module's documented figures (renewed every 30 s, expired after 120 s, a
    claim renewed less than 5 s ago left as it is): the refusal counts down to the claim's expiry (the operator waits
    that long or takes another version), and a try's tasks claiming within 5 s of each other write once."""
    from types import SimpleNamespace

    storage, where = location
    now = [1_000_000.0]
    monkeypatch.setattr(claims, "time", SimpleNamespace(time=lambda: now[0]))

    def renewed_at() -> float:
        return float(json.loads(storage.get_bytes(where.writer))["renewed_at"])

    claim(storage, where, "run-a", "try-1")
    now[0] = 1_000_004.9
    claim(storage, where, "run-a", "try-1")  # a sibling task, a moment later: nothing written
    assert renewed_at() == 1_000_000.0
    now[0] = 999_998.0
    claim(storage, where, "run-a", "try-1")  # nor from a sibling on a machine whose clock is 2 s behind
    assert renewed_at() == 1_000_000.0
    now[0] = 1_000_005.0
    claim(storage, where, "run-a", "try-1")
    assert renewed_at() == 1_000_005.0
    now[0] += 20
    with pytest.raises(VersionBusy, match=r"renewed 20 s ago\).*expires 100 s from now"):
        claim(storage, where, "run-b")
    now[0] = 1_000_005.0 + 120  # silent for exactly the expiry: taken over
    claim(storage, where, "run-b")
    assert json.loads(storage.get_bytes(where.writer))["run_id"] == "run-b"


@pytest.mark.parametrize(
    "body",
    [b"{not json", b'{"token": "t", "renewed_at": 1}', b'{"run_id": "run-a", "renewed_at": null}', b"[1, 2]"],
    ids=["not json", "no run", "no time", "not an object"],
)
def test_a_claim_of_any_unreadable_shape_counts_as_expired(
    location: tuple[LocalStorage, DatasetLocation], body: bytes
) -> None:
    storage, where = location
    storage.put_bytes(where.writer, body)
    claim(storage, where, "run-b")
    assert json.loads(storage.get_bytes(where.writer))["run_id"] == "run-b"


def test_a_claim_that_changes_under_every_try_gives_up_after_twenty_reads(
    location: tuple[LocalStorage, DatasetLocation],
) -> None:
    """Each read then write that finds the claim changed reads it again, twenty times at most: then the task is
    refused with a message to try again, rather than spin."""
    from regen.storage import Changed

    storage, where = location
    storage.put_bytes(where.writer, json.dumps({"run_id": "run-a", "renewed_at": 0.0}).encode())
    reads = []

    class Contended:
        def get_tagged(self, key: str) -> tuple[bytes, str]:
            reads.append(key)
            return storage.get_tagged(key)

        def replace(self, key: str, data: bytes, tag: str) -> str:
            raise Changed(key)

    with pytest.raises(VersionBusy, match="kept changing under 20 tries"):
        claim(cast(Storage, Contended()), where, "run-b")
    assert len(reads) == 20


def test_a_renewal_that_meets_a_storage_fault_tries_again_at_the_next(
    location: tuple[LocalStorage, DatasetLocation], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim renewal that fails on the storage (a dropped connection) is logged and tried again one period later;
    the block goes on writing and ends green once a renewal lands."""
    storage, where = location
    monkeypatch.setattr(claims, "RENEW_S", 0.05)
    faults = [OSError("connection reset")] * 2

    class Flaky:
        def __getattr__(self, name: str) -> Any:
            return getattr(storage, name)

        def get_tagged(self, key: str) -> tuple[bytes, str]:
            if faults and threading.current_thread().name.startswith("claim-"):
                raise faults.pop()
            return storage.get_tagged(key)

    with held(cast(Storage, Flaky()), where, "run-a"):
        first = json.loads(storage.get_bytes(where.writer))["renewed_at"]
        deadline = time.monotonic() + 10
        while json.loads(storage.get_bytes(where.writer))["renewed_at"] == first and time.monotonic() < deadline:
            time.sleep(0.02)
    assert not faults  # both faults met by renewals
    assert json.loads(storage.get_bytes(where.writer))["renewed_at"] > first
