"""Whether one dataset's shards are finished, asked of Airflow: what its verify_dataset waits for.

Airflow maps the shard tasks once over the groups of every dataset (it cannot map within a mapped group), so no
dependency can say "this dataset's shards": verify_dataset is a sensor instead, rescheduled (no worker slot held)
until every shard task of its own groups succeeded, and failing at once, naming them, when one of them failed.
"""

from __future__ import annotations

from typing import Any

from regen.errors import FinalError

SHARD_TASKS = ("process_shard.generate_shard", "process_shard.validate_shard", "process_shard.export_shard")
# A shard task in any other state (none yet, queued, running, up_for_retry, restarting) is still to finish.
NOT_SUCCEEDED = frozenset({"failed", "upstream_failed", "skipped", "removed"})


class ShardsFailed(FinalError):
    """A dataset whose shard failed is not verified: clearing the failed tasks runs both again."""


def group_label(group: dict[str, Any]) -> str:
    """A group's name for people, as its tasks are labelled: `dataset/shard-00003`, `+N` for N more shards."""
    first, count = group["first"], group["count"]
    return f"{group['dataset']}/shard-{first:05d}" + (f" +{count - 1}" if count > 1 else "")


def own_shards_finished(dataset: str, groups: list[dict[str, Any]], states: dict[str, str | None]) -> bool:
    """True once every shard task of `dataset`'s groups (`list_shards`' groups; a group's map index is its place
    there) succeeded, False while any is still to run. `states`: Airflow's task states of the run, keyed
    `{task_id}_{map_index}`. Raises ShardsFailed naming every group whose task failed."""
    own = [(index, group) for index, group in enumerate(groups) if group["dataset"] == dataset]
    failed = [
        f"{group_label(group)} ({task.rsplit('.', 1)[-1]}: {state})"
        for index, group in own
        for task in SHARD_TASKS
        if (state := states.get(f"{task}_{index}")) in NOT_SUCCEEDED
    ]
    if failed:
        raise ShardsFailed(
            f"{dataset}: not verified, shards did not finish: {', '.join(failed)}. Clear the run's failed tasks "
            "(finished answers are kept): the shards run again and this task waits for them"
        )
    return all(states.get(f"{SHARD_TASKS[-1]}_{index}") == "success" for index, _ in own)


def run_shard_states(ti: Any) -> dict[str, str | None]:
    """The states of this run's shard tasks, from Airflow's execution API (one query, whatever the count)."""
    states = ti.get_task_states(dag_id=ti.dag_id, task_ids=list(SHARD_TASKS), run_ids=[ti.run_id])
    return dict(states.get(ti.run_id, {}))
