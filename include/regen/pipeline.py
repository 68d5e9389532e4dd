"""The pipeline's stages as plain functions of (run spec, manifest dict) -> manifest dict.

This is the seam between the orchestrator and the library: DAG tasks call exactly one of these each, and pass only
what they return (small JSON dicts) to each other. No value passed grows with the number of prompts: a prepared
dataset travels as its name and shard count, a group of shards as a range between every stage (its shards'
manifests stay in storage: prompts/prepare.json, then each stage's reports/shard-*.{stage}.json). Anything here runs
the same without Airflow.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from regen.chat import ChatRenderer
from regen.claims import held, release
from regen.config import ConfigError, load_config
from regen.errors import FinalError
from regen.layout import DatasetLocation, write_check_key
from regen.manifest import PreparedDataset, ShardManifest
from regen.profiles import Profile
from regen.run_params import RunSpec
from regen.run_report import write_run_report
from regen.samples import samples_of
from regen.sglang.auth import NO_KEYS, ApiKeys
from regen.sglang.server_check import check_fleet
from regen.stages.export import ExportSettings, run_export
from regen.stages.generate.generate import GenerateSettings, run_generate
from regen.stages.prepare.eval_suites import load_suites
from regen.stages.prepare.parts import part_prompts_to_map
from regen.stages.prepare.prepare import PreparedParts, PrepareSettings, finish_parts, prepare_part, run_prepare
from regen.stages.prepare.sources import source_digests
from regen.stages.prepare.tokenize import pool_size
from regen.stages.publish.publish import run_publish, verify_contents
from regen.stages.validate import ValidateSettings, run_validate
from regen.storage import S3ClientFactory, Storage, check_writable, get_json, open_storage
from regen.tokenizers.loading import why_tokenizer_fails
from regen.version_inputs import answer_lengths, dataset_inputs, dated, latest_published, unchanged_since

log = logging.getLogger(__name__)


def plan(
    params: dict[str, Any],
    run_id: str,
    s3_client: S3ClientFactory | None = None,
    logical_date: datetime | None = None,
) -> dict[str, Any]:
    """The run's choices, checked in seconds before any work: params, the profile's tokenizer, a storage root that
    takes a write. The one place a run reads the deployment's config: what it uses travels in the run spec. Raises
    ConfigError with what to fix. `logical_date`: the run's, or its run_after when it has none (now, outside
    Airflow)."""
    run = RunSpec.from_params(params, run_id, load_config(), logical_date=logical_date)
    try:
        renderer_for(run)
    except (OSError, ImportError) as e:
        raise ConfigError(why_tokenizer_fails(run.declared_profile.tokenizer_source, e)) from e
    except ValueError as e:  # a token role the tokenizer does not have
        raise ConfigError(str(e)) from e
    load_suites(run.decontamination, run.resolve, s3_client)  # a missing suite or a bad field path: ConfigError
    try:
        check_writable(_RunStorage.open(run, s3_client).storage, write_check_key(run.profile, uuid.uuid4().hex))
    except PermissionError as e:
        raise ConfigError(f"{e}: give a storage_root this worker can write to") from e
    log.info("plan: %s", run.to_dict())
    return run.to_dict()


def renderer_for(run: RunSpec) -> ChatRenderer:
    """The run's profile at work, built once per process: its declaration as plan froze it."""
    return _renderer(run.declared_profile.model_dump_json())


@cache
def _renderer(declaration: str) -> ChatRenderer:
    profile = Profile.model_validate_json(declaration)
    log.info("loading profile %s (tokenizer, template) in this process", profile.name)  # not inherited (preload)
    return ChatRenderer(profile)


def preload() -> None:
    """Build the config's default profile at work (the renderer and its decode table) in a process that forks task
    processes, so that every task forked after it inherits the renderer and the libraries behind it, instead of
    spending about 2 CPU-seconds on them each. Nothing is sent and nothing is written. A config or tokenizer that
    fails here is left for plan to report, with its own message."""
    try:
        config = load_config()
        renderer = _renderer(config.profile(config.defaults.profile).model_dump_json())
    except Exception as e:  # a hint for the log: plan says what to fix
        log.warning("preload skipped (plan will report it): %s", e)
        return
    renderer.decode_in_vocab([0])  # the decode table is built on first use
    import pyarrow.dataset  # noqa: F401 (pyarrow.parquet imports it at the first read, a third of a second)

    log.info("preloaded profile %s", renderer.profile.name)


