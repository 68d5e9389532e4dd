"""Several answers per prompt: each prompt at each temperature, n times, every sample with its own stable id and
explicit seed, each answered exactly once and recorded with what was sent."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from pydantic import ValidationError

from regen import pipeline
from regen.config import DatasetConfig
from regen.samples import samples_of, seed_of
from regen.storage import LocalStorage
from tests.conftest import Simulator, each_shard, raw_answers

ROOT = Path(__file__).resolve().parents[2]
DATASET = "B1_glaive"
PROMPTS = 4


def test_each_prompt_gets_n_samples_at_each_temperature_with_their_own_seeds() -> None:
    samples = samples_of("p1", [0.6, 1.0], 3)
    assert [(s.temperature, s.index) for s in samples] == [(t, i) for t in (0.6, 1.0) for i in range(3)]
    assert [s.id for s in samples][:2] == ["p1@t0.6#0", "p1@t0.6#1"]
    assert len({s.id for s in samples}) == len({s.seed for s in samples}) == 6
    assert samples == samples_of("p1", [0.6, 1.0], 3)  # stable: a rerun sends the same seeds
    assert all(s.seed == seed_of(s.id) and 0 <= s.seed < 2**31 for s in samples)
    assert samples_of("p1", None, 1)[0] == samples_of("p1", None, 1)[0]
    [single] = samples_of("p1", None, 1)
    assert (single.id, single.temperature, single.seed) == ("p1", None, None)  # one answer: the run's sampling


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"temperatures": [-0.5]}, "each must be 0 or more"),
        ({"temperatures": [0.6, 0.6]}, "each once"),
        ({"samples_per_prompt": 0}, "greater than or equal to 1"),
    ],
)
def test_bad_sampling_plans_fail_at_load(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        DatasetConfig(paths=["x.jsonl"], **fields)


def deploy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, per_prompt: int, temperatures: list[float]) -> Path:
    source = tmp_path / "B1.jsonl"
    shutil.copy(ROOT / "data" / "samples" / "B1_glaive.jsonl", source)
    dataset = {
        "format": "openai_messages",
        "paths": [str(source)],
        "samples_per_prompt": per_prompt,
        "temperatures": temperatures,
    }
    config = {
        "defaults": {"storage_root": str(tmp_path / "storage"), "shard_size": 10, "tokenize_workers": 1},
        "governance": {"allowed_endpoints": ["127.0.0.1"]},  # the test's simulator, on a port of its own
        "datasets": {DATASET: dataset},
    }
    (tmp_path / "regen.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("REGEN_CONFIG", str(tmp_path / "regen.yaml"))
    return tmp_path


@pytest.fixture
def deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return deploy(tmp_path, monkeypatch, 3, [0.6, 1.0])


def shards(run: pipeline.RunSpec) -> list[dict[str, Any]]:
    return [s.to_dict() for s in pipeline.prepared_version(run, DATASET).shards]


def run_through(run: pipeline.RunSpec) -> dict[str, Any]:
    """prepare -> generate, validate, export every shard -> verify -> publish, as the DAG does: what was published."""
    prepared = pipeline.prepare_dataset(run, DATASET)
    for shard in each_shard(run, [prepared]):
        pipeline.export_shard(run, pipeline.validate_shard(run, pipeline.generate_shard(run, shard)))
    return pipeline.publish_dataset(run, prepared, [], pipeline.verify_dataset(run, prepared))


def test_six_samples_per_prompt_each_answered_once_with_what_was_sent(deployment: Path, simulator: Simulator) -> None:
    run = pipeline.RunSpec(**pipeline.plan({"endpoints": [simulator.url], "limit": PROMPTS}, "samples"))
    sent_before = len(simulator.records())
    published = run_through(run)

    storage = deployment / "storage"
    prompts = [row for s in shards(run) for row in pq.read_table(storage / s["prompts_key"]).to_pylist()]
    assert len(prompts) == 6 * PROMPTS and len({p["id"] for p in prompts}) == 6 * PROMPTS
    per_prompt = Counter(p["id"].split("@")[0] for p in prompts)
    assert set(per_prompt.values()) == {6} and len(per_prompt) == PROMPTS
    assert len({p["sampling_seed"] for p in prompts}) == 6 * PROMPTS  # every seed distinct, and recorded
    assert Counter(p["temperature"] for p in prompts) == {0.6: 3 * PROMPTS, 1.0: 3 * PROMPTS}

    # Each sample was requested exactly once, with its own temperature and seed.
    sent = {r["rid"]: r for r in simulator.records()[sent_before:]}
    local = LocalStorage(storage)
    raw = [run.location(DATASET).shard(s["shard"]).raw for s in shards(run)]
    answered = {a["id"]: a for key in raw for a in raw_answers(local, key)}
    assert len(sent) == len(answered) == 6 * PROMPTS
    by_id = {p["id"]: p for p in prompts}
    for sample_id, answer in answered.items():
        request = sent[answer["rid"]]["sampling"]
        assert request == {
            "temperature": by_id[sample_id]["temperature"],
            "sampling_seed": by_id[sample_id]["sampling_seed"],
        }

    # The training records carry them too, exactly.
    train = pq.read_table(Path(published["manifest"]).parent / "train").to_pylist()
    assert train and all(
        (r["sampling_seed"], r["temperature"]) == (by_id[r["id"]]["sampling_seed"], by_id[r["id"]]["temperature"])
        for r in train
    )


def test_a_training_record_keeps_the_temperature_its_request_sent_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, simulator: Simulator
) -> None:
    """0.3 stored as float32 reads back as 0.30000001192092896: a trainer grouping records by temperature, or
    matching them to the config's, would find none at 0.3."""
    temperatures = [0.3, 0.7, 1.1]
    deployment = deploy(tmp_path, monkeypatch, 1, temperatures)
    run = pipeline.RunSpec(**pipeline.plan({"endpoints": [simulator.url], "limit": 2}, "exact-temperatures"))
    sent_before = len(simulator.records())
    published = run_through(run)

    sent = {r["rid"]: r["sampling"]["temperature"] for r in simulator.records()[sent_before:]}
    local = LocalStorage(deployment / "storage")
    raw = [run.location(DATASET).shard(s["shard"]).raw for s in shards(run)]
    rid_of = {a["id"]: a["rid"] for key in raw for a in raw_answers(local, key)}
    train_files = sorted((Path(published["manifest"]).parent / "train").glob("*.parquet"))
    records = [r for path in train_files for r in pq.read_table(path).to_pylist()]
    assert len(records) == len(rid_of) == 2 * len(temperatures)  # every answer valid, each in one record
    assert sorted(r["temperature"] for r in records) == sorted(temperatures * 2)  # 0.3 == 0.3, exactly
    for record in records:
        assert record["temperature"] == sent[rid_of[record["id"]]]  # the float the request sent
        assert record["id"].endswith(f"@t{record['temperature']:g}#0")
