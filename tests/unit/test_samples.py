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
from tests.conftest import Simulator, raw_answers

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


@pytest.fixture
def deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    source = tmp_path / "B1.jsonl"
    shutil.copy(ROOT / "data" / "samples" / "B1_glaive.jsonl", source)
    dataset = {"format": "openai_messages", "paths": [str(source)], "samples_per_prompt": 3, "temperatures": [0.6, 1.0]}
    config = {
        "defaults": {"storage_root": str(tmp_path / "storage"), "shard_size": 10, "tokenize_workers": 1},
        "datasets": {DATASET: dataset},
    }
    (tmp_path / "regen.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("REGEN_CONFIG", str(tmp_path / "regen.yaml"))
    return tmp_path


def test_six_samples_per_prompt_each_answered_once_with_what_was_sent(deployment: Path, simulator: Simulator) -> None:
    run = pipeline.RunSpec(**pipeline.plan({"endpoints": [simulator.url], "limit": PROMPTS}, "samples"))
    [prepared] = [pipeline.prepare_dataset(run, DATASET)]
    sent_before = len(simulator.records())
    for shard in [s for group in pipeline.shard_groups([prepared], 256) for s in group]:
        pipeline.export_shard(run, pipeline.validate_shard(run, pipeline.generate_shard(run, shard)))
    published = pipeline.publish_dataset(run, prepared, [], pipeline.verify_dataset(run, prepared))

    storage = deployment / "storage"
    prompts = [row for s in prepared["shards"] for row in pq.read_table(storage / s["prompts_key"]).to_pylist()]
    assert len(prompts) == 6 * PROMPTS and len({p["id"] for p in prompts}) == 6 * PROMPTS
    per_prompt = Counter(p["id"].split("@")[0] for p in prompts)
    assert set(per_prompt.values()) == {6} and len(per_prompt) == PROMPTS
    assert len({p["sampling_seed"] for p in prompts}) == 6 * PROMPTS  # every seed distinct, and recorded
    assert Counter(p["temperature"] for p in prompts) == {0.6: 3 * PROMPTS, 1.0: 3 * PROMPTS}

    # Each sample was requested exactly once, with its own temperature and seed.
    sent = {r["rid"]: r for r in simulator.records()[sent_before:]}
    local = LocalStorage(storage)
    raw = [run.location(DATASET).shard(s["shard"]).raw for s in prepared["shards"]]
    answered = {a["id"]: a for key in raw for a in raw_answers(local, key)}
    assert len(sent) == len(answered) == 6 * PROMPTS
    by_id = {p["id"]: p for p in prompts}
    for sample_id, answer in answered.items():
        request = sent[answer["rid"]]["sampling"]
        assert request == {
            "temperature": by_id[sample_id]["temperature"],
            "sampling_seed": by_id[sample_id]["sampling_seed"],
        }

    # The training records carry them too.
    train = pq.read_table(Path(published["manifest"]).parent / "train").to_pylist()
    assert train and all(
        (r["sampling_seed"], round(r["temperature"], 3))
        == (by_id[r["id"]]["sampling_seed"], by_id[r["id"]]["temperature"])
        for r in train
    )
