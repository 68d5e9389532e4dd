"""The pipeline's stages as plain functions of (run spec, manifest dict) -> manifest dict.

This is the seam between the orchestrator and the library: DAG tasks call exactly one of these each, and pass only
what they return (small JSON dicts) to each other. No value passed grows with the number of prompts: a prepared
dataset travels as its name and shard count, a group of shards as a range between every stage (its shards'
manifests stay in storage: prompts/prepare.json, then each stage's reports/shard-*.{stage}.json). Anything here runs
the same without Airflow.

Room by room: `run` (plan, the fleet check, the run's report), `prepare` (the prepare tasks), `shards` (the shard
tasks), `deliver` (verify and publish), and `run_storage`, where every task gets its storage, once.
"""

from regen.pipeline.deliver import NotVerified, asset_event, publish_dataset, verify_dataset
from regen.pipeline.prepare import (
    MAX_MAP_LENGTH,
    dataset_parts,
    finish_prepared,
    part_name,
    prepare_dataset,
    prepare_dataset_part,
    prepared_version,
)
from regen.pipeline.run import check_server, plan, preload, renderer_for, report
from regen.pipeline.run_storage import NotPrepared, RunStorage
from regen.pipeline.shards import (
    export_group,
    export_shard,
    generate_group,
    generate_shard,
    group_shards,
    run_groups,
    shard_groups,
    validate_group,
    validate_shard,
)
from regen.run_params import RunSpec

__all__ = [
    "MAX_MAP_LENGTH",
    "NotPrepared",
    "NotVerified",
    "RunSpec",
    "RunStorage",
    "asset_event",
    "check_server",
    "dataset_parts",
    "export_group",
    "export_shard",
    "finish_prepared",
    "generate_group",
    "generate_shard",
    "group_shards",
    "part_name",
    "plan",
    "preload",
    "prepare_dataset",
    "prepare_dataset_part",
    "prepared_version",
    "publish_dataset",
    "renderer_for",
    "report",
    "run_groups",
    "shard_groups",
    "validate_group",
    "validate_shard",
    "verify_dataset",
]
