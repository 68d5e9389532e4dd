"""What a storage root holds, for people: each dataset's last published version in full, one page of its other
versions, two versions side by side, and the versions still being made, shard by shard. Read from what the pipeline
writes (latest.json, manifests, dataset reports, prepare records, listings, the progress generate writes), never from
task logs. Airflow-free: the UI plugin only wires it (plugins/regen_airflow/drafter_ui.py).

A cold load reads what it shows and no more: a LIST of each dataset's versions (one request per 1,000), latest.json,
the latest version's manifest and report, and one manifest (or prepare record and listing) per version of the page
shown. A version's report is read when someone asks for it (`Catalog.version`).
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from regen.layout import DatasetLocation, dataset_prefix, latest_key, report_writer
from regen.reasons import OK
from regen.storage import Storage
from regen.ui import progress
from regen.ui.caches import PublishedSummaries
from regen.ui.documents import (
    INDEX_FILE_BYTES,
    SMALL_FILE_BYTES,
    UNREADABLE,
    LatestView,
    ManifestView,
    PreparedView,
    ProgressView,
    ReportView,
    read_view,
)

READ_THREADS = 8  # small files, one GET each: several at once (each holds at most one capped file in memory)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """How much the page reads. A version none of whose files changed for `abandoned_after_s` is abandoned: shown
    as such, its shards not read (a run that failed and was never resumed stays in storage for ever)."""

    page_size: int = 20
    abandoned_after_s: float = 24 * 3600.0
    small_file_bytes: int = SMALL_FILE_BYTES
    index_file_bytes: int = INDEX_FILE_BYTES
    clock: Callable[[], float] = time.time


@dataclass(frozen=True)
class Overview:
    """One page of the catalog: per dataset its latest published version and one page of the others; and the
    unpublished versions among those, shard by shard (`runs`)."""

    datasets: list[dict[str, Any]]
    runs: list[dict[str, Any]] = field(default_factory=list)


# Versions are ordered without reading them: sorting by when each was published would mean reading every manifest,
# which is what a cold load must not do. A version is its DAG run's id made storage-safe (layout.version_from_run_id:
# `manual__2026-12-01T02:08:36.123456+00:00` -> `manual__2026-12-01T02-08-36.123456-00-00`), and Airflow's run ids
# carry the time the run was made, in UTC: that time, found in the name, orders them, then the name. The offset's
# sign is lost in the safe form, so it is not read (Airflow writes +00:00). Names with no time in them (a version
# given by hand) come after, in natural order (night-10 before night-9).
RUN_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2})[-:](\d{2})[-:](\d{2})(?:\.(\d{1,6}))?")


def version_order(version: str) -> tuple[bool, tuple[int, ...], tuple[tuple[int, int, str], ...], str]:
    """Sort key, newest first when sorted in reverse: (has a run time, the time, the name in natural order, the
    name). The natural order is only worked out for names without a time: a time and the name order the others."""
    found = RUN_TIME.search(version)
    if found is None:
        natural = tuple((1, int(p), "") if p.isdigit() else (0, 0, p) for p in re.split(r"(\d+)", version))
        return False, (), natural, version
    when = (*map(int, found.groups("")[:6]), int((found.group(7) or "").ljust(6, "0")))
    return True, when, (), version


def newest_first(versions: Iterable[str]) -> list[str]:
    return sorted(versions, key=version_order, reverse=True)


class Catalog:
    """One storage root and profile, read with `limits`; `published` keeps published versions' summaries between
    reads (they do not change)."""

    def __init__(
        self, storage: Storage, profile: str, limits: Limits | None = None, published: PublishedSummaries | None = None
    ) -> None:
        self.storage, self.profile = storage, profile
        self.limits = limits or Limits()
        self.published = published

    def location(self, dataset: str, version: str) -> DatasetLocation:
        return DatasetLocation(self.storage.root_uri, self.profile, dataset, version)

    def versions(self, dataset: str) -> list[str]:
        """Every version folder of a dataset, newest first (from their names: one LIST, nothing read)."""
        found = []
        for version in self.storage.folders(dataset_prefix(self.profile, dataset) + "/"):
            try:
                found.append(self.location(dataset, version).version)
            except ValueError as e:  # a folder the pipeline never writes (a name it would refuse): not a version
                log.warning("skipped %r under %s/%s: %s", version, self.profile, dataset, e)
        return newest_first(found)

    def latest_version(self, dataset: str) -> str | None:
        """The version latest.json names (the pipeline moves it only after the manifest landed)."""
        latest = read_view(self.storage, latest_key(self.profile, dataset), LatestView, self.limits.small_file_bytes)
        return None if latest is None else self.location(dataset, latest.version).version

    def summary(self, dataset: str, version: str, full: bool = False) -> dict[str, Any] | None:
        """One version: published (from its manifest; with `full`, its report's numbers and plots too), or still
        being made (prepare's record and a listing); None for an empty folder; `unreadable`, with the error, when
        its files are not what the pipeline writes."""
        location = self.location(dataset, version)  # a name no version can have is the caller's ValueError
        key = (self.storage.root_uri, self.profile, dataset, version)
        cached = self.published.get(key, full) if self.published is not None else None
        if cached is not None:
            return cached
        try:
            found = self._summary(location, full)
        except UNREADABLE as e:
            error = f"its files cannot be read as the pipeline writes them ({type(e).__name__}: {e})"[:300]
            log.warning("%s/%s: %s", dataset, version, error)
            return {"dataset": dataset, "version": version, "state": "unreadable", "error": error}
        if found is not None and found["state"] == "published" and self.published is not None:
            self.published.put(key, full, found)
        return found

    def _summary(self, location: DatasetLocation, full: bool) -> dict[str, Any] | None:
        limits = self.limits
        manifest = read_view(self.storage, location.manifest, ManifestView, limits.index_file_bytes)
        if manifest is not None:
            report_key = location.report_file("report.json", report_writer({"report": manifest.report}))
            report = read_view(self.storage, report_key, ReportView, limits.small_file_bytes) if full else None
            return published(self.storage, location, manifest, report)
        prepared = read_view(self.storage, location.prepared, PreparedView, limits.index_file_bytes)
        listing = self.storage.list_objects(location.prefix + "/")
        now = limits.clock()
        if prepared is not None:
            return progress.unpublished(location, prepared, listing, self._progress, limits.abandoned_after_s, now)
        return progress.preparing(location, listing, limits.abandoned_after_s, now) if listing else None

    def _progress(self, key: str) -> ProgressView | None:
        return read_view(self.storage, key, ProgressView, self.limits.small_file_bytes)

    def version(self, dataset: str, version: str) -> dict[str, Any]:
        """One version in full, on demand: its report's numbers and plots, or its shards."""
        found = self.summary(dataset, version, full=True)
        if found is None:
            raise LookupError(f"{dataset} {version} is not a version")
        return found

    def overview(self, datasets: list[str], page: int = 0) -> Overview:
        """Every dataset's latest published version in full and page `page` of its other versions (newest first),
        each from its manifest alone or, unpublished, from its prepare record and one listing."""
        page = max(page, 0)
        with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:
            rows = [self._dataset(pool, dataset, page) for dataset in datasets]
        runs = [v for row in rows for v in row["versions"] if v["state"] in ("generating", "unpublished")]
        for row in rows:  # shard by shard is for runs in progress; the datasets' rows keep the totals
            row["versions"] = [{k: v for k, v in version.items() if k != "shards"} for version in row["versions"]]
        return Overview(rows, runs)

    def _dataset(self, pool: ThreadPoolExecutor, dataset: str, page: int) -> dict[str, Any]:
        names = self.versions(dataset)
        try:
            latest_name = self.latest_version(dataset)
        except UNREADABLE as e:
            log.warning("%s: latest.json cannot be read: %s", dataset, e)
            latest_name = None
        latest = pool.submit(self.summary, dataset, latest_name, True) if latest_name else None
        others, versions = self._page(pool, dataset, names, latest_name, page)
        latest_row = latest.result() if latest is not None else None
        if latest_row is not None and latest_row["state"] not in ("published", "unreadable"):
            log.warning("%s: latest.json names %s, which is not published; ignoring it", dataset, latest_name)
            latest_row = latest_name = None
            others, versions = self._page(pool, dataset, names, latest_name, page)  # with it, this time
        published_latest = latest_row is not None and latest_row["state"] == "published"
        return {
            "dataset": dataset,
            "latest": latest_row,
            "previous": self._previous(dataset, names, latest_name) if published_latest else None,
            "versions": versions,
            "page": page,
            "pages": max(1, -(-len(others) // self.limits.page_size)),
            "others": len(others),
        }

    def _page(
        self, pool: ThreadPoolExecutor, dataset: str, names: list[str], latest: str | None, page: int
    ) -> tuple[list[str], list[dict[str, Any]]]:
        """The versions other than the latest, and page `page` of them summarized."""
        size = self.limits.page_size
        others = [name for name in names if name != latest]
        shown = others[page * size : (page + 1) * size]
        return others, [v for v in pool.map(lambda name: self.summary(dataset, name), shown) if v is not None]

    def _previous(self, dataset: str, names: list[str], latest: str | None) -> str | None:
        """The published version before the latest, for "compare with previous": looked for among the next page's
        worth of older versions (their summaries are kept, so usually no read at all)."""
        if latest not in names:
            return None
        start = names.index(latest) + 1
        for name in names[start : start + self.limits.page_size]:
            found = self.summary(dataset, name)
            if found is not None and found["state"] == "published":
                return name
        return None

    def compare(self, dataset: str, before: str, after: str) -> dict[str, Any]:
        """Two published versions side by side: their numbers, and how each changed (after - before)."""
        sides = {}
        for side, version in (("before", before), ("after", after)):
            summary = self.summary(dataset, version, full=True)
            if summary is None or summary["state"] != "published":
                raise LookupError(f"{dataset} {version} is not a published version")
            sides[side] = summary
        return comparison(dataset, sides["before"], sides["after"])


def published(
    storage: Storage, location: DatasetLocation, manifest: ManifestView, report: ReportView | None
) -> dict[str, Any]:
    """A published version's row: the manifest's numbers, and with its report those of its answers and plots."""
    rejected: Counter[str] = Counter(manifest.prepare.get("dropped_by_reason", {}))
    for stage in ("generate", "validate"):
        rejected.update(manifest.stages.get(stage, {}).get("dropped_by_reason", {}))
    truncation = report.truncation_rate if report is not None else {}
    return {
        "dataset": location.dataset,
        "version": location.version,
        "state": "published",
        "detail": "full" if report is not None else "manifest",
        "published_at": manifest.published_at,
        "run_id": manifest.run_id,
        "records": manifest.records,
        "truncated": manifest.splits.get("truncated", 0),
        "validation": manifest.splits.get("validation", 0),
        "vocab": manifest.vocab,
        "answered": report.answered if report is not None else None,
        "rejected": sum(rejected.values()),
        "rejected_by_reason": dict(rejected.most_common()),
        "truncation_rate": round(sum(truncation.values()), 4) if truncation else None,
        "tool_call_rate": report.tool_call_rate if report is not None else None,
        "retokenize_drift": report.retokenize_drift if report is not None else manifest.retokenize_drift,
        "tokens": report.tokens if report is not None else {},
        "lengths": report.lengths if report is not None else {},
        "histograms": report.histograms if report is not None else {},
        "verdicts": report.verdicts if report is not None else {},
        "length_prediction": report.length_prediction if report is not None else {},
        "profile": manifest.profile.get("name"),
        "template_sha256": manifest.profile.get("chat_template_sha256"),
        "manifest": storage.uri(location.manifest),
        "report": storage.uri(location.report_file("report.html", report_writer({"report": manifest.report}))),
        "verified": manifest.verified,
        "cost": manifest.cost or {},
        "eval_suites": eval_suites(manifest.decontamination),
    }


def eval_suites(cleaned: dict[str, Any]) -> list[dict[str, Any]]:
    """The eval suites a version's prompts were cleaned against: name, sha256 and the prompts each rejected."""
    rejected = cleaned.get("rejected_by_suite") or {}
    return [
        {"name": str(s["name"]), "sha256": str(s["sha256"]), "rejected": int(rejected.get(s["name"], 0))}
        for s in cleaned.get("suites") or []
    ]


def comparison(dataset: str, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
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
