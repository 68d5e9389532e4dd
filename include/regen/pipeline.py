"""The pipeline's stages as plain functions of (run spec, manifest dict) -> manifest dict.

This is the seam between the orchestrator and the library: DAG tasks call exactly one of these each, and pass only
what they return (small JSON dicts) to each other. Anything here runs the same without Airflow.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import asdict, dataclass
from functools import cache
from typing import Any

from pydantic import ValidationError

from regen.chat import ChatRenderer
from regen.claims import held, release
from regen.config import ConfigError, ExportConfig, RegenConfig, Sampling, find_profile, load_config
from regen.datasets.prepare import run_prepare
from regen.errors import FinalError, did_you_mean
from regen.export import ExportSettings, run_export
from regen.generate import GenerateSettings, run_generate
from regen.governance import check_endpoints, check_storage_root
from regen.inputs import dataset_inputs, latest_published
from regen.layout import DatasetLocation, checked_name, run_report_key, version_from_run_id, write_check_key
from regen.manifest import GenerationReport, PreparedDataset, ShardManifest
from regen.publish import run_publish, verify_contents
from regen.report import fleet_utilisation, generation_cost, log_summary, sglang_version_warnings
from regen.sglang.auth import NO_KEYS, ApiKeys
from regen.sglang.server_check import check_fleet
from regen.storage import S3ClientFactory, Storage, check_writable, open_storage
from regen.tokenizers.loading import why_tokenizer_fails
from regen.validate import ValidateSettings, run_validate

log = logging.getLogger(__name__)


class IncompleteRun(FinalError):
    """Some selected dataset was not published: the run failed, though complete datasets were published."""


@dataclass(frozen=True)
class RunSpec:
    """One run's choices: the trigger form's params over the config's defaults, checked before any work starts."""

    datasets: list[str]
    endpoints: list[str]
    storage_root: str
    profile: str
    limit: int | None
    sampling: dict[str, Any]
    version: str
    shard_size: int
    concurrency: int
    request_timeout_s: float
    max_attempts: int
    fleet_wait_s: float
    checkpoint_every: int
    checkpoint_s: float
    export: dict[str, bool]
    validation: dict[str, Any]
    skip_unchanged: bool = True
    overwrite_version: bool = False  # publish over a version that exists with other data (never by default)
    run_id: str = ""  # the Airflow run: recorded beside what it writes, so people find the run from the data

    @classmethod
    def from_params(cls, params: dict[str, Any], run_id: str, config: RegenConfig | None = None) -> RunSpec:
        """Everything the trigger form cannot check, checked here; a bad value raises ConfigError saying what to fix."""
        config = config or load_config()
        try:
            return cls._from_params(params, run_id, config)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
            raise ConfigError(f"invalid run parameters: {problems}") from None

    @classmethod
    def _from_params(cls, params: dict[str, Any], run_id: str, config: RegenConfig) -> RunSpec:
        unknown = sorted(set(params) - RUN_PARAMS)
        if unknown:  # Airflow 3.3 takes any key at trigger (ParamsDict.deep_merge adds it): refused here
            hints = "".join(did_you_mean(name, RUN_PARAMS).replace("; did", f"; for {name!r} did") for name in unknown)
            raise ConfigError(f"unknown run parameters {unknown}{hints}; a run takes {sorted(RUN_PARAMS)}")
        d = config.defaults
        datasets = params.get("datasets")
        if datasets is not None and not datasets:
            raise ConfigError("datasets is empty: choose at least one dataset of the config to regenerate")
        datasets = list(datasets or config.datasets)
        twice = sorted({name for name in datasets if datasets.count(name) > 1})
        if twice:  # two tasks would write one version's keys: parts numbered alike, checkpoints deleted, two publishes
            raise ConfigError(f"datasets {twice} are listed more than once: list each dataset once")
        for name in datasets:
            config.dataset(name)
        profile = params.get("profile") or d.profile
        config.profile(profile)  # known, and its declaration is sound
        limit = params.get("limit")
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ConfigError(f"limit must be a positive integer or null, got {limit!r}")
        endpoints = [str(e).rstrip("/") for e in (params.get("endpoints") or d.endpoints)]
        try:
            check_endpoints(endpoints, config.allowed_endpoints)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        storage_root = config.resolve(params.get("storage_root") or d.storage_root)
        check_storage_root(storage_root, config.allowed_storage_roots)
        in_flight = d.in_flight if params.get("in_flight") is None else params["in_flight"]
        shard_size = d.shard_size if params.get("shard_size") is None else params["shard_size"]
        for name, value in (("in_flight", in_flight), ("shard_size", shard_size)):
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a whole number of at least 1, got {value!r}")
        skip_unchanged, overwrite = params.get("skip_unchanged", True), params.get("overwrite_version", False)
        for name, flag in (("skip_unchanged", skip_unchanged), ("overwrite_version", overwrite)):
            if not isinstance(flag, bool):
                raise ConfigError(f"{name} must be true or false, got {flag!r}")
        version = version_from_run_id(params.get("version") or run_id)
        try:
            checked_name("version", version)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        return cls(
            datasets=datasets,
            endpoints=endpoints,
            storage_root=storage_root,
            profile=profile,
            limit=limit,
            sampling=sampling_from_params(params, d.sampling).as_params(),
            version=version,
            shard_size=shard_size,
            concurrency=-(-in_flight // d.shard_tasks),
            request_timeout_s=d.request_timeout_s,
            max_attempts=d.max_attempts,
            fleet_wait_s=d.fleet_wait_s,
            checkpoint_every=d.checkpoint_every,
            checkpoint_s=d.checkpoint_s,
            export=ExportConfig(**{**d.export.model_dump(), **(params.get("export") or {})}).model_dump(),
            validation=d.validation.model_dump(),
            skip_unchanged=skip_unchanged,
            overwrite_version=overwrite,
            run_id=run_id,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def location(self, dataset: str) -> DatasetLocation:
        return DatasetLocation(self.storage_root, self.profile, dataset, self.version)


# What a run's params (the trigger form, or a REST conf) may hold; anything else is a typo that would be ignored.
RUN_PARAMS = frozenset(
    {"datasets", "profile", "limit", "version", "skip_unchanged", "overwrite_version", "endpoints", "storage_root"}
    | {"shard_size"}
    | {"in_flight", "export"}
    | set(Sampling.model_fields)
)


def sampling_from_params(params: dict[str, Any], defaults: Sampling) -> Sampling:
    """The form's sampling fields over the config's defaults."""
    fields = {name: params[name] for name in Sampling.model_fields if params.get(name) is not None}
    return Sampling(**{**defaults.model_dump(), **fields})


def plan(params: dict[str, Any], run_id: str, s3_client: S3ClientFactory | None = None) -> dict[str, Any]:
    """The run's choices, checked in seconds before any work: params, the profile's tokenizer, a storage root that
    takes a write. Raises ConfigError with what to fix."""
    run = RunSpec.from_params(params, run_id)
    try:
        renderer_for(run.profile)
    except (OSError, ImportError) as e:
        raise ConfigError(why_tokenizer_fails(find_profile(run.profile).tokenizer_source, e)) from e
    except ValueError as e:  # a token role the tokenizer does not have
        raise ConfigError(str(e)) from e
    try:
        check_writable(_storage(run, s3_client), write_check_key(run.profile, uuid.uuid4().hex))
    except PermissionError as e:
        raise ConfigError(f"{e}: give a storage_root this worker can write to") from e
    log.info("plan: %s", run.to_dict())
    return run.to_dict()


@cache
def renderer_for(profile: str) -> ChatRenderer:
    return ChatRenderer(find_profile(profile))


def _storage(run: RunSpec, s3_client: S3ClientFactory | None) -> Storage:
    if run.storage_root.startswith("s3://") and s3_client is not None:
        return open_storage(run.storage_root, s3_client())
    return open_storage(run.storage_root)


def prepare_dataset(run: RunSpec, dataset: str, s3_client: S3ClientFactory | None = None) -> dict[str, Any]:
    """The dataset's prompt shards; or, when its inputs are those of its last published version (and the run skips
    unchanged datasets), no shards and `unchanged_since` naming that version."""
    config = load_config()
    location, storage, renderer = run.location(dataset), _storage(run, s3_client), renderer_for(run.profile)
    inputs: dict[str, Any] = {}
    if not storage.exists(location.prepared):  # a new version, not a resumed one
        inputs = dataset_inputs(
            config.dataset(dataset), renderer.record, run.sampling, run.limit, config.resolve, s3_client
        )
        latest = latest_published(storage, run.profile, dataset) if run.skip_unchanged else None
        if latest and inputs["digest"] and latest["inputs_digest"] == inputs["digest"]:
            log.info(
                "%s: unchanged since version %s (same sources, profile, template and sampling): skipped, nothing "
                "generated; trigger with skip_unchanged off to sample it again",
                dataset,
                latest["version"],
            )
            return {"location": asdict(location), "shards": [], "unchanged_since": latest}
        if inputs["digest"] is None:
            log.info("%s: a source without a pinned content identity: regenerated every run", dataset)
    with held(storage, location, run.run_id):
        prepared = run_prepare(
            config.dataset(dataset),
            location,
            storage,
            renderer,
            run.shard_size,
            run.limit,
            config.resolve,
            s3_client=s3_client,
            workers=config.defaults.tokenize_workers,
            inputs=inputs,
            run_id=run.run_id,
        )
    return prepared.to_dict()


def shard_groups(prepared: list[dict[str, Any]], limit: int) -> list[list[dict[str, Any]]]:
    """Every shard of the prepared datasets, in at most `limit` groups of consecutive shards of one dataset: one
    mapped task per group, which handles its shards in turn (a group never spans datasets, so one dataset's failed
    shard holds back no other's). Up to `limit` shards, every group is one shard."""
    per_dataset = [dataset["shards"] for dataset in prepared if dataset["shards"]]
    size = max(1, -(-sum(map(len, per_dataset)) // limit))
    largest = max(map(len, per_dataset), default=1)
    while size < largest and sum(-(-len(shards) // size) for shards in per_dataset) > limit:
        size += 1  # (a limit below the number of datasets still gives one group per dataset)
    return [shards[i : i + size] for shards in per_dataset for i in range(0, len(shards), size)]


def check_server(run: RunSpec, api_keys: ApiKeys = NO_KEYS) -> list[dict[str, Any]]:
    return check_fleet(run.endpoints, renderer_for(run.profile), run.sampling, api_keys=api_keys)


def generate_shard(
    run: RunSpec, shard: dict[str, Any], s3_client: S3ClientFactory | None = None, api_keys: ApiKeys = NO_KEYS
) -> dict[str, Any]:
    settings = GenerateSettings(
        api_keys=api_keys,
        endpoints=run.endpoints,
        sampling_params=run.sampling,
        concurrency=run.concurrency,
        request_timeout_s=run.request_timeout_s,
        max_attempts=run.max_attempts,
        fleet_wait_s=run.fleet_wait_s,
        checkpoint_every=run.checkpoint_every,
        checkpoint_s=run.checkpoint_s,
    )
    manifest = ShardManifest.from_dict(shard)
    # Only an on-policy shard (prepare counted its turns) renders prompts as it goes: other shards never load the
    # tokenizer here.
    renderer = renderer_for(run.profile) if manifest.num_answers is not None else None
    storage = _storage(run, s3_client)
    with held(storage, manifest.location, run.run_id):
        return run_generate(manifest, storage, settings, renderer).to_dict()


def validate_shard(run: RunSpec, shard: dict[str, Any], s3_client: S3ClientFactory | None = None) -> dict[str, Any]:
    renderer = renderer_for(run.profile)
    settings = ValidateSettings(**run.validation)
    manifest, storage = ShardManifest.from_dict(shard), _storage(run, s3_client)
    with held(storage, manifest.location, run.run_id):
        return run_validate(manifest, storage, renderer, settings).to_dict()


def export_shard(run: RunSpec, shard: dict[str, Any], s3_client: S3ClientFactory | None = None) -> dict[str, Any]:
    settings = ExportSettings(**run.export)
    decode = renderer_for(run.profile).decode if settings.review_text else None
    manifest, storage = ShardManifest.from_dict(shard), _storage(run, s3_client)
    with held(storage, manifest.location, run.run_id):
        return run_export(manifest, storage, settings, decode).to_dict()


def verify_dataset(run: RunSpec, prepared: dict[str, Any], s3_client: S3ClientFactory | None = None) -> dict[str, Any]:
    """A finished version read back whole before any manifest names it (regen.verify): every file's sha256, and
    every record's invariants. Raises VerificationFailed naming every problem, IncompleteDataset when shards did not
    finish. An unchanged dataset has nothing new to verify."""
    if "unchanged_since" in prepared:
        return {"dataset": prepared["location"]["dataset"], "unchanged": True}
    dataset, storage = PreparedDataset.from_dict(prepared), _storage(run, s3_client)
    with held(storage, dataset.location, run.run_id):  # its verdict holds only while no other run writes
        return verify_contents(dataset, storage)


class NotVerified(FinalError):
    """Publish never writes a manifest for data the verifier did not pass."""


def publish_dataset(
    run: RunSpec,
    prepared: dict[str, Any],
    fleet: list[dict[str, Any]],
    verified: dict[str, Any] | None,
    s3_client: S3ClientFactory | None = None,
) -> dict[str, Any]:
    """The published version's summary, for the version `verify_dataset` passed (`verified`: what it returned; None
    when it failed). For an unchanged dataset, its last version's, marked `unchanged`."""
    if "unchanged_since" in prepared:
        latest = prepared["unchanged_since"]
        return {"dataset": prepared["location"]["dataset"], "unchanged": True, **latest}
    dataset = prepared["location"]["dataset"]
    if not verified or "contents" not in verified:
        raise NotVerified(f"{dataset}: verify_dataset did not pass, so nothing is published; its log says why")
    storage = _storage(run, s3_client)
    prepared_dataset = PreparedDataset.from_dict(prepared)
    cost = load_config().defaults.cost.model_dump()
    with held(storage, prepared_dataset.location, run.run_id):  # the manifest is written by the version's writer
        published = run_publish(
            prepared_dataset, storage, fleet, run.sampling, run.overwrite_version, verified, run.run_id, cost
        )
    release(storage, prepared_dataset.location, run.run_id)  # a published version is never written again
    return published


def asset_event(published: dict[str, Any]) -> dict[str, Any]:
    """What a dataset's asset event carries: enough for a consumer to find and verify the version."""
    keys = ("dataset", "version", "manifest", "manifest_sha256", "records", "splits", "inputs_digest")
    return {key: published[key] for key in keys if key in published}


def _report_key(storage: Storage, run: RunSpec) -> str:
    """The version's run report, or, when another run of the version wrote that one (this is a Resume), this run's
    own beside it: the earlier run's report is never written over."""
    key = run_report_key(run.profile, run.version)
    if not storage.exists(key):
        return key
    try:
        earlier = json.loads(storage.get_bytes(key)).get("run", {}).get("run_id")
    except (ValueError, AttributeError):  # not a run report this pipeline wrote: keep it too
        earlier = None
    return key if earlier == run.run_id else run_report_key(run.profile, run.version, run.run_id)


def report(
    run: RunSpec,
    published: list[dict[str, Any]],
    fleet: list[dict[str, Any]],
    s3_client: S3ClientFactory | None = None,
) -> dict[str, Any]:
    """The run's summary: one line per dataset in the log, and a JSON report beside the datasets."""
    missing = sorted(set(run.datasets) - {p["dataset"] for p in published})
    generations = [GenerationReport.from_dict(g) for p in published for g in p.get("generation", [])]
    fleet_usage = fleet_utilisation(generations, fleet)
    train_tokens = sum((p.get("cost") or {}).get("train_tokens", 0) for p in published if not p.get("unchanged"))
    warnings = sglang_version_warnings(fleet)
    summary: dict[str, Any] = {
        "run": run.to_dict(),
        "warnings": warnings,
        "fleet": fleet,
        "fleet_usage": fleet_usage,
        "cost": generation_cost(generations, fleet, train_tokens, load_config().defaults.cost.model_dump()),
        "datasets": [p for p in published if not p.get("unchanged")],
        "unchanged": [p for p in published if p.get("unchanged")],
        "unpublished": missing,
    }
    storage = _storage(run, s3_client)
    for dataset in run.datasets:  # the run writes no more: a Resume of what it left may start at once
        release(storage, run.location(dataset), run.run_id)
    key = _report_key(storage, run)
    storage.put_bytes(key, json.dumps(summary, indent=1).encode())
    log_summary(published, missing, fleet_usage)
    for warning in warnings:
        log.warning("%s", warning)
    log.info("run report: %s", storage.uri(key))
    summary["report"] = storage.uri(key)
    if missing:  # a run that did not deliver is red, whatever else it did
        raise IncompleteRun(
            f"not published: {', '.join(missing)}; see their failed tasks. Run report: {storage.uri(key)}"
        )
    return summary