@dataclass(frozen=True)
class _RunStorage:
    """A task's storage, opened once on the root plan checked, and what its run does there: hold a version's claim
    while it writes (regen.claims, as this run's try), read what prepare recorded."""

    run: RunSpec
    storage: Storage

    @classmethod
    def open(cls, run: RunSpec, s3_client: S3ClientFactory | None) -> _RunStorage:
        if run.storage_root.kind == "s3" and s3_client is not None:
            return cls(run, open_storage(run.storage_root, s3_client()))
        return cls(run, open_storage(run.storage_root))  # the root plan checked, as it parsed it

    @contextmanager
    def writing(self, location: DatasetLocation) -> Iterator[Storage]:
        with held(self.storage, location, self.run.run_id, self.run.try_token):
            yield self.storage

    def release(self, location: DatasetLocation) -> None:
        release(self.storage, location, self.run.run_id, self.run.try_token)

    def prepared(self, dataset: str) -> PreparedDataset:
        key = self.run.location(dataset).prepared
        if not self.storage.exists(key):
            raise NotPrepared(
                f"{dataset}: not prepared ({self.storage.uri(key)} is missing): its prepare_dataset or one of its "
                "prepare_part tasks failed, and says why"
            )
        return PreparedDataset.from_dict(get_json(self.storage, key))


def prepare_dataset(
    run: RunSpec, dataset: str, s3_client: S3ClientFactory | None = None, tasks_at_once: int = 1
) -> dict[str, Any]:
    """The dataset read once, normalized and deduplicated, and tokenized into prompt shards: its name, shard and
    prompt counts (the shards themselves are in prompts/prepare.json, see `prepared_version`). A dataset of more
    than one part is left in `parts` for `prepare_dataset_part` and `finish_prepared`. Or, when its inputs are those
    of its last published version (and the run skips unchanged datasets), `unchanged_since` naming that version.
    `tasks_at_once`: the tasks this machine may run together, which share its cores when `tokenize_workers` is null."""
    location, at, renderer = run.location(dataset), _RunStorage.open(run, s3_client), renderer_for(run)
    storage = at.storage
    source, inputs = run.dataset(dataset), {}
    cleaning = load_suites(run.decontamination, run.resolve, s3_client)
    with contextlib.ExitStack() as held:
        expected: Mapping[str, int] = {}
        if not storage.exists(location.prepared):  # a new version, not a resumed one
            sources = source_digests(source, run.resolve, s3_client)
            suites = cleaning.record if cleaning else None
            inputs = dataset_inputs(source, renderer.record, run.sampling, run.limit, sources, suites)
            wanted = run.skip_unchanged or run.longest_first
            latest = latest_published(storage, location.profile, dataset) if wanted else None
            if run.skip_unchanged and unchanged_since(latest, dataset, inputs):
                return {"dataset": dataset, "unchanged_since": latest}
            inputs = dated(inputs, run.logical_date)  # the version's date, kept when a later run resumes it
            if run.longest_first:  # each sample's answer length in the last version, to send the longest first
                expected = held.enter_context(answer_lengths(storage, latest, location))
        held.enter_context(at.writing(location))
        prepared = run_prepare(
            source,
            location,
            storage,
            renderer,
            PrepareSettings(
                shard_size=run.shard_size,
                limit=run.limit,
                resolve_path=run.resolve,
                s3_client=s3_client,
                workers=pool_size(run.tokenize_workers, tasks_at_once),
                inputs=inputs,
                run_id=run.run_id,
                part_prompts=run.prepare_part_prompts,
                decontamination=cleaning,
                expected_tokens=expected,
            ),
        )
    if isinstance(prepared, PreparedParts):
        return {"dataset": dataset, "parts": prepared.parts, "prompts": prepared.prompts}
    return {"dataset": dataset, "shard_count": len(prepared.shards), "prompts": prepared.stats.kept}


