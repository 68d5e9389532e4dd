"""eagle3_regen: regenerate EAGLE-3 drafter training data with the target model's own token ids.

Wiring only: every task calls one function of `regen.pipeline`, and tasks pass small manifests, never records: no
XCom grows with the number of prompts (a prepared dataset is its shard count, a group of shards a range).
plan -> check_server -> prepare (per dataset; a large one's tokenizing in parts, per part) ->
[generate -> validate -> export] (per shard, pool-limited) ->
[verify -> publish] (per dataset, once its own shards finished: every file and record read back, then manifest.json
last and one asset event)
-> report. The run is red unless every selected
dataset was published or is unchanged since its last version.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Asset, Param, TriggerRule, dag, get_current_context, task, task_group

from regen.config import load_config
from regen.run_params import form
from regen_airflow.alerts import failure_notifiers
from regen_airflow.shard_states import WaitForOwnShards, group_label
from regen_airflow.tasks import (
    PUBLISHED_DATASETS,
    final_errors_fail_now,
    run_api_keys,
    run_s3_client,
    s3_client,
    worker_task_slots,
)

# The deployment's config is a local file read at parse time: it fills the trigger form (no network, no storage).
CONFIG = load_config()
FLEET_POOL = "sglang_fleet"
# The logins of the config's endpoint URLs: the run spec in XCom holds `***` in their place (regen.endpoints).
ENDPOINTS = CONFIG.defaults.endpoints


def _run(run: dict[str, Any]) -> Any:
    from regen.run_params import RunSpec

    return RunSpec.model_validate(run)


@dag(
    dag_id="eagle3_regen",
    description="Regenerate EAGLE-3 drafter data: SGLang /generate on pre-tokenized prompts, raw output_ids kept",
    doc_md=__doc__,
    schedule=CONFIG.defaults.schedule,
    start_date=datetime(2026, 1, 1),
    catchup=False,  # a nightly schedule never starts a storm of missed nights; backfill them on purpose
    max_active_runs=1,  # runs share one fleet: a second run waits its turn rather than halve the first's share
    tags=["eagle3", "sglang", "training-data"],
    default_args={
        "retries": CONFIG.defaults.task_retries,
        "retry_delay": timedelta(seconds=CONFIG.defaults.retry_delay_s),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(minutes=10),
        "on_failure_callback": failure_notifiers(CONFIG.alerts),
    },
    # The trigger form: every field of regen.run_params.RunParams, the deployment's defaults filled in.
    params={name: Param(**field) for name, field in form(CONFIG).items()},
)
def eagle3_regen() -> None:
    @task
    def plan(**context: Any) -> dict[str, Any]:
        from regen import pipeline

        with final_errors_fail_now():  # a user error: say what to fix, at once
            dag_run = context["dag_run"]  # a manual run may have no logical date: then when it was due
            return pipeline.plan(
                context["params"], dag_run.run_id, s3_client, dag_run.logical_date or dag_run.run_after
            )

    @task
    def dataset_names(run: dict[str, Any]) -> list[str]:
        return list(run["datasets"])  # mapping needs a task's return value, not a key of it

    @task(map_index_template="{{ label }}")
    def prepare_dataset(run: dict[str, Any], dataset: str) -> dict[str, Any]:
        from regen import pipeline

        get_current_context()["label"] = dataset  # type: ignore[typeddict-unknown-key]
        with final_errors_fail_now(f"{dataset}: "):  # a missing or damaged source reads the same on a retry
            return pipeline.prepare_dataset(_run(run), dataset, run_s3_client(run), worker_task_slots())

    @task(trigger_rule=TriggerRule.ALL_DONE)  # one dataset's failed prepare holds back no other's parts
    def list_prepare_parts(run: dict[str, Any] | None, prepared: list[dict[str, Any]] | None) -> list[list[int]]:
        from regen import pipeline

        if run is None or not prepared:  # plan or check_server failed: nothing to map, and list_shards says why
            return []
        with final_errors_fail_now():  # more parts than Airflow maps: the message says what to set
            return pipeline.dataset_parts(_run(run), [p for p in prepared if p])

    # A large dataset's tokenizing is shared by mapped tasks, one part each (any worker may take one); its one
    # reader, prepare_dataset, already deduplicated it whole.
    @task(map_index_template="{{ label }}")
    def prepare_part(run: dict[str, Any], part: list[int]) -> dict[str, Any]:
        from regen import pipeline

        spec = _run(run)
        name = pipeline.part_name(spec, part)
        get_current_context()["label"] = name  # type: ignore[typeddict-unknown-key]
        with final_errors_fail_now(f"{name}: "):  # a changed template renders the same way on a retry
            return pipeline.prepare_dataset_part(spec, part, run_s3_client(run))

    @task
    def check_server(run: dict[str, Any]) -> list[dict[str, Any]]:
        from regen import pipeline

        with final_errors_fail_now():  # the wrong fleet (or API key) stays wrong
            return pipeline.check_server(_run(run), run_api_keys(run, get_current_context()["params"], ENDPOINTS))

    # A dataset whose prepare failed must not hold back the others: shards are listed from the datasets that were
    # prepared, once the fleet check passed; a dataset prepared in parts is recorded whole here, once its parts are.
    @task(trigger_rule=TriggerRule.ALL_DONE)
    def list_shards(
        run: dict[str, Any], prepared: list[dict[str, Any]], fleet: list[dict[str, Any]] | None
    ) -> list[dict[str, Any]]:
        from airflow.sdk.exceptions import AirflowFailException

        from regen import pipeline

        if not fleet:
            raise AirflowFailException(  # check_server failed, or never ran because plan failed before it
                "no fleet check passed (check_server failed, or plan failed before it ran): no shard is sent to the "
                "fleet; the earliest failed task says why"
            )
        finished = pipeline.finish_prepared(_run(run), [p for p in prepared if p], run_s3_client(run))
        return pipeline.run_groups(_run(run), finished, run_s3_client(run))

    # Each mapped task handles one shard, or a group of consecutive shards in turn when a run has more shards than
    # the config's shard_task_limit. The group travels as a range, whatever its size: each stage keeps its shards'
    # manifests in storage, where the next stage reads them.
    def _label(group: dict[str, Any]) -> None:
        get_current_context()["label"] = group_label(group)  # type: ignore[typeddict-unknown-key]

    @task(pool=FLEET_POOL, map_index_template="{{ label }}")
    def generate_shard(run: dict[str, Any], group: dict[str, Any], fleet: list[dict[str, Any]]) -> dict[str, Any]:
        from regen import pipeline

        _label(group)
        keys = run_api_keys(run, get_current_context()["params"], ENDPOINTS)  # logins of endpoint URLs too
        with final_errors_fail_now():  # a refused API key, a template changed mid-conversation
            return pipeline.generate_group(_run(run), group, run_s3_client(run), keys, fleet)

    @task(map_index_template="{{ label }}")
    def validate_shard(run: dict[str, Any], group: dict[str, Any]) -> dict[str, Any]:
        from regen import pipeline

        _label(group)
        with final_errors_fail_now():  # a changed template renders the same way on a retry
            return pipeline.validate_group(_run(run), group, run_s3_client(run))

    @task(map_index_template="{{ label }}")
    def export_shard(run: dict[str, Any], group: dict[str, Any]) -> dict[str, Any]:
        from regen import pipeline

        _label(group)
        with final_errors_fail_now():  # a stage's manifest missing: that stage is the one to run again
            return pipeline.export_group(_run(run), group, run_s3_client(run))

    @task_group
    def process_shard(run: dict[str, Any], group: dict[str, Any], fleet: list[dict[str, Any]]) -> Any:
        return export_shard(run, validate_shard(run, generate_shard(run, group, fleet)))

    # Verify, publish and report run even when some shards failed: complete datasets are published, the rest say why.
    @task(trigger_rule=TriggerRule.ALL_DONE, map_index_template="{{ label }}")
    def verify_dataset(run: dict[str, Any], prepared: dict[str, Any]) -> dict[str, Any]:
        from regen import pipeline

        get_current_context()["label"] = prepared["dataset"]  # type: ignore[typeddict-unknown-key]
        with final_errors_fail_now():  # unfinished shards, or data that does not read back as written
            return pipeline.verify_dataset(_run(run), prepared, run_s3_client(run))

    # `verified` is None when this dataset's verify_dataset failed: publish then refuses, and says so.
    @task(outlets=[PUBLISHED_DATASETS], trigger_rule=TriggerRule.ALL_DONE, map_index_template="{{ label }}")
    def publish_dataset(
        run: dict[str, Any], prepared: dict[str, Any], fleet: list[dict[str, Any]], verified: dict[str, Any] | None
    ) -> dict[str, Any]:
        from regen import pipeline

        context = get_current_context()
        context["label"] = prepared["dataset"]  # type: ignore[typeddict-unknown-key]
        with final_errors_fail_now():  # not verified, or a version published with other data
            published = pipeline.publish_dataset(_run(run), prepared, fleet or [], verified, run_s3_client(run))
        if not published.get("unchanged"):  # an unchanged dataset has no new version: its asset is not updated
            asset = Asset(name=published["dataset_uri"], uri=published["dataset_uri"])
            context["outlet_events"][PUBLISHED_DATASETS].add(asset, extra=pipeline.asset_event(published))
        return published

    # One group per dataset: its verify waits for its own shards only (deferred in the triggerer, no slot held; at
    # once failed, naming them, when one failed), and its publish for its own verify, never for another dataset's.
    @task_group
    def deliver_dataset(
        run: dict[str, Any], prepared: dict[str, Any], fleet: list[dict[str, Any]], groups: list[dict[str, Any]]
    ) -> Any:
        waited = WaitForOwnShards(
            task_id="wait_for_shards",
            prepared=prepared,
            groups=groups,
            poll_s=CONFIG.defaults.verify_poll_s,
            trigger_rule=TriggerRule.ALL_DONE,  # list_shards failed: nothing to wait for, and verify says why
            map_index_template="{{ task.prepared.dataset }}",
        )
        verified = verify_dataset(run, prepared)
        waited >> verified
        return publish_dataset(run, prepared, fleet, verified)

    @task(trigger_rule=TriggerRule.ALL_DONE)
    def report(
        run: dict[str, Any], published: list[dict[str, Any]] | dict[str, Any], fleet: list[dict[str, Any]]
    ) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        from regen import pipeline

        if run is None:
            raise AirflowFailException("plan failed: nothing ran; its log says what to fix")
        if isinstance(published, dict):  # from a mapped task group of one, Airflow hands the one value, not a list
            published = [published]
        with final_errors_fail_now():  # the report is written; the run is red
            return pipeline.report(_run(run), [p for p in published or [] if p], fleet or [], run_s3_client(run))

    run = plan()
    fleet = check_server(run)
    prepared = prepare_dataset.partial(run=run).expand(dataset=dataset_names(run))
    fleet >> prepared  # nothing is written for a fleet that cannot serve the run
    parts = prepare_part.partial(run=run).expand(part=list_prepare_parts(run, prepared))
    shards = list_shards(run, prepared, fleet)
    parts >> shards
    shard_tasks = process_shard.partial(run=run, fleet=fleet).expand(group=shards)
    published = deliver_dataset.partial(run=run, fleet=fleet, groups=shards).expand(prepared=prepared)
    # report releases the run's claims: not while a shard task (its siblings' failure ended a dataset's wait) writes.
    shard_tasks >> report(run, published, fleet)


eagle3_regen()
