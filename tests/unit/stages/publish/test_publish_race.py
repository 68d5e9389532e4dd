"""Two publishers of one version at once (two tries of one publish task, an operator's rerun beside the DAG's), on a
local root and on S3 (moto): both find no manifest, then one publishes first and the other after. The first's
manifest and every file it names stay intact and `regen verify` passes; the second is told it lost, and leaves
nothing of its own behind."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from regen.chat import ChatRenderer
from regen.config import load_config
from regen.layout import DatasetLocation
from regen.manifest import PreparedDataset
from regen.stages.prepare.prepare import PrepareSettings, run_prepare
from regen.stages.publish.publish import run_publish, verify_contents
from regen.storage import LocalStorage, S3Storage, Storage
from regen.verify import verify_version
from tests.conftest import ROOT, Simulator, finish_shards

# What a version holds besides the files its manifest names: bookkeeping that makes stages idempotent.
BOOKKEEPING = ("manifest.json", "prompts/prepare.json", ".generation.json", "/reports/shard-", "latest.json")


class Racing:
    """The storage one publisher sees: its check for a published manifest answers, then waits until both publishers
    have checked, and the second also until the first has published. Everything else is the real storage."""

    def __init__(self, storage: Storage, checked: threading.Barrier, published: threading.Event, first: bool) -> None:
        self.storage, self.checked, self.published, self.first = storage, checked, published, first
        self.raced = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.storage, name)

    def exists(self, key: str) -> bool:
        found = self.storage.exists(key)
        if key.endswith("/manifest.json") and not self.raced:
            self.raced = True
            self.checked.wait(30)
            if not self.first:
                self.published.wait(60)
        return found

    def create(self, key: str, data: bytes) -> str:
        try:
            return self.storage.create(key, data)
        finally:
            if self.first and key.endswith("/manifest.json"):
                self.published.set()


def finished_version(storage: Storage, renderer: ChatRenderer, url: str) -> PreparedDataset:
    config = load_config()
    location = DatasetLocation(storage.root_uri, renderer.profile.name, "B1_glaive", "v1")
    prepared = run_prepare(
        config.dataset("B1_glaive"),
        location,
        storage,
        renderer,
        PrepareSettings(shard_size=10, limit=20, resolve_path=config.resolve, workers=1),
    )
    finish_shards(prepared.shards, storage, renderer, url)
    return prepared


def race(prepared: PreparedDataset, storage: Storage) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both publishers at once; their reports differ (each its own price), as two tries' can."""
    verified = verify_contents(prepared, storage)
    checked, published = threading.Barrier(2), threading.Event()
    results: dict[bool, Any] = {}

    def publish(first: bool) -> None:
        try:
            racing: Any = Racing(storage, checked, published, first)
            cost = {"gpu_hour_price": 2.0 if first else 3.0}
            run_id = "first" if first else "second"
            results[first] = run_publish(prepared, racing, [], verified=verified, run_id=run_id, cost=cost)
        except Exception as e:
            results[first] = e

    threads = [threading.Thread(target=publish, args=(first,)) for first in (True, False)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not isinstance(results[True], Exception), results[True]
    return results[True], results[False]


def check_the_winner_stands(storage: Storage, prepared: PreparedDataset, won: dict[str, Any], lost: Any) -> None:
    location = prepared.location
    manifest = json.loads(storage.get_bytes(location.manifest))
    assert manifest["run_id"] == "first"
    assert json.loads(storage.get_bytes(location.latest))["manifest_sha256"] == won["manifest_sha256"]
    report = next(k for k in manifest["files"] if k.endswith("report.json"))
    assert json.loads(storage.get_bytes(report))["cost"]["gpu_hour_price"] == 2.0  # the first's report, not the other's
    # The second either fails or answers with the version as the first published it, never with its own.
    assert isinstance(lost, Exception) or lost["manifest_sha256"] == won["manifest_sha256"]
    held = storage.list_keys(location.prefix)
    strays = [k for k in held if k not in manifest["files"] and not any(b in k for b in BOOKKEEPING)]
    assert strays == []  # the loser's report went with it


def test_two_publishers_of_one_local_version_leave_the_first_intact(
    tmp_path: Path, renderer: ChatRenderer, simulator: Simulator, caplog: pytest.LogCaptureFixture
) -> None:
    storage = LocalStorage(tmp_path / "root")
    prepared = finished_version(storage, renderer, simulator.url)
    with caplog.at_level(logging.WARNING, logger="regen.stages.publish.publish"):
        won, lost = race(prepared, storage)
    result = verify_version(won["manifest"])
    assert result.problems == [] and result.records_checked > 0
    check_the_winner_stands(storage, prepared, won, lost)
    assert "another publisher published it first" in caplog.text
    cli = subprocess.run(
        [sys.executable, "-m", "regen", "verify", won["manifest"]], capture_output=True, text=True, cwd=ROOT
    )
    assert cli.returncode == 0, cli.stdout + cli.stderr


def test_two_publishers_of_one_s3_version_leave_the_first_intact(
    renderer: ChatRenderer, simulator: Simulator, s3_client: Any
) -> None:
    s3_client.create_bucket(Bucket="publish-race")
    storage = S3Storage("publish-race", "runs", s3_client)
    prepared = finished_version(storage, renderer, simulator.url)
    won, lost = race(prepared, storage)
    result = verify_version(won["manifest"], s3_client)
    assert result.problems == [] and result.records_checked > 0
    check_the_winner_stands(storage, prepared, won, lost)
