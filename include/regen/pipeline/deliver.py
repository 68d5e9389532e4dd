"""The delivery tasks of a dataset, once its own shards finished: its version read back whole (`verify_dataset`),
then published (`publish_dataset`: report, manifest last, latest.json), and what its asset event carries."""

from __future__ import annotations

from typing import Any

from regen.errors import FinalError
from regen.hints import hint_warnings
from regen.manifest import GenerationReport
from regen.metrics import current as metrics
from regen.pipeline.run_storage import RunStorage
from regen.pipeline.version_settings import VersionSettings
from regen.run_params import RunSpec
from regen.stages.publish.publish import run_publish, verify_contents
from regen.stages.publish.vocab_files import VocabSizes
from regen.storage import S3ClientFactory


class NotVerified(FinalError):
    """Publish never writes a manifest for data the verifier did not pass."""


def verify_dataset(run: RunSpec, prepared: dict[str, Any], s3_client: S3ClientFactory | None = None) -> dict[str, Any]:
    """A finished version read back whole before any manifest names it (regen.verify): every file's sha256, and
    every record's invariants. Raises VerificationFailed naming every problem, IncompleteDataset when shards did not
    finish. An unchanged dataset has nothing new to verify."""
    if "unchanged_since" in prepared:
        return {"dataset": prepared["dataset"], "unchanged": True}
    at = RunStorage.open(run, s3_client)
    dataset = at.prepared(prepared["dataset"])
    with at.writing(dataset.location) as storage:  # its verdict holds only while no other run writes
        at.remove_stale_temporaries(dataset.location)
        return verify_contents(dataset, storage)


def publish_dataset(
    run: RunSpec,
    prepared: dict[str, Any],
    fleet: list[dict[str, Any]],
    verified: dict[str, Any] | None,
    s3_client: S3ClientFactory | None = None,
) -> dict[str, Any]:
    """The published version's summary, for the version `verify_dataset` passed (`verified`: what it returned; None
    when it failed). For an unchanged dataset, its last version's, marked `unchanged`."""
    dataset = prepared["dataset"]
    if "unchanged_since" in prepared:
        return {"dataset": dataset, "unchanged": True, **prepared["unchanged_since"]}
    if not verified or "contents" not in verified:
        raise NotVerified(f"{dataset}: verify_dataset did not pass, so nothing is published; its log says why")
    at = RunStorage.open(run, s3_client)
    prepared_dataset = at.prepared(dataset)
    with at.writing(prepared_dataset.location) as storage:  # the manifest is written by the version's writer
        at.remove_stale_temporaries(prepared_dataset.location)  # (a try of publish killed mid-write left them)
        published = run_publish(
            prepared_dataset,
            storage,
            fleet,
            VersionSettings.of(prepared_dataset, run).sampling,
            run.overwrite_version,
            verified,
            run.run_id,
            run.cost,
            vocab_sizes(run, fleet, prepared_dataset.token_roles["vocab_size"]),
            run.max_server_rejected_share,
        )
    at.release(prepared_dataset.location)  # a published version is never written again
    metrics().published.labels(dataset).inc()
    if isinstance(spearman := (published.get("length_prediction") or {}).get("spearman"), int | float):
        metrics().spearman.labels(dataset).set(spearman)
    warnings = [*prepared.get("warnings", []), *generate_warnings(dataset, published.get("generation", []))]
    return {**published, "warnings": warnings} if warnings else published


def generate_warnings(dataset: str, generation: list[dict[str, Any]]) -> list[str]:
    """The hints that failed in the version's generate tasks (its shards' generation reports), for the run report."""
    failed: dict[str, str] = {}
    for report in generation:
        failed = GenerationReport.from_dict(report).hints_off | failed
    return hint_warnings(dataset, failed)


def vocab_sizes(run: RunSpec, fleet: list[dict[str, Any]], tokenizer_ids: int) -> VocabSizes:
    """The draft vocabulary's size (the profile's), and the target's: the profile's, else what the fleet's servers
    said at check_server, else the tokenizer's ids."""
    profile = run.declared_profile
    served = [endpoint.get("vocab_size") for endpoint in fleet]
    return VocabSizes.of(profile.draft_vocab_size, profile.vocab_size, served, tokenizer_ids)


def asset_event(published: dict[str, Any]) -> dict[str, Any]:
    """What a dataset's asset event carries: enough for a consumer to find and verify the version."""
    keys = ("dataset", "version", "manifest", "manifest_sha256", "records", "splits", "inputs_digest")
    return {key: published[key] for key in keys if key in published}
