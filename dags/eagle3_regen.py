"""eagle3_regen: regenerate EAGLE-3 drafter training data with the target model's own token ids.

Wiring only: every task calls one function of `regen.pipeline`, and tasks pass small manifests, never records.
prepare (per dataset) -> check_server -> [generate -> validate -> export] (per shard, pool-limited) -> publish (per
dataset, manifest.json last) -> report.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Asset, Param, TriggerRule, dag, get_current_context, task, task_group

from regen.chat import PROFILES
from regen.config import load_config

# The deployment's config is a local file read at parse time: it fills the trigger form (no network, no storage).
CONFIG = load_config()
FLEET_POOL = "sglang_fleet"
TRAINING_DATA = Asset(name="eagle3_regen_training_data", uri="regen://training-data")


def _s3_client() -> Any:
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    return S3Hook(aws_conn_id="aws_default").get_conn()


def _run(run: dict[str, Any]) -> Any:
    from regen.pipeline import RunSpec

    return RunSpec(**run)


@dag(
    dag_id="eagle3_regen",
    description="Regenerate EAGLE-3 drafter data: SGLang /generate on pre-tokenised prompts, raw output_ids kept",
    schedule=CONFIG.defaults.schedule,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=4,
    tags=["eagle3", "sglang", "training-data"],
    default_args={
        "retries": 3,
        "retry_delay": timedelta(seconds=30),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(minutes=10),
    },
    params={
        "datasets": Param(
            list(CONFIG.datasets),
            type="array",
            items={"type": "string", "enum": list(CONFIG.datasets)},
            examples=list(CONFIG.datasets),
            title="Datasets",
            description="Which datasets of the deployment's config to regenerate.",
        ),
        "endpoints": Param(
            CONFIG.defaults.endpoints,
            type="array",
            items={"type": "string", "pattern": "^https?://"},
            title="SGLang endpoints",
            description="Base URLs of SGLang servers, or one sglang-router URL.",
        ),
        "storage_root": Param(
            CONFIG.resolve(CONFIG.defaults.storage_root),
            type="string",
            minLength=1,
            title="Storage root",
            description="s3://bucket/prefix (credentials from the aws_default connection) or a local directory.",
        ),
        "profile": Param(CONFIG.defaults.profile, type="string", enum=sorted(PROFILES), title="Model profile"),
        "limit": Param(
            None, type=["null", "integer"], minimum=1, title="Samples per dataset", description="Empty = all."
        ),
        "sampling": Param(
            CONFIG.defaults.sampling.model_dump(),
            type="object",
            title="Sampling",
            description="max_new_tokens, temperature, top_p, top_k, min_p; every value is sent explicitly.",
        ),
        "export": Param(
            CONFIG.defaults.export.model_dump(),
            type="object",
            properties={"jsonl": {"type": "boolean"}, "review_text": {"type": "boolean"}},
            additionalProperties=False,
            title="Export",
            description="jsonl: also write JSON Lines (input_ids, loss_mask) for SpecForge / speculators loaders; "
            "review_text: add a decoded text column for reviewers.",
        ),
        "version": Param(
            None,
            type=["null", "string"],
            pattern="^[A-Za-z0-9_.-]+$",
            title="Version",
            description="Empty: derived from the run. Set an earlier version to resume or extend it.",
        ),
    },
)
def eagle3_regen() -> None:
    @task
    def plan(**context: Any) -> dict[str, Any]:
        from regen.pipeline import RunSpec

        return RunSpec.from_params(context["params"], context["dag_run"].run_id).to_dict()

    @task
    def dataset_names(run: dict[str, Any]) -> list[str]:
        return list(run["datasets"])  # mapping needs a task's return value, not a key of it

    @task(map_index_template="{{ label }}")
    def prepare_dataset(run: dict[str, Any], dataset: str) -> dict[str, Any]:
        from regen import pipeline

        get_current_context()["label"] = dataset  # type: ignore[typeddict-unknown-key]
        return pipeline.prepare_dataset(_run(run), dataset, _s3_client)

    @task
    def check_server(run: dict[str, Any]) -> list[dict[str, Any]]:
        from airflow.sdk.exceptions import AirflowFailException

        from regen import pipeline
        from regen.sglang.server_check import ServerMismatch

        try:
            return pipeline.check_server(_run(run))
        except ServerMismatch as e:  # the wrong fleet stays wrong: fail now, no retries
            raise AirflowFailException(str(e)) from e

    @task
    def list_shards(prepared: list[dict[str, Any]]) -> list[dict[str, Any]]:
        from regen import pipeline

        return pipeline.shards_of(list(prepared))

    def _label(shard: dict[str, Any]) -> None:
        label = f"{shard['location']['dataset']}/shard-{shard['shard']:05d}"
        get_current_context()["label"] = label  # type: ignore[typeddict-unknown-key]

    @task(pool=FLEET_POOL, map_index_template="{{ label }}")
    def generate_shard(run: dict[str, Any], shard: dict[str, Any]) -> dict[str, Any]:
        from regen import pipeline

        _label(shard)
        return pipeline.generate_shard(_run(run), shard, _s3_client)

    @task(map_index_template="{{ label }}")
    def validate_shard(run: dict[str, Any], shard: dict[str, Any]) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        from regen import pipeline
        from regen.validate import TemplateDrift

        _label(shard)
        try:
            return pipeline.validate_shard(_run(run), shard, _s3_client)
        except TemplateDrift as e:  # the deployment's template changed: a retry renders the same way
            raise AirflowFailException(str(e)) from e

    @task(map_index_template="{{ label }}")
    def export_shard(run: dict[str, Any], shard: dict[str, Any]) -> dict[str, Any]:
        from regen import pipeline

        _label(shard)
        return pipeline.export_shard(_run(run), shard, _s3_client)

    @task_group
    def process_shard(run: dict[str, Any], shard: dict[str, Any]) -> Any:
        return export_shard(run, validate_shard(run, generate_shard(run, shard)))

    # Publish and report run even when some shards failed: complete datasets are published, the rest say why.
    @task(outlets=[TRAINING_DATA], trigger_rule=TriggerRule.ALL_DONE, map_index_template="{{ label }}")
    def publish_dataset(run: dict[str, Any], prepared: dict[str, Any], fleet: list[dict[str, Any]]) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        from regen import pipeline
        from regen.publish import IncompleteDataset

        get_current_context()["label"] = prepared["location"]["dataset"]  # type: ignore[typeddict-unknown-key]
        try:
            published = pipeline.publish_dataset(_run(run), prepared, fleet or [], _s3_client)
        except IncompleteDataset as e:  # cannot succeed until the failed shards are cleared: no retries
            raise AirflowFailException(str(e)) from e
        get_current_context()["outlet_events"][TRAINING_DATA].extra = published
        return published

    @task(trigger_rule=TriggerRule.ALL_DONE)
    def report(run: dict[str, Any], published: list[dict[str, Any]], fleet: list[dict[str, Any]]) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        from regen import pipeline

        try:
            return pipeline.report(_run(run), [p for p in published if p], fleet or [], _s3_client)
        except pipeline.IncompleteRun as e:  # the report is written; the run is red
            raise AirflowFailException(str(e)) from e

    run = plan()
    prepared = prepare_dataset.partial(run=run).expand(dataset=dataset_names(run))
    fleet = check_server(run)
    shards = list_shards(prepared)
    fleet >> shards
    processed = process_shard.partial(run=run).expand(shard=shards)
    published = publish_dataset.partial(run=run, fleet=fleet).expand(prepared=prepared)
    processed >> published
    report(run, published, fleet)


eagle3_regen()