MAX_MAP_LENGTH = 1024  # the most task instances Airflow maps from one input ([core] max_map_length's default)


def dataset_parts(run: RunSpec, prepared: list[dict[str, Any]]) -> list[list[int]]:
    """Every part of the datasets left in parts (`prepare_dataset`'s summaries), each `[the dataset's position in
    the run's datasets, part]`: a few bytes a part whatever the names, so the mapped input stays small. Raises
    ConfigError when there are more parts than Airflow maps."""
    parts = [[run.datasets.index(p["dataset"]), part] for p in prepared for part in range(p.get("parts", 0))]
    if len(parts) > MAX_MAP_LENGTH:
        raise ConfigError(
            f"{len(parts)} prepare parts, more than Airflow maps ({MAX_MAP_LENGTH}): set defaults.prepare_part_prompts "
            f"to at least {_part_prompts_to_map(run, [p for p in prepared if 'parts' in p])}"
        )
    return parts


def _part_prompts_to_map(run: RunSpec, in_parts: list[dict[str, Any]]) -> int:
    sizes = [(p["prompts"], run.dataset(p["dataset"])) for p in in_parts]
    counts = [(prompts, len(samples_of("", d.temperatures, d.samples_per_prompt))) for prompts, d in sizes]
    return part_prompts_to_map(run.shard_size, counts, MAX_MAP_LENGTH)


def part_name(run: RunSpec, reference: list[int]) -> str:
    """A part's name for people (the task's label): its dataset's and its number."""
    return f"{run.datasets[reference[0]]}/part-{reference[1]:05d}"


def prepare_dataset_part(
    run: RunSpec, reference: list[int], s3_client: S3ClientFactory | None = None
) -> dict[str, Any]:
    """One part (`dataset_parts`) of a dataset tokenized into its shards, in this process: the parts are what runs
    in parallel, and this process has the renderer already (the preload). Its counts."""
    dataset, part = run.datasets[reference[0]], reference[1]
    location = run.location(dataset)
    with _RunStorage.open(run, s3_client).writing(location) as storage:
        record = prepare_part(run.dataset(dataset), location, storage, renderer_for(run), part, 1)
    return {"dataset": dataset, "part": part, "shards": len(record["shards"]), "kept": record["stats"]["kept"]}


def finish_prepared(
    run: RunSpec, prepared: list[dict[str, Any]], s3_client: S3ClientFactory | None = None
) -> list[dict[str, Any]]:
    """`prepare_dataset`'s summaries with every dataset left in parts recorded whole (regen.stages.prepare.prepare's
    `finish_parts`), once all its parts are tokenized. A dataset with a part that failed is left out, with its
    reason in the log: it is not prepared (its verify says so), and holds back no other dataset."""
    at, finished = _RunStorage.open(run, s3_client), []
    for summary in prepared:
        if "parts" not in summary:
            finished.append(summary)
            continue
        location = run.location(summary["dataset"])
        try:
            with at.writing(location) as storage:
                dataset = finish_parts(run.dataset(summary["dataset"]), location, storage)
        except FinalError as e:
            log.error("%s", e)
            continue
        finished.append(
            {"dataset": summary["dataset"], "shard_count": len(dataset.shards), "prompts": dataset.stats.kept}
        )
    return finished


def prepared_version(run: RunSpec, dataset: str, s3_client: S3ClientFactory | None = None) -> PreparedDataset:
    """What prepare recorded of this run's version of `dataset` (its prompts/prepare.json)."""
    return _RunStorage.open(run, s3_client).prepared(dataset)


class NotPrepared(FinalError):
    """A dataset whose prepare never finished has no shards to verify or publish."""


