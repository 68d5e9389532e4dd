"""The publish stage: a dataset version becomes visible. `manifest.json` is written last, only when every shard is
finished and the verifier has read the version's files and records back whole.

Before it: the dataset's report (report.json, report.html and its plots) in the publisher's own folder beside where
the manifest goes, so that of two publishers of one version the loser never touches a file the winner's manifest
names (and removes its own once it has lost). The manifest names every file of the version with its sha256 and
size, the splits, the counts of every stage, and exactly which template and tokenizer rendered the prompts. After
it, `latest.json` names the version and the manifest's sha256.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import uuid
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from regen.errors import FinalError
from regen.fleet_losses import DEFAULT_SHARE, check_version
from regen.layout import DatasetLocation, dataset_prefix, is_derived_file, is_report_file
from regen.manifest import GenerationReport, PreparedDataset, PublishedManifest, ShardManifest, StageStats
from regen.profiles import Profile
from regen.reasons import OK
from regen.run_report import generation_cost
from regen.sglang.served_model import fleet_seeds_honoured
from regen.stages.publish.dataset_report import dataset_report, read_verdicts, write_dataset_report
from regen.stages.publish.entries import draft_manifest, shard_entries, split_records, version_share
from regen.stages.publish.length_prediction import length_prediction
from regen.stages.publish.rejection_examples import rejection_examples
from regen.stages.publish.vocab_files import VocabSizes, digests, version_vocab
from regen.storage import KeyExists, Storage, get_json, is_not_found
from regen.verify import unlisted, verify_manifest
from regen.version_inputs import record_published

log = logging.getLogger(__name__)

STAGES = ("generate", "validate", "export")


class IncompleteDataset(FinalError):
    """Cannot succeed until the failed shards are cleared."""


class VersionExists(FinalError):
    """The version is already published with other content: a published version is never changed silently."""


class ChangedSinceVerified(FinalError):
    """The version's files are not the ones the verifier read: they are verified again before they are published."""


def dataset_uri(storage: Storage, location: DatasetLocation) -> str:
    """Where every version of a dataset lives, as a URI: the identity of the dataset's Airflow asset."""
    uri = storage.uri(dataset_prefix(location.profile, location.dataset))
    return uri if "://" in uri else Path(uri).as_uri()


def version_contents(prepared: PreparedDataset, storage: Storage) -> tuple[list[ShardManifest], dict[str, str]]:
    """Every shard, finished, and every data file of the version with its sha256. Raises IncompleteDataset."""
    location = prepared.location
    shards, missing = finished_shards(prepared, storage)
    if missing:
        raise IncompleteDataset(
            f"{location.dataset} {location.version}: shards {', '.join(missing)} did not finish; clear their failed "
            "tasks (finished answers are kept) and this task publishes once they succeed"
        )
    data_files = {s.prompts_key: s.prompts_sha256 for s in shards}
    data_files |= {k: v for s in shards for k, v in s.files.items()} | prepared.files
    return shards, dict(sorted(data_files.items()))


def contents_digest(data_files: dict[str, str], stamps: dict[str, tuple[int, str] | None]) -> str:
    """One sha256 over every data file's key, sha256, size and stamp (`Storage.stamp`: S3's ETag, a local file's inode
    and time): what the verifier read is what publish writes out, or the digests differ."""
    return hashlib.sha256(
        json.dumps([[k, v, stamps.get(k)] for k, v in sorted(data_files.items())]).encode()
    ).hexdigest()


def stamps_of(storage: Storage, keys: list[str]) -> dict[str, tuple[int, str] | None]:
    """Every file's size and stamp, asked of the storage (a HEAD each on S3, several at once); None for a file that is
    not there."""
    from concurrent.futures import ThreadPoolExecutor

    def stamp(key: str) -> tuple[int, str] | None:
        try:
            return storage.stamp(key)
        except Exception as e:
            if is_not_found(e):
                return None
            raise

    with ThreadPoolExecutor(max_workers=16) as pool:
        return dict(zip(keys, pool.map(stamp, keys), strict=True))


def verify_contents(prepared: PreparedDataset, storage: Storage) -> dict[str, Any]:
    """Reads every data file of a finished version back (sha256) and checks every record's invariants, before any
    manifest names them. Raises VerificationFailed naming every problem; returns what was read and the contents'
    digest, which publish checks before it writes the manifest."""
    return _verify(prepared, storage, *version_contents(prepared, storage))


