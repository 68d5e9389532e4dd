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


class VersionExists(FinalError):
    """The version is already published with other content: a published version is never changed silently."""


def manifest_key(prepared: PreparedDataset) -> str:
    return prepared.location.key("manifest.json")


def dataset_uri(storage: Storage, location: DatasetLocation) -> str:
    """Where every version of a dataset lives, as a URI: the identity of the dataset's Airflow asset."""
    uri = storage.uri(f"{location.profile}/{location.dataset}")
    return uri if "://" in uri else Path(uri).as_uri()


def sizes_of(storage: Storage, keys: list[str]) -> dict[str, int]:
    """Every file's size in bytes, asked of the storage (a HEAD each on S3, several at once)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=16) as pool:
        return dict(zip(keys, pool.map(storage.size, keys), strict=True))


def _published_before(storage: Storage, key: str, data_files: dict[str, str], overwrite: bool) -> dict[str, Any] | None:
    """The version's manifest when it is published already with these data files; None when it is to be written
    (not published yet, or `overwrite`); raises when it is published with other data."""
    if not storage.exists(key):
        return None
    published: dict[str, Any] = json.loads(storage.get_bytes(key))
    if {k: v for k, v in published["files"].items() if not _is_report(k)} == data_files:
        return published  # the report is drawn again each time (its plots are not byte-stable): only the data counts
    if overwrite:
        log.warning("%s: overwriting a published version with other data (overwrite_version is on)", storage.uri(key))
        return None
    raise VersionExists(
        f"{storage.uri(key)} is already published with other data; a published version is never changed: trigger "
        "with a new version, or with overwrite_version on to replace it"
    )


def _is_report(key: str) -> bool:
    """The dataset report's files: report.json, report.html and its plots, beside the manifest."""
    return Path(key).name in ("report.json", "report.html") or key.endswith(".png")


def _write_manifest(
    prepared: PreparedDataset,
    shards: list[ShardManifest],
    storage: Storage,
    key: str,
    data_files: dict[str, str],
    fleet: list[dict[str, Any]],
    sampling_params: dict[str, Any] | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The dataset's report, then the manifest naming every file with its sha256 and size: written last. Returns
    both."""
    location = prepared.location
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
                "prompts": s.prompts_key,
                "num_prompts": s.num_prompts,
                "train": s.train_key,
                "raw": s.raw_key,
                "records": s.stats["export"].kept,
            }
            for s in shards
        ],
        "files": data_files | report_files,
        "sizes": sizes_of(storage, [*data_files, *report_files]),
    }
    storage.put_bytes(key, json.dumps(manifest, indent=1).encode())
    return manifest, report


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
    overwrite: bool = False,
) -> dict[str, Any]:
    """`sampling_params`: exactly what every /generate request of this version sent, recorded in the manifest.

    A version is immutable: publishing into one that has a manifest already is a no-op when its data files are the
    same (a retried publish), and refused when they differ, unless `overwrite`."""
    location = prepared.location
    shards, missing = finished_shards(prepared, storage)
    if missing:
        raise IncompleteDataset(
            f"{location.dataset} {location.version}: shards {', '.join(missing)} did not finish; clear their failed "
            "tasks (finished answers are kept) and this task publishes once they succeed"
        )
    key = manifest_key(prepared)
    data_files = {s.prompts_key: s.prompts_sha256 for s in shards}  # every file of the version, with its sha256
    data_files |= {k: v for s in shards for k, v in s.files.items()} | prepared.files
    published = _published_before(storage, key, data_files, overwrite)
    if published is None:
        manifest, report = _write_manifest(prepared, shards, storage, key, data_files, fleet, sampling_params)
    else:  # a retried publish: the version stands as it is, report included
        manifest, report = published, json.loads(storage.get_bytes(location.key("report.json")))
        log.info("%s %s is already published with the same data: nothing to do", location.dataset, location.version)
    stages = manifest["stages"]
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
