"""What a dataset version is made from, as one digest: its sources' content, the dataset's config, the profile with
its template and tokenizer files, the sampling and the limit.

A nightly run skips a dataset whose digest equals that of its last published version: the same inputs would only
spend GPU time on another draw of the same distribution. `latest.json` beside a dataset's versions names the last
published one and its digest. It only moves forward, by the logical date of the run that made the version (recorded
with its inputs when it was first prepared, so a version resumed later keeps its own date): a resumed older version
never repoints it, and two publishers racing cannot move it back either (every change is conditional on the
latest.json it read).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import tempfile
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from regen.config import DatasetConfig
from regen.layout import VERDICTS_SUFFIX, DatasetLocation, latest_key
from regen.manifest import PublishedManifest
from regen.scratch import scratch_table
from regen.storage import Changed, KeyExists, Storage, get_json, is_not_found, read_table

log = logging.getLogger(__name__)


def canonical_digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def dataset_inputs(
    config: DatasetConfig,
    profile: dict[str, Any],
    sampling: dict[str, Any],
    limit: int | None,
    sources: dict[str, str] | None,
    decontamination: dict[str, Any] | None = None,
    validation_share: float = 0.0,
    export: Mapping[str, bool] | None = None,
) -> dict[str, Any]:
    """Everything that decides what a version holds, and its digest (None when a source cannot be pinned).
    `profile`: the profile's record with its template and tokenizer-file hashes (ChatRenderer.fingerprint);
    `sources`: each source's content identity (regen.stages.prepare.sources.source_digests); `decontamination`: the eval
    suites' record (regen.stages.prepare.eval_suites), an input only when there are suites (earlier digests stand);
    `validation_share`: the source prompts held out (regen.holdout), an input only when some are; `export`: the
    export options (a review text column, JSON Lines files), each an input only when on (earlier digests stand)."""
    # Library versions are recorded in manifests but are not inputs: an upgrade that renders the same ids is no change.
    pinned_profile = {k: v for k, v in profile.items() if not k.endswith("_version")}
    inputs: dict[str, Any] = {
        "sources": sources,
        "dataset": _dataset_inputs(config),
        "profile": pinned_profile,
        "sampling": sampling,
        "limit": limit,
    }
    if decontamination:
        inputs["decontamination"] = {k: v for k, v in decontamination.items() if k != "rejected_by_suite"}
    if validation_share:
        inputs["validation_share"] = validation_share
    if export and any(export.values()):
        inputs["export"] = {name: True for name, on in sorted(export.items()) if on}
    return {**inputs, "digest": canonical_digest(inputs) if sources is not None else None}


LATER_FIELDS = ("samples_per_prompt", "temperatures", "tool_result_names")  # added after versions were published


def _dataset_inputs(config: DatasetConfig) -> dict[str, Any]:
    """The dataset's config as an input; a field added later counts only when set, so versions published before
    it existed stay unchanged."""
    dataset = config.model_dump(mode="json", exclude={"description"})
    for name in LATER_FIELDS:
        if dataset[name] == DatasetConfig.model_fields[name].default:
            del dataset[name]
    return dataset


def latest_published(storage: Storage, profile: str, dataset: str) -> dict[str, Any] | None:
    """The last published version of a dataset (version, manifest URI, inputs digest), if its manifest still exists."""
    key = latest_key(profile, dataset)
    if not storage.exists(key):
        return None
    latest = get_json(storage, key)
    manifest = DatasetLocation(storage.root_uri, profile, dataset, latest["version"]).manifest
    if not storage.exists(manifest):
        log.warning("%s: latest.json names version %s, whose manifest is gone; ignoring it", dataset, latest["version"])
        return None
    expected = latest.get("manifest_sha256")
    if expected and hashlib.sha256(storage.get_bytes(manifest)).hexdigest() != expected:
        log.warning("%s: version %s's manifest is not the one published; ignoring it", dataset, latest["version"])
        return None
    return dict(latest)


def latest_of_another_profile(storage: Storage, profile: str, dataset: str) -> dict[str, Any] | None:
    """The newest published version of the dataset under another profile (another target model), marked with its
    `profile`: its answers predict this model's lengths well enough to order by (the order is what matters)."""
    found = []
    for other in storage.folders(""):
        if other == profile:
            continue
        try:
            latest = latest_published(storage, other, dataset)
        except ValueError:  # a folder that is no profile's name
            continue
        if latest is not None:
            found.append({**latest, "profile": other})
    return max(found, key=_order) if found else None


