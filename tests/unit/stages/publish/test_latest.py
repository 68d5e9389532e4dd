"""latest.json only moves forward, by the logical date of the run that made each version: a resumed older version
never repoints it, and publishers racing cannot move it back either (every change is conditional on what was read).
Both backends; S3 through boto3 over HTTP to moto's server."""

from __future__ import annotations

import contextlib
import json
import random
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from regen import pipeline
from regen.layout import latest_key
from regen.run_report import IncompleteRun
from regen.storage import LocalStorage, Storage
from regen.version_inputs import record_published
from tests.conftest import Simulator, each_shard, local_or_s3
from tests.unit.test_claims import Paused, in_thread
from tests.unit.test_nightly import DATASET, deployment  # noqa: F401 (a fixture)

PROFILE = "kimi-k2.5-mini"
DAY = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    return local_or_s3(request, tmp_path, "regen")


def entry(version: str, day: int, **more: Any) -> dict[str, Any]:
    when = (DAY + timedelta(days=day)).isoformat()
    return {"version": version, "logical_date": when, "published_at": datetime.now(UTC).isoformat(), **more}


def latest(storage: Storage) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads(storage.get_bytes(latest_key(PROFILE, DATASET))))


def test_an_older_version_published_later_leaves_latest_where_it_is(storage: Storage) -> None:
    assert record_published(storage, PROFILE, DATASET, entry("night-2", 2))
    assert not record_published(storage, PROFILE, DATASET, entry("night-1", 1))  # resumed, published after
    assert latest(storage)["version"] == "night-2"
    assert record_published(storage, PROFILE, DATASET, entry("night-2", 2, records=7))  # the same version again
    assert latest(storage)["records"] == 7
    assert record_published(storage, PROFILE, DATASET, entry("night-3", 3))
    assert latest(storage)["version"] == "night-3"


def test_an_entry_from_before_dates_were_recorded_is_ordered_by_when_it_was_published(storage: Storage) -> None:
    legacy = {"version": "old", "published_at": (DAY + timedelta(days=5)).isoformat()}
    storage.put_bytes(latest_key(PROFILE, DATASET), json.dumps(legacy).encode())
    assert not record_published(storage, PROFILE, DATASET, entry("night-4", 4))
    assert record_published(storage, PROFILE, DATASET, entry("night-6", 6))
    storage.put_bytes(latest_key(PROFILE, DATASET), b"{not json")  # unreadable: anything is ahead of it
    assert record_published(storage, PROFILE, DATASET, entry("night-1", 1))


class CreatedFirstByAnother:
    """Storage on which another publisher's first latest.json (`theirs`) lands between this one's read, which found
    none, and its own create."""

    def __init__(self, inner: Storage, theirs: dict[str, Any]) -> None:
        self.inner, self.theirs = inner, theirs

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def create(self, key: str, data: bytes) -> str:
        if self.theirs:
            self.inner.create(key, json.dumps(self.theirs).encode())
            self.theirs = {}
        return self.inner.create(key, data)


@pytest.mark.parametrize(("theirs", "moved"), [(1, True), (3, False)])
def test_a_publisher_whose_first_write_loses_the_race_compares_with_the_winners(
    storage: Storage, theirs: int, moved: bool
) -> None:
    raced = cast(Storage, CreatedFirstByAnother(storage, entry(f"night-{theirs}", theirs)))
    assert record_published(raced, PROFILE, DATASET, entry("night-2", 2)) is moved
    assert latest(storage)["version"] == ("night-2" if moved else f"night-{theirs}")


def test_a_slow_publisher_of_an_older_version_cannot_move_it_back(storage: Storage) -> None:
    """The older version's publisher read latest.json (night-0) and writes after the newer one's: its write was
    conditional on what it read, so it reads again, finds night-2 and leaves it."""
    record_published(storage, PROFILE, DATASET, entry("night-0", 0))
    slow = Paused(storage)
    thread, outcome = in_thread(lambda: record_published(cast(Storage, slow), PROFILE, DATASET, entry("night-1", 1)))
    assert slow.waiting.wait(30)
    assert record_published(storage, PROFILE, DATASET, entry("night-2", 2))
    slow.go.set()
    thread.join(30)
    assert outcome == [False]
    assert latest(storage)["version"] == "night-2"


def test_publishers_racing_never_move_it_back(tmp_path: Path) -> None:
    """Eight threads publish 25 versions each in random date order, all at once, while a reader watches: what it
    reads never moves back, and it ends at the latest date."""
    storage = LocalStorage(tmp_path / "root")
    days = list(range(200))
    random.Random(34).shuffle(days)
    stop, seen = threading.Event(), []

    def watch() -> None:
        while not stop.is_set():
            with contextlib.suppress(FileNotFoundError):
                seen.append(latest(storage)["logical_date"])

    def publish(mine: list[int]) -> None:
        for day in mine:
            record_published(storage, PROFILE, DATASET, entry(f"night-{day}", day))

    watcher = threading.Thread(target=watch)
    watcher.start()
    publishers = [threading.Thread(target=publish, args=(days[i::8],)) for i in range(8)]
    for thread in publishers:
        thread.start()
    for thread in publishers:
        thread.join()
    stop.set()
    watcher.join()
    assert len(seen) > 10 and seen == sorted(seen)
    assert latest(storage)["version"] == "night-199"


def stages(run_id: str, simulator: Simulator, day: int, publish: bool = True, **params: Any) -> None:
    """plan -> prepare -> every shard -> verify -> publish -> report, as the DAG runs them, for a run of that logical
    date; without publishing, a run that failed before it."""
    plan = pipeline.plan(
        {"endpoints": [simulator.url], "skip_unchanged": False, **params}, run_id, None, DAY + timedelta(days=day)
    )
    run = pipeline.RunSpec(**plan)
    prepared = [pipeline.prepare_dataset(run, name) for name in run.datasets]
    for shard in each_shard(run, prepared):
        pipeline.export_shard(run, pipeline.validate_shard(run, pipeline.generate_shard(run, shard)))
    verified = [pipeline.verify_dataset(run, p) for p in prepared]
    if not publish:  # the run failed before publishing: its report says so, and releases its claims
        with pytest.raises(IncompleteRun):
            pipeline.report(run, [], [])
        return
    published = [pipeline.publish_dataset(run, p, [], v) for p, v in zip(prepared, verified, strict=True)]
    pipeline.report(run, published, [])


def test_a_resumed_older_version_keeps_its_date_and_never_repoints_latest(
    deployment: Path,  # noqa: F811
    simulator: Simulator,
) -> None:
    """night-1 fails before publishing; night-2 publishes; a run days later resumes night-1 and publishes it: the
    version keeps night-1's date, and latest.json still names night-2."""
    stages("scheduled__night-1", simulator, 1, publish=False, version="night-1")
    stages("scheduled__night-2", simulator, 2, version="night-2")
    stages("manual__resume", simulator, 9, version="night-1")
    root = deployment / "storage"
    assert (root / PROFILE / DATASET / "night-1" / "manifest.json").exists()  # the resumed version is published
    now = json.loads((root / latest_key(PROFILE, DATASET)).read_text())
    assert (now["version"], now["logical_date"]) == ("night-2", (DAY + timedelta(days=2)).isoformat())
