"""The shard tasks: a run's shards in groups (`shard_groups`), and each group through generate, validate and export.

A group is a range of positions in the dataset's prompts/prepare.json (`{"dataset", "first", "count"}`), and every
stage names its shards the same way: by those positions, through the shard manifests prepare recorded there. Never by
shard number: a dataset prepared in parts keeps shard numbers for each part in advance, and a part that loses prompts
at tokenize writes fewer shards than it kept numbers for, so its numbers have gaps. Each stage keeps its shards'
manifests in storage (`reports/shard-*.{stage}.json`) for the next, and a task opens its run's storage once for all
of its group's shards.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from regen.errors import FinalError
from regen.hints import RUN_ORDER, Hints
from regen.manifest import PreparedDataset, ShardManifest
from regen.metrics import current as metrics
from regen.pipeline.run import renderer_for
from regen.pipeline.run_storage import RunStorage
from regen.pipeline.version_settings import VersionSettings
from regen.run_params import RunSpec
from regen.sglang.auth import NO_KEYS, ApiKeys
from regen.sglang.served_model import fleet_priority_order
from regen.stages.export import ExportSettings, run_export
from regen.stages.generate.generate import GenerateSettings, run_generate
from regen.stages.generate.order import longest_work_first
from regen.stages.validate import ValidateSettings, run_validate
from regen.storage import S3ClientFactory, get_json

log = logging.getLogger(__name__)


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


def run_groups(run: RunSpec, prepared: list[dict[str, Any]], s3_client: S3ClientFactory | None = None) -> list[Any]:
    """The run's shard groups (`shard_groups`) in one order across its datasets, the longest work prepare expects
    first (`longest_work_first`, from each shard's `longest_expected` in prepare's record): the scheduler starts a
    mapped task's instances by map index, so the fleet's pool takes them in this order, and no dataset's long work
    starts after another's short work to end the run alone. A hint: if the records cannot be read, dataset after
    dataset. (Read here, not carried in prepare's XCom, which stays a few counts at any number of shards.)"""
    groups = shard_groups(prepared, run.shard_task_limit)
    if not run.longest_first:
        return groups
    return Hints().use(RUN_ORDER, groups, _longest_first, run, groups, s3_client)


def _longest_first(run: RunSpec, groups: list[dict[str, Any]], s3_client: S3ClientFactory | None) -> list[Any]:
    at = RunStorage.open(run, s3_client)
    longest = {
        dataset: [s.longest_expected for s in at.prepared(dataset).shards] for dataset in {g["dataset"] for g in groups}
    }

    def work(group: dict[str, Any]) -> int | None:
        shards = longest[group["dataset"]][group["first"] : group["first"] + group["count"]]
        return max((w for w in shards if w is not None), default=None)

    return [groups[i] for i in longest_work_first([work(group) for group in groups])]


def group_shards(run: RunSpec, group: dict[str, Any], s3_client: S3ClientFactory | None = None) -> list[dict[str, Any]]:
    """The manifests of a group's shards (`shard_groups`), as prepare recorded them."""
    return [shard.to_dict() for shard in _group(RunStorage.open(run, s3_client).prepared(group["dataset"]), group)]


def _group(prepared: PreparedDataset, group: dict[str, Any]) -> list[ShardManifest]:
    return prepared.shards[group["first"] : group["first"] + group["count"]]


def generate_group(
    run: RunSpec,
    group: dict[str, Any],
    s3_client: S3ClientFactory | None = None,
    api_keys: ApiKeys = NO_KEYS,
    fleet: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A group's shards (`shard_groups`) generated in turn, each one's manifest kept in storage for validate. The
    group again: what the next task reads, the same few bytes at any number of shards. `fleet`: check_server's
    record of it (how its servers admit their waiting queues, for chain priority)."""
    at = RunStorage.open(run, s3_client)
    prepared = at.prepared(group["dataset"])
    version = VersionSettings.of(prepared, run)
    order = priority_order_for(run, fleet)
    for shard in _group(prepared, group):
        _keep_stage_manifest(at, _generate(at, shard.to_dict(), api_keys, version, order), "generate")
    return _range(group)


def priority_order_for(run: RunSpec, fleet: list[dict[str, Any]] | None) -> str | None:
    """The fleet's priority order where the run's chain priority can use it; None (with a warning) where not."""
    if not run.chain_priority:
        return None
    order = fleet_priority_order(fleet or [])
    if order is None:
        log.warning(
            "chain_priority is on, but not every server of the fleet says it runs --enable-priority-scheduling (in "
            "one order): requests are sent with the run's priority as without it (docs/scaling.md)"
        )
    return order


def validate_group(run: RunSpec, group: dict[str, Any], s3_client: S3ClientFactory | None = None) -> dict[str, Any]:
    """A generated group's shards validated in turn, each one's manifest kept in storage for export; the group."""
    at = RunStorage.open(run, s3_client)
    for shard in _kept_stage_manifests(at, at.prepared(group["dataset"]), group, "generate"):
        _keep_stage_manifest(at, _validate(at, shard), "validate")
    return _range(group)


def export_group(run: RunSpec, group: dict[str, Any], s3_client: S3ClientFactory | None = None) -> dict[str, Any]:
    """A validated group's shards exported in turn (each writes its final manifest, reports/shard-*.json, which
    verify reads); the group."""
    at = RunStorage.open(run, s3_client)
    prepared = at.prepared(group["dataset"])  # read once: the version's settings and the group's shards
    version = VersionSettings.of(prepared, run)
    for shard in _kept_stage_manifests(at, prepared, group, "validate"):
        _export(at, shard, version)
    return _range(group)


def _range(group: dict[str, Any]) -> dict[str, Any]:
    return {"dataset": group["dataset"], "first": group["first"], "count": group["count"]}


def _keep_stage_manifest(at: RunStorage, shard: dict[str, Any], stage: str) -> None:
    # Right after the stage's own claimed block: a run that lost the claim failed there and never gets here.
    manifest = ShardManifest.from_dict(shard)
    at.storage.put_bytes(manifest.keys.stage_manifest(stage), json.dumps(shard).encode())


def _kept_stage_manifests(
    at: RunStorage, prepared: PreparedDataset, group: dict[str, Any], stage: str
) -> list[dict[str, Any]]:
    """The manifests `stage` kept of a group's shards. Raises FinalError when one is missing: that stage's task
    did not finish it (cleared alone, or its files deleted), so it is the task to run again."""
    manifests = []
    for shard in _group(prepared, group):
        key = shard.keys.stage_manifest(stage)
        if not at.storage.exists(key):
            raise FinalError(f"{at.storage.uri(key)} is missing: run {stage}_shard for this group again")
        manifests.append(get_json(at.storage, key))
    return manifests


def generate_shard(
    run: RunSpec, shard: dict[str, Any], s3_client: S3ClientFactory | None = None, api_keys: ApiKeys = NO_KEYS
) -> dict[str, Any]:
    at = RunStorage.open(run, s3_client)
    return _generate(at, shard, api_keys, _version(at, shard))


def validate_shard(run: RunSpec, shard: dict[str, Any], s3_client: S3ClientFactory | None = None) -> dict[str, Any]:
    return _validate(RunStorage.open(run, s3_client), shard)


def export_shard(run: RunSpec, shard: dict[str, Any], s3_client: S3ClientFactory | None = None) -> dict[str, Any]:
    at = RunStorage.open(run, s3_client)
    return _export(at, shard, _version(at, shard))


def _version(at: RunStorage, shard: dict[str, Any]) -> VersionSettings:
    return VersionSettings.of(at.prepared(ShardManifest.from_dict(shard).location.dataset), at.run)


def _generate(
    at: RunStorage,
    shard: dict[str, Any],
    api_keys: ApiKeys,
    version: VersionSettings,
    priority_order: str | None = None,
) -> dict[str, Any]:
    run = at.run
    from_run = {"endpoints", "concurrency", "request_timeout_s", "max_attempts", "fleet_wait_s", "checkpoint_every"}
    from_run |= {"checkpoint_s", "sample_timeouts", "max_server_rejected_share", "priority", "endpoint_affinity"}
    settings = GenerateSettings(
        api_keys=api_keys,
        sampling_params=version.sampling,
        priority_order=priority_order,
        **run.model_dump(include=from_run),
    )
    manifest = ShardManifest.from_dict(shard)
    # Only an on-policy shard (prepare counted its turns) renders prompts as it goes: other shards never load the
    # tokenizer here.
    renderer = renderer_for(run) if manifest.num_answers is not None else None
    with at.writing(manifest.location) as storage:
        return _counted(run_generate(manifest, storage, settings, renderer), "generate")


def _validate(at: RunStorage, shard: dict[str, Any]) -> dict[str, Any]:
    renderer = renderer_for(at.run)
    settings = ValidateSettings(**at.run.validation)
    manifest = ShardManifest.from_dict(shard)
    with at.writing(manifest.location) as storage:
        return _counted(run_validate(manifest, storage, renderer, settings), "validate")


def _export(at: RunStorage, shard: dict[str, Any], version: VersionSettings) -> dict[str, Any]:
    settings = ExportSettings(**version.export, validation_share=version.validation_share)
    decode = renderer_for(at.run).decode if settings.review_text else None
    manifest = ShardManifest.from_dict(shard)
    with at.writing(manifest.location) as storage:
        return _counted(run_export(manifest, storage, settings, decode), "export")


def _counted(shard: ShardManifest, stage: str) -> dict[str, Any]:
    """A shard through `stage`, counted with its rejections there (regen.metrics)."""
    done = shard.to_dict()
    metrics().stage_done(shard.location.dataset, stage, done["stats"].get(stage) or {})
    return done