class AnswerLengths(Mapping[str, int]):
    """Each sample's answer length (output tokens) in a dataset's last published version, by sample id, in an SQLite
    table on local disk, so the reader's memory does not grow with the dataset (a dict took about 130 bytes a
    sample: 1.3 GB at 10^7; bench/bench_answer_lengths.py). A context manager: the table is removed on exit."""

    def __init__(self) -> None:
        self._folder = tempfile.TemporaryDirectory(prefix="regen-answer-lengths-")
        self.path = Path(self._folder.name) / "lengths.sqlite3"
        self._db = scratch_table(
            self.path, "CREATE TABLE lengths (id TEXT PRIMARY KEY, tokens INTEGER NOT NULL) WITHOUT ROWID"
        )
        self._count = 0

    def add(self, sample_ids: list[str], tokens: list[int]) -> None:
        """A version's sample ids are unique: a repeat keeps the first."""
        added = self._db.executemany(
            "INSERT OR IGNORE INTO lengths VALUES (?, ?)", zip(sample_ids, tokens, strict=True)
        )
        self._count += added.rowcount

    def __getitem__(self, sample_id: str) -> int:
        row = self._db.execute("SELECT tokens FROM lengths WHERE id = ?", (sample_id,)).fetchone()
        if row is None:
            raise KeyError(sample_id)
        return int(row[0])

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[str]:
        return (sample_id for (sample_id,) in self._db.execute("SELECT id FROM lengths ORDER BY id"))

    def __enter__(self) -> AnswerLengths:
        return self

    def __exit__(self, *_: object) -> None:
        self._db.close()
        self._folder.cleanup()


def answer_lengths(storage: Storage, latest: dict[str, Any] | None, location: DatasetLocation) -> AnswerLengths:
    """Every sample's answer length in the dataset's last published version (`latest`, as latest_published gives
    it), from its shards' verdicts: what the next version sends longest first. Empty for a dataset with no version
    yet. A sample id is its prompt's content (with its temperature and draw), so an unchanged prompt finds its last
    answer's length. Read once, by the dataset's prepare task: a dataset left in parts writes each prompt's lengths
    into its part."""
    lengths = AnswerLengths()
    if latest is None:
        return lengths
    last = dataclasses.replace(location, version=latest["version"], profile=latest.get("profile", location.profile))
    with contextlib.ExitStack() as on_error:
        on_error.push(lengths)  # closed (its table removed) only if the reading fails
        manifest = PublishedManifest.from_json(storage.get_bytes(last.manifest))
        for key in sorted(k for k in manifest.files if k.endswith(VERDICTS_SUFFIX)):  # one a shard
            verdicts = read_table(storage, key, ["id", "output_len"])
            lengths.add(verdicts.column("id").to_pylist(), verdicts.column("output_len").to_pylist())
        on_error.pop_all()
    log.info(
        "%s: %d answer lengths from version %s, to send the longest first", last.dataset, len(lengths), last.version
    )
    return lengths


def unchanged_since(latest: dict[str, Any] | None, dataset: str, inputs: dict[str, Any]) -> bool:
    """The nightly rule: a dataset whose last published version (`latest`) was made from exactly these inputs is
    skipped, nothing generated. A source with no pinned identity never matches."""
    if inputs["digest"] is None:
        log.info("%s: a source without a pinned content identity: regenerated every run", dataset)
        return False
    if latest is None or latest["inputs_digest"] != inputs["digest"]:
        return False
    log.info(
        "%s: unchanged since version %s (same sources, profile, template and sampling): skipped, nothing generated; "
        "trigger with skip_unchanged off to sample it again",
        dataset,
        latest["version"],
    )
    return True


def dated(inputs: dict[str, Any], logical_date: str) -> dict[str, Any]:
    """The inputs with the logical date of the run making the version: what orders it among the dataset's versions
    (not an input: the digest is not changed by it)."""
    return {**inputs, "logical_date": logical_date}


def _order(entry: dict[str, Any]) -> tuple[datetime, str]:
    """Where a latest.json entry stands: its version's logical date (an entry written before dates were recorded:
    when it was published), then its version's name."""
    for field in ("logical_date", "published_at"):
        try:
            when = datetime.fromisoformat(str(entry[field]))
        except (KeyError, ValueError, TypeError):
            continue
        return (when if when.tzinfo else when.replace(tzinfo=UTC)), str(entry.get("version", ""))
    return datetime.min.replace(tzinfo=UTC), str(entry.get("version", ""))


ROUNDS = 20  # reads of a latest.json that keeps changing before a publisher gives up


def record_published(storage: Storage, profile: str, dataset: str, entry: dict[str, Any]) -> bool:
    """Written after the manifest, only forward: `entry` (version, manifest, manifest_sha256, inputs_digest,
    published_at, records, logical_date) replaces latest.json unless that names a later version. Whether it did."""
    key, body = latest_key(profile, dataset), json.dumps(entry, indent=1).encode()
    for _ in range(ROUNDS):
        try:
            data, tag = storage.get_tagged(key)
        except Exception as e:
            if not is_not_found(e):
                raise
            try:
                storage.create(key, body)
                return True
            except KeyExists:
                continue
        try:
            current = json.loads(data)
        except ValueError:
            current = None
        current = current if isinstance(current, dict) else {}  # unreadable: any entry is ahead of it
        if _order(entry) < _order(current):
            log.info(
                "%s: latest.json stays at version %s, later than %s (logical dates %s, %s)",
                dataset,
                current.get("version"),
                entry["version"],
                current.get("logical_date"),
                entry.get("logical_date"),
            )
            return False
        try:
            storage.replace(key, body, tag)
            return True
        except Changed:
            continue  # another publisher changed it since it was read: compare again
    raise Changed(f"{storage.uri(key)} kept changing under {ROUNDS} tries to update it; publish again")