def _verify(
    prepared: PreparedDataset, storage: Storage, shards: list[ShardManifest], data_files: dict[str, str]
) -> dict[str, Any]:
    location = prepared.location
    # Stamped before and after they are read: publish then writes out exactly the bytes read, or refuses.
    stamps = stamps_of(storage, list(data_files))
    result = verify_manifest(draft_manifest(prepared, shards, data_files), storage)
    # Strays too, as `regen verify` finds them after publish: a file a dying try left that no manifest would list
    # (the report of a publish try that died before its manifest is removed by the publish that wins; its vocab/
    # files are made again, the same).
    result.problems += unlisted(location.prefix, data_files, storage, allowed=is_derived_file)
    result.check(f"{location.dataset} {location.version}", withheld="not published, ")
    if changed := sorted(k for k, v in stamps_of(storage, list(data_files)).items() if v != stamps[k]):
        raise ChangedSinceVerified(
            f"{location.dataset} {location.version}: {', '.join(changed)} changed while they were verified; verify "
            "again once nothing writes the version"
        )
    return {
        "dataset": location.dataset,
        "version": location.version,
        "contents": contents_digest(data_files, stamps),
        "files": len(data_files),
        "bytes": result.bytes_read,
        "records_checked": result.records_checked,
        "verified_at": datetime.now(UTC).isoformat(),
    }


