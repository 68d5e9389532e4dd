"""Stage 6: a dataset version becomes visible. `manifest.json` is written last, only when every shard is finished.

Before it: the dataset's report (report.json, report.html and its plots) beside where the manifest goes. The manifest
names every file of the version with its sha256, the splits, the counts of every stage, and exactly which template
and tokenizer rendered the prompts.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from regen.errors import FinalError
from regen.export import shard_report_key
from regen.inputs import record_published
from regen.manifest import DatasetLocation, PreparedDataset, ShardManifest, StageStats
from regen.quality import dataset_report, read_verdicts, write_dataset_report
from regen.storage import Storage

log = logging.getLogger(__name__)

STAGES = ("generate", "validate", "export")


class IncompleteDataset(FinalError):
    """Cannot succeed until the failed shards are cleared."""


def manifest_key(prepared: PreparedDataset) -> str:
    return prepared.location.key("manifest.json")


def dataset_uri(storage: Storage, location: DatasetLocation) -> str:
    """Where every version of a dataset lives, as a URI: the identity of the dataset's Airflow asset."""
    uri = storage.uri(f"{location.profile}/{location.dataset}")
    return uri if "://" in uri else Path(uri).as_uri()


def finished_shards(prepared: PreparedDataset, storage: Storage) -> tuple[list[ShardManifest], list[str]]:
    finished, missing = [], []
    for shard in prepared.shards:
        key = shard_report_key(shard)
        if storage.exists(key):
            finished.append(ShardManifest.from_dict(json.loads(storage.get_bytes(key))))
        else:
            missing.append(shard.name)
    return finished, missing


def run_publish(
    prepared: PreparedDataset,
    storage: Storage,
    fleet: list[dict[str, Any]],
    sampling_params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`sampling_params`: exactly what every /generate request of this version sent, recorded in the manifest."""
    location = prepared.location
    shards, missing = finished_shards(prepared, storage)
    if missing:
        raise IncompleteDataset(
            f"{location.dataset} {location.version}: shards {', '.join(missing)} did not finish; clear their failed "
            "tasks (finished answers are kept) and this task publishes once they succeed"
        )
    stages = {stage: StageStats.merged([s.stats[stage] for s in shards]).to_dict() for stage in STAGES}
    generations = [s.generation for s in shards if s.generation]
    verdicts = read_verdicts(storage, shards)
    report = dataset_report(verdicts, generations)
    title = f"{location.dataset} {location.version} ({location.profile})"
    report_files = write_dataset_report(storage, location.prefix, title, verdicts, report)
    manifest = {
        "dataset": location.dataset,
        "profile": prepared.profile,
        "token_roles": prepared.token_roles,
        "version": location.version,
        "root": storage.root_uri,
        "published_at": datetime.now(UTC).isoformat(),
        "prepare": {**prepared.stats.to_dict(), "rows_read": prepared.rows_read, "duplicates": prepared.duplicates},
        "stages": stages,
        "records": report.get("train_records", 0),
        "splits": {"train": report.get("train_records", 0), "truncated": report.get("truncated_records", 0)},
        "report": {"json": storage.uri(location.key("report.json")), "html": storage.uri(location.key("report.html"))},
        "retokenize_drift": report.get("retokenize_drift"),
        "sampling_params": sampling_params,
        "inputs": prepared.inputs,
        "fleet": fleet,
        "shards": [
            {
                "shard": s.name,
                "prompts": s.num_prompts,
                "train": s.train_key,
                "raw": s.raw_key,
                "records": s.stats["export"].kept,
            }
            for s in shards
        ],
        "files": {k: v for s in shards for k, v in s.files.items()} | prepared.files | report_files,
    }
    key = manifest_key(prepared)
    storage.put_bytes(key, json.dumps(manifest, indent=1).encode())
    latest = {
        "version": location.version,
        "manifest": storage.uri(key),
        "inputs_digest": prepared.inputs.get("digest"),
        "published_at": manifest["published_at"],
        "records": manifest["records"],
    }
    record_published(storage, location.profile, location.dataset, latest)
    log.info(
        "published %s %s: %d training records -> %s",
        location.dataset,
        location.version,
        manifest["records"],
        storage.uri(key),
    )
    drift = report.get("retokenize_drift") or {}
    log.info(
        "%s: %d answers -> %d train, %d truncated, %d rejected %s; tool-call rate %s; re-tokenisation drift %s of %s "
        "sampled; report: %s",
        location.dataset,
        report.get("answered", 0),
        report.get("train_records", 0),
        report.get("truncated_records", 0),
        report.get("rejected_records", 0),
        {k: v for k, v in report.get("verdicts", {}).items() if k != "ok"},
        report.get("tool_call_rate"),
        drift.get("drifted"),
        drift.get("sampled"),
        storage.uri(location.key("report.html")),
    )
    return {
        "dataset": location.dataset,
        "version": location.version,
        "dataset_uri": dataset_uri(storage, location),
        "inputs_digest": latest["inputs_digest"],
        "manifest": storage.uri(key),
        "report": manifest["report"]["html"],
        "records": manifest["records"],
        "splits": manifest["splits"],
        "retokenize_drift": manifest["retokenize_drift"],
        "stages": stages,
        "prepare": manifest["prepare"],
        "generation": [dataclasses.asdict(s.generation) for s in shards if s.generation],
    }
