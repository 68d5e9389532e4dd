"""Generation under faults: every sample answered exactly once, finished work survives a kill, the fleet fails over."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from regen.chat import ChatRenderer
from regen.config import Sampling
from regen.manifest import ShardManifest
from regen.sglang.fleet import FleetUnavailable
from regen.stages.generate.checkpoints import load_checkpoints
from regen.stages.generate.generate import GenerateSettings, run_generate
from regen.storage import LocalStorage
from tests.conftest import Simulator, free_port, prepare_sample, raw_answers, shard_prompt_ids, start_simulator

SAMPLES = 48  # B2_opencodeinstruct keeps 48 prompts


@pytest.fixture
def shard(tmp_path: Path, renderer: ChatRenderer) -> tuple[LocalStorage, ShardManifest]:
    prepared, storage = prepare_sample(tmp_path / "root", renderer, "B2_opencodeinstruct", 100)
    return storage, prepared.shards[0]


def settings(*endpoints: str, **overrides: float) -> GenerateSettings:
    values = {
        "concurrency": 8,
        "request_timeout_s": 2.0,
        "max_attempts": 12,
        "backoff_max_s": 0.2,
        "checkpoint_every": 4,
        "fleet_wait_s": 3.0,
        **overrides,
    }
    return GenerateSettings(list(endpoints), Sampling().as_params(), **values)  # type: ignore[arg-type]


def raw_records(storage: LocalStorage, manifest: ShardManifest) -> list[dict]:
    return raw_answers(storage, manifest.raw_key)


def stop(sim: Simulator) -> None:
    sim.process.kill()
    sim.process.wait(10)


def test_every_fault_on_every_sample_answered_once_as_the_server_sent_it(
    tmp_path: Path, shard: tuple[LocalStorage, ShardManifest]
) -> None:
    storage, prompts = shard
    rates = [
        "--http-500-rate",
        "0.08",
        "--http-503-rate",
        "0.08",
        "--reset-rate",
        "0.08",
        "--hang-rate",
        "0.06",
        "--abort-rate",
        "0.08",
        "--slow-rate",
        "0.08",
        "--slow-s",
        "0.3",
        "--fault-seed",
        "11",
    ]
    sim = start_simulator(tmp_path, *rates)
    try:
        manifest = run_generate(prompts, storage, settings(sim.url))
        faults = requests.get(f"{sim.url}/sim/stats", timeout=5).json()["faults"]
    finally:
        stop(sim)
    assert set(faults) == {"http_500", "http_503", "reset", "hang", "abort", "slow"}
    records = raw_records(storage, manifest)
    assert len(records) == len({r["id"] for r in records}) == SAMPLES
    sent = {r["rid"]: r for r in sim.records()}
    prompt_ids = shard_prompt_ids(storage, prompts)
    for record in records:  # identical to the answer of the final, successful attempt
        assert record["output_ids"] == sent[record["rid"]]["output_ids"]
        assert prompt_ids[record["id"]] == sent[record["rid"]]["input_ids"]
    assert sum(r["attempts"] > 1 for r in records) > 0
    assert manifest.generation is not None and sum(manifest.generation.retries_by_cause.values()) > 0


KILLABLE = """
import json, sys
from regen.config import Sampling
from regen.stages.generate.generate import GenerateSettings, run_generate
from regen.manifest import ShardManifest
from regen.storage import LocalStorage
shard = ShardManifest.from_dict(json.loads(sys.argv[1]))
settings = GenerateSettings([sys.argv[3]], Sampling().as_params(), concurrency=4, checkpoint_every=4)
run_generate(shard, LocalStorage(__import__("pathlib").Path(sys.argv[2])), settings)
"""


def test_sigkill_mid_shard_then_rerun_requests_only_the_unfinished(
    tmp_path: Path, shard: tuple[LocalStorage, ShardManifest]
) -> None:
    storage, prompts = shard
    sim = start_simulator(tmp_path, "--decode-ms-per-token", "3")
    try:
        worker = subprocess.Popen(
            [sys.executable, "-c", KILLABLE, json.dumps(prompts.to_dict()), str(storage.root), sim.url]
        )
        parts = prompts.location.shard(0).checkpoints
        deadline = time.monotonic() + 60
        while len(storage.list_keys(parts)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        time.sleep(0.5)  # requests the dead worker left in flight are dropped by the server
        checkpointed = load_checkpoints(storage, prompts).answers
        assert 0 < len(checkpointed) < SAMPLES
        # What the UI shows of the killed try: never more done than is in storage (written after each part).
        progress = json.loads(storage.get_bytes(prompts.keys.progress))
        assert progress["total"] == SAMPLES and progress["concurrency"] == 4
        assert 0 < progress["done"] <= len(checkpointed)
        manifest, rerun_requests = generate_counting(sim, prompts, storage)
    finally:
        stop(sim)
    assert rerun_requests == SAMPLES - len(checkpointed)
    records = raw_records(storage, manifest)
    assert len(records) == len({r["id"] for r in records}) == SAMPLES
    by_id = {r["id"]: r for r in records}
    assert all(by_id[i]["rid"] == json.loads(line)["rid"] for i, line in checkpointed.items())


def generate_counting(sim: Simulator, prompts: ShardManifest, storage: LocalStorage) -> tuple[ShardManifest, int]:
    """The shard generated (again) against `sim`, and how many requests that took."""
    before = len(sim.records())
    manifest = run_generate(prompts, storage, settings(sim.url))
    return manifest, len(sim.records()) - before


def stop_once_answered(simulator: Simulator, deadline_s: float = 30.0, answers: int = 1) -> None:
    give_up = time.monotonic() + deadline_s
    while time.monotonic() < give_up:
        if requests.get(f"{simulator.url}/sim/stats", timeout=5).json()["answered"] >= answers:
            break
        time.sleep(0.02)
    stop(simulator)


def test_one_endpoint_dies_mid_run_and_the_other_finishes(
    tmp_path: Path, shard: tuple[LocalStorage, ShardManifest]
) -> None:
    storage, prompts = shard
    dying = start_simulator(tmp_path, "--decode-ms-per-token", "2")
    healthy = start_simulator(tmp_path, "--decode-ms-per-token", "2")
    try:
        import threading

        # Killed once it has answered, not after a fixed time: on a loaded machine the run may not have begun by then.
        threading.Thread(target=stop_once_answered, args=[dying], daemon=True).start()
        manifest = run_generate(prompts, storage, settings(dying.url, healthy.url))
    finally:
        stop(healthy)
    records = raw_records(storage, manifest)
    assert len(records) == len({r["id"] for r in records}) == SAMPLES
    by_endpoint = {url: sum(r["endpoint"] == url for r in records) for url in (dying.url, healthy.url)}
    assert by_endpoint[dying.url] > 0 and by_endpoint[healthy.url] > by_endpoint[dying.url]


def test_whole_fleet_dead_fails_clearly_then_resumes(tmp_path: Path, shard: tuple[LocalStorage, ShardManifest]) -> None:
    storage, prompts = shard
    port = free_port()
    first = start_simulator(tmp_path, "--decode-ms-per-token", "2", port=port)
    import threading

    # Killed once a few answers were sent, not after a fixed time: on a loaded machine none may have been by then.
    threading.Thread(target=stop_once_answered, args=[first, 30.0, 3], daemon=True).start()
    with pytest.raises(FleetUnavailable, match=r"every SGLang endpoint is failing|failed 12 attempts"):
        run_generate(prompts, storage, settings(first.url))
    checkpointed = load_checkpoints(storage, prompts).answers
    assert 0 < len(checkpointed) < SAMPLES

    revived = start_simulator(tmp_path, port=port)  # appends to the same record file
    try:
        manifest, resumed = generate_counting(revived, prompts, storage)
    finally:
        stop(revived)
    assert resumed == SAMPLES - len(checkpointed)
    assert len({r["id"] for r in raw_records(storage, manifest)}) == SAMPLES


def test_a_fleet_flaky_everywhere_is_kept_whole_and_answers_every_sample(
    tmp_path: Path, shard: tuple[LocalStorage, ShardManifest]
) -> None:
    """21% of first answers fail on both servers (queue full, abort, reset, 500): every sample is answered once, by
    both servers, and the report says no endpoint was ejected."""
    storage, prompts = shard
    rates = ["--http-503-rate", "0.05", "--abort-rate", "0.05", "--reset-rate", "0.06", "--http-500-rate", "0.05"]
    sims = [start_simulator(tmp_path, *rates, "--fault-seed", str(seed)) for seed in (1, 2)]
    try:
        manifest = run_generate(prompts, storage, settings(*(s.url for s in sims), concurrency=16))
    finally:
        for sim in sims:
            stop(sim)
    records = raw_records(storage, manifest)
    assert len(records) == len({r["id"] for r in records}) == SAMPLES
    assert {r["endpoint"] for r in records} == {s.url for s in sims}
    assert manifest.generation is not None
    assert sum(manifest.generation.retries_by_cause.values()) > 0 and manifest.generation.ejections == 0