def sizes_of(storage: Storage, keys: list[str]) -> dict[str, int]:
    """Every file's size in bytes, asked of the storage (a HEAD each on S3, several at once)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=16) as pool:
        return dict(zip(keys, pool.map(storage.size, keys), strict=True))


def _published_before(
    storage: Storage, key: str, data_files: dict[str, str], overwrite: bool
) -> tuple[bytes, PublishedManifest] | None:
    """The version's manifest when it is published already with these data files; None when it is to be written
    (not published yet, or `overwrite`); raises when it is published with other data."""
    if not storage.exists(key):
        return None
    body = storage.get_bytes(key)
    published = PublishedManifest.from_json(body)
    if published.data_files() == data_files:
        return body, published  # the report is drawn again each time (its plots are not byte-stable): only data counts
    if overwrite:
        log.warning("%s: overwriting a published version with other data (overwrite_version is on)", storage.uri(key))
        return None
    raise VersionExists(
        f"{storage.uri(key)} is already published with other data; a published version is never changed: trigger "
        "with a new version, or with overwrite_version on to replace it"
    )


def _write_manifest(
    prepared: PreparedDataset,
    shards: list[ShardManifest],
    generations: list[GenerationReport],
    storage: Storage,
    data_files: dict[str, str],
    verified: dict[str, Any],
    sizes: dict[str, int],
    fleet: list[dict[str, Any]],
    sampling_params: dict[str, Any] | None,
    run_id: str | None,
    cost: dict[str, Any],
    vocab: dict[str, Any],
    overwrite: bool = False,
) -> tuple[bytes, PublishedManifest, dict[str, Any]]:
    """The dataset's report, then the manifest naming every file with its sha256 and size (`sizes`: the data files'
    as verified): written last, and only if no other publisher wrote it meanwhile (another with other data:
    VersionExists). Returns the manifest as written and the report."""
    location = prepared.location
    stages = {stage: StageStats.merged([s.stats[stage] for s in shards]).to_dict() for stage in STAGES}
    verdicts = read_verdicts(storage, shards)
    report = dataset_report(verdicts, generations)
    report["rejected_by_stage"] = {"prepare": prepared.stats.dropped, **{s: stages[s]["dropped"] for s in STAGES}}
    report["decontamination"] = prepared.decontamination  # the suites, and each one's rejections at prepare
    rejected = {("prepare", reason): n for reason, n in prepared.stats.dropped_by_reason.items()}
    for stage in ("generate", "validate"):
        rejected |= {(stage, reason): n for reason, n in stages[stage]["dropped_by_reason"].items()}
    lengths_from = prepared.inputs.get("lengths_from") or {"predictor": "not recorded"}
    report["length_prediction"] = length_prediction(verdicts, lengths_from)
    report["rejections"] = rejection_examples(storage, [k for k in data_files if "/rejected/" in k], rejected)
    report["cost"] = generation_cost(generations, fleet, report.get("train_tokens", 0), cost)
    splits = split_records(shards)
    report |= {f"{split}_records": count for split, count in splits.items()}
    report["vocab"] = vocab
    title = f"{location.dataset} {location.version} ({location.profile})"
    writer = uuid.uuid4().hex[:16]  # this publisher's own report keys: a concurrent one never writes them
    report_files = write_dataset_report(storage, location, title, verdicts, report, writer)
    manifest = PublishedManifest(
        dataset=location.dataset,
        profile=prepared.profile,
        token_roles=prepared.token_roles,
        version=location.version,
        root=storage.root_uri,
        published_at=datetime.now(UTC).isoformat(),
        run_id=run_id,
        prepare={**prepared.stats.to_dict(), "rows_read": prepared.rows_read, "duplicates": prepared.duplicates},
        stages=stages,
        records=splits["train"],
        splits=splits,
        validation_share=version_share(prepared),
        vocab=vocab,
        report={
            "writer": writer,
            "json": storage.uri(location.report_file("report.json", writer)),
            "html": storage.uri(location.report_file("report.html", writer)),
        },
        retokenize_drift=report.get("retokenize_drift"),
        cost=report["cost"],
        sampling_params=sampling_params,
        seeds_honoured=fleet_seeds_honoured(fleet),
        inputs=prepared.inputs,
        decontamination=prepared.decontamination,
        fleet=fleet,
        verified={k: verified[k] for k in ("bytes", "records_checked", "verified_at")},
        shards=shard_entries(shards),
        files=data_files | report_files,
        sizes=sizes | sizes_of(storage, list(report_files)),
    )
    body = manifest.to_json()
    if overwrite:
        replaced = (
            PublishedManifest.from_json(storage.get_bytes(location.manifest))
            if storage.exists(location.manifest)
            else None
        )
        storage.put_bytes(location.manifest, body)
        if replaced is not None:  # the replaced version's report: named by nothing now
            _discard(storage, [k for k in replaced.files if is_report_file(k) and k not in report_files])
        return body, manifest, report
    try:  # one writer per version: of two publishers at once, exactly one writes the manifest
        storage.create(location.manifest, body)
    except KeyExists:  # the same data published meanwhile stands; other data raises VersionExists
        _discard(storage, list(report_files))  # the winner's manifest names its own report, never this one
        theirs = _published_before(storage, location.manifest, data_files, overwrite=False)
        if theirs is None:
            raise
        _discard(storage, _unnamed_reports(storage, location, theirs[1].files))  # (the winner may have died first)
        log.warning(
            "%s %s: another publisher published it first (run %s), with the same data; its manifest stands, and "
            "this publisher's report is removed",
            location.dataset,
            location.version,
            theirs[1].run_id,
        )
        return *theirs, report_of(storage, location, theirs[1])
    # Won: reports of earlier tries that died before their manifest are named by nothing (a loser still writing
    # removes its own as it loses).
    _discard(storage, _unnamed_reports(storage, location, report_files))
    return body, manifest, report


def _unnamed_reports(storage: Storage, location: DatasetLocation, named: Collection[str]) -> list[str]:
    """The report files no manifest will name: of publishers that lost, or died before their manifest, or whose
    winner died before removing them (found by a retry, or by the loser, of a version published already)."""
    return [key for key in storage.list_keys(location.report_folders) if key not in named]


def _discard(storage: Storage, keys: list[str]) -> None:
    """Files no manifest names (a losing publisher's report), removed. A delete that fails fails the task: left, the
    file would be a stray of the published version, and the retry, finding the version published, removes it."""
    for key in keys:
        storage.delete(key)


def report_of(storage: Storage, location: DatasetLocation, manifest: PublishedManifest) -> dict[str, Any]:
    """The report.json a published manifest names."""
    return dict(get_json(storage, location.report_file("report.json", manifest.writer)))


def finished_shards(prepared: PreparedDataset, storage: Storage) -> tuple[list[ShardManifest], list[str]]:
    finished, missing = [], []
    for shard in prepared.shards:
        key = shard.keys.report
        if storage.exists(key):
            finished.append(ShardManifest.from_dict(get_json(storage, key)))
        else:
            missing.append(shard.name)
    return finished, missing


def run_publish(
    prepared: PreparedDataset,
    storage: Storage,
    fleet: list[dict[str, Any]],
    sampling_params: dict[str, Any] | None = None,
    overwrite: bool = False,
    verified: dict[str, Any] | None = None,
    run_id: str | None = None,
    cost: dict[str, Any] | None = None,
    vocab_sizes: VocabSizes | None = None,
    max_server_rejected_share: float = DEFAULT_SHARE,
) -> dict[str, Any]:
    """`sampling_params`: exactly what every /generate request of this version sent, recorded in the manifest.
    `verified`: what `verify_contents` returned for this version (the DAG verifies in a task of its own); without it,
    the version is verified here. Either way no manifest names data the verifier has not read back. `vocab_sizes`: the
    draft and target vocabularies of vocab/ (None: the profile's default draft size over the tokenizer's ids). A
    version the fleet lost more answers of than `max_server_rejected_share` is refused (regen.fleet_losses).

    A version is immutable: publishing into one that has a manifest already is a no-op when its data files are the
    same (a retried publish), and refused when they differ, unless `overwrite`."""
    location = prepared.location
    shards, data_files = version_contents(prepared, storage)
    fleet_losses = check_version(storage, location, shards, max_server_rejected_share)  # red: TooManyServerRejections
    if verified is None:
        verified = _verify(prepared, storage, shards, data_files)
    stamps = stamps_of(storage, list(data_files))
    if contents_digest(data_files, stamps) != verified["contents"]:
        raise ChangedSinceVerified(
            f"{location.dataset} {location.version}: its files changed after they were verified; clear "
            "verify_dataset to verify them again"
        )
    generations = [s.generation for s in shards if s.generation]  # None: generated by an earlier run's try
    draft = Profile.model_fields["draft_vocab_size"].default
    vocab_sizes = vocab_sizes or VocabSizes.of(draft, None, [], prepared.token_roles["vocab_size"])
    vocab_files, vocab = version_vocab(storage, location, shards, vocab_sizes)
    version_files = data_files | digests(vocab_files)
    published = _published_before(storage, location.manifest, version_files, overwrite)
    if published is None:
        for key, body in vocab_files.items():  # made from the verified counts: the same bytes on every try
            storage.put_bytes(key, body)
        sizes = {k: v[0] for k, v in stamps.items() if v is not None}  # what the verifier read: all of them
        sizes |= {key: len(body) for key, body in vocab_files.items()}
        args = (verified, sizes, fleet, sampling_params, run_id, cost or {}, vocab, overwrite)
        body, manifest, report = _write_manifest(prepared, shards, generations, storage, version_files, *args)
    else:  # a retried publish: the version stands as it is, report included
        log.info("%s %s is already published with the same data: nothing to do", location.dataset, location.version)
        body, manifest = published
        _discard(storage, _unnamed_reports(storage, location, manifest.files))
        report = report_of(storage, location, manifest)
    manifest_uri = storage.uri(location.manifest)
    latest = {
        "version": location.version,
        "manifest": manifest_uri,
        "manifest_sha256": hashlib.sha256(body).hexdigest(),
        "inputs_digest": prepared.inputs.get("digest"),
        "logical_date": prepared.inputs.get("logical_date"),  # orders the versions: latest.json only moves forward
        "published_at": manifest.published_at,
        "records": manifest.records,
    }
    record_published(storage, location.profile, location.dataset, latest)
    log.info(
        "published %s %s: %d training records -> %s", location.dataset, location.version, manifest.records, manifest_uri
    )
    drift = report.get("retokenize_drift") or {}
    log.info(
        "%s: %d answers -> %d train, %d truncated, %d rejected %s; tool-call rate %s; re-tokenization drift %s of %s "
        "sampled; report: %s",
        location.dataset,
        report.get("answered", 0),
        report.get("train_records", 0),
        report.get("truncated_records", 0),
        report.get("rejected_records", 0),
        {k: v for k, v in report.get("verdicts", {}).items() if k != OK},
        report.get("tool_call_rate"),
        drift.get("drifted"),
        drift.get("sampled"),
        manifest.report.get("html"),
    )
    generation = GenerationReport.combined(generations)
    return {
        "dataset": location.dataset,
        "version": location.version,
        "dataset_uri": dataset_uri(storage, location),
        "inputs_digest": latest["inputs_digest"],
        "manifest": manifest_uri,
        "manifest_sha256": latest["manifest_sha256"],
        "report": manifest.report.get("html"),
        "records": manifest.records,
        "splits": manifest.splits,
        "retokenize_drift": manifest.retokenize_drift,
        "length_prediction": report.get("length_prediction"),
        "cost": manifest.cost,
        "stages": manifest.stages,
        "prepare": manifest.prepare,
        "verified": {k: v for k, v in verified.items() if k != "contents"},
        # The version's shards' generation in one report (sums and the window), so this value stays the same size
        # however many shards there are: what the run report's utilization and cost are computed from.
        "generation": [dataclasses.asdict(generation)] if generation else [],
        "generated_shards": len(generations),
        **({"fleet_losses": fleet_losses} if fleet_losses else {}),  # kept within the share; all in its list
    }
