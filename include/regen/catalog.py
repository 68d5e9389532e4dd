"""What a storage root holds, for people: every dataset's versions with their numbers, two versions side by side,
and the versions still being made, shard by shard. Read from what the pipeline writes (manifests, dataset reports,
prepare records, shard reports and the progress generate writes), never from task logs. Airflow-free: the UI plugin
only wires it (plugins/regen_airflow/drafter_ui.py).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from regen.layout import DatasetLocation, dataset_prefix
from regen.reasons import OK
from regen.storage import Storage, is_not_found

READ_THREADS = 16  # small JSON files, one GET each: read several at once
# What a file of another schema, or not JSON at all, raises while its numbers are read: one version's row says so,
# and the page stays up.
UNREADABLE = (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError, OverflowError)

log = logging.getLogger(__name__)


def _json(storage: Storage, key: str) -> dict[str, Any] | None:
    """A small JSON file, or None when it is not there (yet, or any more); any other failure is the page's error."""
    try:
        return dict(json.loads(storage.get_bytes(key)))
    except Exception as e:
        if is_not_found(e):
            return None
        raise


def _published(storage: Storage, location: DatasetLocation, manifest: dict[str, Any]) -> dict[str, Any]:
    report = _json(storage, location.report_file("report.json")) or {}
    stages = manifest.get("stages", {})
    rejected: Counter[str] = Counter(manifest.get("prepare", {}).get("dropped_by_reason", {}))
    for stage in ("generate", "validate"):
        rejected.update(stages.get(stage, {}).get("dropped_by_reason", {}))
    answered = report.get("answered", 0)
    truncation = report.get("truncation_rate", {})
    profile = manifest.get("profile", {})
    return {
        "dataset": location.dataset,
        "version": location.version,
        "state": "published",
        "published_at": manifest.get("published_at"),
        "run_id": manifest.get("run_id"),
        "records": manifest.get("records", 0),
        "truncated": manifest.get("splits", {}).get("truncated", 0),
        "answered": answered,
        "rejected": sum(rejected.values()),
        "rejected_by_reason": dict(rejected.most_common()),
        "truncation_rate": round(sum(truncation.values()), 4) if truncation else None,
        "tool_call_rate": report.get("tool_call_rate"),
        "retokenize_drift": report.get("retokenize_drift"),
        "tokens": report.get("tokens", {}),
        "lengths": report.get("lengths", {}),
        "histograms": report.get("histograms", {}),
        "verdicts": report.get("verdicts", {}),
        "profile": profile.get("name"),
        "template_sha256": profile.get("chat_template_sha256"),
        "manifest": storage.uri(location.manifest),
        "report": storage.uri(location.report_file("report.html")),
        "verified": manifest.get("verified"),
        "cost": manifest.get("cost") or {},
    }


def _unpublished(storage: Storage, location: DatasetLocation, prepared: dict[str, Any]) -> dict[str, Any]:
    """A version whose manifest is not written: shard by shard, finished, generating (with its progress) or waiting."""
    shards = []
    for shard in prepared.get("shards", []):
        keys = location.shard(shard["shard"])
        total = shard.get("num_answers") or shard["num_prompts"]  # on-policy: every turn is an answer
        if storage.exists(keys.report):
            shards.append({"shard": keys.name, "state": "finished", "done": total, "total": total})
            continue
        progress = _json(storage, keys.progress)
        if storage.exists(keys.raw):
            shards.append({"shard": keys.name, "state": "generated", "done": total, "total": total})
        elif progress is not None:
            shards.append({"shard": keys.name, "state": "generating", **_rates(progress, total)})
        else:
            shards.append({"shard": keys.name, "state": "waiting", "done": 0, "total": total})
    done = sum(s["done"] for s in shards)
    total = sum(s["total"] for s in shards)
    generating = [s for s in shards if s["state"] == "generating"]
    in_flight = sum(s["in_flight"] for s in generating)
    slots = sum(s["concurrency"] for s in generating)
    rate = sum(s["requests_per_s"] for s in generating)
    return {
        "dataset": location.dataset,
        "version": location.version,
        "state": "generating" if generating else "unpublished",
        "prepared_at": prepared.get("prepared_at"),
        "run_id": prepared.get("run_id"),
        "prompts": total,
        "done": done,
        "shards": shards,
        "requests_per_s": round(rate, 2),
        "eta_s": round((total - done) / rate) if rate > 0 else None,
        "in_flight": in_flight,
        "utilisation": round(in_flight / slots, 3) if slots else None,
        "retries_by_cause": dict(sum((Counter(s["retries_by_cause"]) for s in generating), Counter())),
    }


