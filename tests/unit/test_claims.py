"""One writer per version: two runs of one version at once (a second deployment, a `dags test` beside the scheduler)
never both write it; a run that died leaves a claim that expires, and a Resume takes the version over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from regen import claims
from regen.claims import VersionBusy, claim, held
from regen.layout import DatasetLocation
from regen.storage import LocalStorage
from regen.verify import verify_published
from tests.conftest import ROOT, project_config_in
from tools.devstack import Simulator, start_simulator


@pytest.fixture
def location(tmp_path: Path) -> tuple[LocalStorage, DatasetLocation]:
    storage = LocalStorage(tmp_path)
    return storage, DatasetLocation(storage.root_uri, "kimi-k2.5-mini", "B1_glaive", "night-1")


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
    claim(storage, where, "run-b", settle_s=0)  # run-a went silent: a Resume continues the version
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


def test_an_unreadable_claim_counts_as_expired(location: tuple[LocalStorage, DatasetLocation]) -> None:
    storage, where = location
    storage.put_bytes(where.writer, b"{not json")
    claim(storage, where, "run-b", settle_s=0)
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


def test_takers_of_one_stale_claim_at_once_leave_exactly_one_holder(
    location: tuple[LocalStorage, DatasetLocation],
) -> None:
    storage, where = location
    storage.put_bytes(where.writer, json.dumps({"run_id": "dead", "renewed_at": 0}).encode())
    outcomes: dict[str, str] = {}

    def take(run_id: str) -> None:
        try:
            claim(storage, where, run_id, settle_s=0.5)
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
