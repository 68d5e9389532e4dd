"""Storage going down mid-generate, for real: moto's S3 behind the fault proxy (tools/s3_fault_proxy.py), which
answers every request 503 while `down`. An outage shorter than the bound costs nothing: every answer is kept, none
asked twice. Storage that stays down fails the task within seconds, and the retry asks only for what did not land."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from regen.chat import ChatRenderer
from regen.config import Sampling
from regen.manifest import ShardManifest
from regen.stages.generate.checkpoints import CheckpointsUnwritable, load_checkpoints
from regen.stages.generate.generate import GenerateSettings, run_generate
from regen.storage import S3Storage
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