def _rates(progress: dict[str, Any], total: int) -> dict[str, Any]:
    """One generating shard's numbers from its progress file: what the generate task wrote at its last flush."""
    elapsed = max(progress["updated_at"] - progress["started_at"], 1e-9)
    rate = progress["answered"] / elapsed
    done = progress["done"]
    return {
        "done": done,
        "total": total,
        "requests_per_s": round(rate, 2),
        "eta_s": round((total - done) / rate) if rate > 0 else None,
        "in_flight": progress["in_flight"],
        "concurrency": progress["concurrency"],
        "retries_by_cause": progress["retries_by_cause"],
        "updated_at": progress["updated_at"],
        "stale_s": round(time.time() - progress["updated_at"], 1),
    }


def version_summary(storage: Storage, location: DatasetLocation) -> dict[str, Any] | None:
    """One version: published (from its manifest and report), or still being made (from prepare's record and its
    shards); None when it holds neither yet; `unreadable`, with the error, when its files are not what the pipeline
    writes."""
    try:
        return _version_summary(storage, location)
    except UNREADABLE as e:
        error = f"its files cannot be read as the pipeline writes them ({type(e).__name__}: {e})"[:300]
        log.warning("%s/%s: %s", location.dataset, location.version, error)
        return {"dataset": location.dataset, "version": location.version, "state": "unreadable", "error": error}


def _version_summary(storage: Storage, location: DatasetLocation) -> dict[str, Any] | None:
    manifest = _json(storage, location.manifest)
    if manifest is not None:
        return _published(storage, location, manifest)
    prepared = _json(storage, location.prepared)
    if prepared is not None:
        return _unpublished(storage, location, prepared)
    return None


def dataset_versions(storage: Storage, profile: str, dataset: str) -> list[dict[str, Any]]:
    """Every version of a dataset, newest first."""
    locations = []
    for version in storage.folders(dataset_prefix(profile, dataset) + "/"):
        try:
            locations.append(DatasetLocation(storage.root_uri, profile, dataset, version))
        except ValueError as e:  # a folder the pipeline never writes (a name it would refuse): not a version
            log.warning("skipped %r under %s/%s: %s", version, profile, dataset, e)
    with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:
        found = [v for v in pool.map(lambda loc: version_summary(storage, loc), locations) if v is not None]
    return sorted(found, key=lambda v: str(v.get("published_at") or v.get("prepared_at") or ""), reverse=True)


def overview(storage: Storage, profile: str, datasets: list[str]) -> list[dict[str, Any]]:
    """Every configured dataset with its versions, newest first, and the last published one's numbers."""
    rows = []
    for dataset in datasets:
        versions = dataset_versions(storage, profile, dataset)
        published = [v for v in versions if v["state"] == "published"]
        rows.append({"dataset": dataset, "latest": published[0] if published else None, "versions": versions})
    return rows


def in_progress(storage: Storage, profile: str, datasets: list[str]) -> list[dict[str, Any]]:
    """Every version not published yet, across the datasets."""
    versions = (v for dataset in datasets for v in dataset_versions(storage, profile, dataset))
    return [v for v in versions if v["state"] not in ("published", "unreadable")]


def compare(storage: Storage, profile: str, dataset: str, before: str, after: str) -> dict[str, Any]:
    """Two published versions side by side: their numbers, and how each changed (after - before)."""
    sides = {}
    for side, version in (("before", before), ("after", after)):
        summary = version_summary(storage, DatasetLocation(storage.root_uri, profile, dataset, version))
        if summary is None or summary["state"] != "published":
            raise LookupError(f"{dataset} {version} is not a published version")
        sides[side] = summary
    a, b = sides["before"], sides["after"]
    verdicts = sorted(set(a["verdicts"]) | set(b["verdicts"]), key=lambda v: (v != OK, v))
    return {
        "dataset": dataset,
        "before": a,
        "after": b,
        "changes": {
            key: _delta(a.get(key), b.get(key))
            for key in ("records", "truncated", "rejected", "truncation_rate", "tool_call_rate")
        },
        "verdicts": [
            {"verdict": v, "before": a["verdicts"].get(v, 0), "after": b["verdicts"].get(v, 0)} for v in verdicts
        ],
        "lengths": {
            name: {"before": a["lengths"].get(name), "after": b["lengths"].get(name)}
            for name in sorted(set(a["lengths"]) | set(b["lengths"]))
        },
    }


def _delta(before: Any, after: Any) -> Any:
    if isinstance(before, int | float) and isinstance(after, int | float):
        return round(after - before, 4)
    return None