def shard_groups(prepared: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """Every shard of the prepared datasets (`prepare_dataset`'s summaries), in at most `limit` groups of
    consecutive shards of one dataset, each `{"dataset", "first", "count"}`: one mapped task per group, which handles
    its shards in turn (a group never spans datasets, so one dataset's failed shard holds back no other's). Up to
    `limit` shards, every group is one shard."""
    counts = {p["dataset"]: p["shard_count"] for p in prepared if p.get("shard_count")}
    size = max(1, -(-sum(counts.values()) // limit))
    largest = max(counts.values(), default=1)
    while size < largest and sum(-(-count // size) for count in counts.values()) > limit:
        size += 1  # (a limit below the number of datasets still gives one group per dataset)
    return [
        {"dataset": dataset, "first": first, "count": min(size, count - first)}
        for dataset, count in counts.items()
        for first in range(0, count, size)
    ]


def group_shards(run: RunSpec, group: dict[str, Any], s3_client: S3ClientFactory | None = None) -> list[dict[str, Any]]:
    """The manifests of a group's shards (`shard_groups`), as prepare recorded them."""
    shards = prepared_version(run, group["dataset"], s3_client).shards
    return [shard.to_dict() for shard in shards[group["first"] : group["first"] + group["count"]]]


def generate_group(
    run: RunSpec, group: dict[str, Any], s3_client: S3ClientFactory | None = None, api_keys: ApiKeys = NO_KEYS
) -> dict[str, Any]:
    """A group's shards (`shard_groups`) generated in turn, each one's manifest kept in storage for validate. The
    group again: what the next task reads, the same few bytes at any number of shards."""
    for shard in group_shards(run, group, s3_client):
        _keep_stage_manifest(run, generate_shard(run, shard, s3_client, api_keys), "generate", s3_client)
    return _range(group)


def validate_group(run: RunSpec, group: dict[str, Any], s3_client: S3ClientFactory | None = None) -> dict[str, Any]:
    """A generated group's shards validated in turn, each one's manifest kept in storage for export; the group."""
    for shard in _kept_stage_manifests(run, group, "generate", s3_client):
        _keep_stage_manifest(run, validate_shard(run, shard, s3_client), "validate", s3_client)
    return _range(group)


def export_group(run: RunSpec, group: dict[str, Any], s3_client: S3ClientFactory | None = None) -> dict[str, Any]:
    """A validated group's shards exported in turn (each writes its final manifest, reports/shard-*.json, which
    verify reads); the group."""
    for shard in _kept_stage_manifests(run, group, "validate", s3_client):
        export_shard(run, shard, s3_client)
    return _range(group)


def _range(group: dict[str, Any]) -> dict[str, Any]:
    return {"dataset": group["dataset"], "first": group["first"], "count": group["count"]}


def _keep_stage_manifest(run: RunSpec, shard: dict[str, Any], stage: str, s3_client: S3ClientFactory | None) -> None:
    # Right after the stage's own claimed block: a run that lost the claim failed there and never gets here.
    manifest = ShardManifest.from_dict(shard)
    _RunStorage.open(run, s3_client).storage.put_bytes(manifest.keys.stage_manifest(stage), json.dumps(shard).encode())


def _kept_stage_manifests(
    run: RunSpec, group: dict[str, Any], stage: str, s3_client: S3ClientFactory | None
) -> list[dict[str, Any]]:
    """The manifests `stage` kept of a group's shards. Raises FinalError when one is missing: that stage's task
    did not finish it (cleared alone, or its files deleted), so it is the task to run again."""
    storage, location = _RunStorage.open(run, s3_client).storage, run.location(group["dataset"])
    manifests = []
    for number in range(group["first"], group["first"] + group["count"]):
        key = location.shard(number).stage_manifest(stage)
        if not storage.exists(key):
            raise FinalError(f"{storage.uri(key)} is missing: run {stage}_shard for this group again")
        manifests.append(get_json(storage, key))
    return manifests


def check_server(run: RunSpec, api_keys: ApiKeys = NO_KEYS) -> list[dict[str, Any]]:
    return check_fleet(run.endpoints, renderer_for(run), run.sampling, api_keys=api_keys)


def generate_shard(
    run: RunSpec, shard: dict[str, Any], s3_client: S3ClientFactory | None = None, api_keys: ApiKeys = NO_KEYS
) -> dict[str, Any]:
    from_run = {"endpoints", "concurrency", "request_timeout_s", "max_attempts", "fleet_wait_s", "checkpoint_every"}
    from_run |= {"checkpoint_s", "sample_timeouts", "max_server_rejected_share", "priority", "endpoint_affinity"}
    settings = GenerateSettings(api_keys=api_keys, sampling_params=run.sampling, **run.model_dump(include=from_run))
    manifest = ShardManifest.from_dict(shard)
    # Only an on-policy shard (prepare counted its turns) renders prompts as it goes: other shards never load the
    # tokenizer here.
    renderer = renderer_for(run) if manifest.num_answers is not None else None
    with _RunStorage.open(run, s3_client).writing(manifest.location) as storage:
        return run_generate(manifest, storage, settings, renderer).to_dict()


def validate_shard(run: RunSpec, shard: dict[str, Any], s3_client: S3ClientFactory | None = None) -> dict[str, Any]:
    renderer = renderer_for(run)
    settings = ValidateSettings(**run.validation)
    manifest = ShardManifest.from_dict(shard)
    with _RunStorage.open(run, s3_client).writing(manifest.location) as storage:
        return run_validate(manifest, storage, renderer, settings).to_dict()


def export_shard(run: RunSpec, shard: dict[str, Any], s3_client: S3ClientFactory | None = None) -> dict[str, Any]:
    settings = ExportSettings(**run.export)
    decode = renderer_for(run).decode if settings.review_text else None
    manifest = ShardManifest.from_dict(shard)
    with _RunStorage.open(run, s3_client).writing(manifest.location) as storage:
        return run_export(manifest, storage, settings, decode).to_dict()


def verify_dataset(run: RunSpec, prepared: dict[str, Any], s3_client: S3ClientFactory | None = None) -> dict[str, Any]:
    """A finished version read back whole before any manifest names it (regen.verify): every file's sha256, and
    every record's invariants. Raises VerificationFailed naming every problem, IncompleteDataset when shards did not
    finish. An unchanged dataset has nothing new to verify."""
    if "unchanged_since" in prepared:
        return {"dataset": prepared["dataset"], "unchanged": True}
    at = _RunStorage.open(run, s3_client)
    dataset = at.prepared(prepared["dataset"])
    with at.writing(dataset.location) as storage:  # its verdict holds only while no other run writes
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
    dataset = prepared["dataset"]
    if "unchanged_since" in prepared:
        return {"dataset": dataset, "unchanged": True, **prepared["unchanged_since"]}
    if not verified or "contents" not in verified:
        raise NotVerified(f"{dataset}: verify_dataset did not pass, so nothing is published; its log says why")
    at = _RunStorage.open(run, s3_client)
    prepared_dataset = at.prepared(dataset)
    with at.writing(prepared_dataset.location) as storage:  # the manifest is written by the version's writer
        published = run_publish(
            prepared_dataset, storage, fleet, run.sampling, run.overwrite_version, verified, run.run_id, run.cost
        )
    at.release(prepared_dataset.location)  # a published version is never written again
    return published


def asset_event(published: dict[str, Any]) -> dict[str, Any]:
    """What a dataset's asset event carries: enough for a consumer to find and verify the version."""
    keys = ("dataset", "version", "manifest", "manifest_sha256", "records", "splits", "inputs_digest")
    return {key: published[key] for key in keys if key in published}


def report(
    run: RunSpec,
    published: list[dict[str, Any]],
    fleet: list[dict[str, Any]],
    s3_client: S3ClientFactory | None = None,
) -> dict[str, Any]:
    """The run's summary (regen.run_report), once every dataset was published or failed: the run's claims on its
    versions are released first, so a Resume of what it left may start at once. Red unless every dataset delivered."""
    at = _RunStorage.open(run, s3_client)
    for dataset in run.datasets:
        at.release(run.location(dataset))
    return write_run_report(at.storage, run.to_dict(), run.datasets, published, fleet, run.cost)
