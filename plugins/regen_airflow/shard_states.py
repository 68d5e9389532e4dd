"""Whether one dataset's shards are finished, asked of Airflow: what its delivery waits for.

Airflow maps the shard tasks once over the groups of every dataset (it cannot map within a mapped group), so no
dependency can say "this dataset's shards". A small deferrable task waits instead: `WaitForOwnShards` defers to
`OwnShardsTrigger`, which polls, in the triggerer (no worker slot held), the states of the dataset's own shard tasks,
and fires once every one succeeded, or at once when one failed, naming it. Not reschedule mode: Airflow 3.3 may fail
a rescheduled sensor on a stale executor event (apache/airflow#71172).

Under `dag.test()` (and `airflow dags test`, which calls it) there is no triggerer: Airflow runs a deferred task's
trigger inline, in the one loop that also runs every other task, so a trigger waiting for the shards would wait
forever for tasks that loop can no longer run. There the wait asks once and, while the shards are still to finish,
hands the loop back by rescheduling itself (no executor there, so no stale event either).
"""

from __future__ import annotations

from asyncio import sleep
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from time import monotonic
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowRescheduleException
from airflow.triggers.base import BaseTrigger, TriggerEvent

SHARD_TASKS = ("process_shard.generate_shard", "process_shard.validate_shard", "process_shard.export_shard")
DAG_TEST_USER = "dag_test"  # the triggering user Airflow's dag.test() names on the run it makes
# A shard task in any other state (none yet, queued, running, up_for_retry, restarting) is still to finish.
NOT_SUCCEEDED = frozenset({"failed", "upstream_failed", "skipped", "removed"})
FIRST_POLL_S = 1.0


def next_poll_s(waited_s: float, poll_s: float) -> float:
    """How long to sleep before asking again, having waited `waited_s`: half that, from FIRST_POLL_S up to `poll_s`.
    So a wait ends at most a third of its length after its shards did (a small run's few seconds, not `poll_s`),
    and a night's long wait asks every `poll_s`."""
    return min(poll_s, max(FIRST_POLL_S, waited_s / 2))


def group_label(group: dict[str, Any]) -> str:
    """A group's name for people, as its tasks are labelled: `dataset/shard-00003`, `+N` for N more shards."""
    first, count = group["first"], group["count"]
    return f"{group['dataset']}/shard-{first:05d}" + (f" +{count - 1}" if count > 1 else "")


def own_indexes(dataset: str, groups: list[dict[str, Any]]) -> list[int]:
    """The map indexes of `dataset`'s shard tasks: a group's map index is its place in `list_shards`' groups."""
    return [index for index, group in enumerate(groups) if group["dataset"] == dataset]


def shard_failures(indexes: list[int], states: dict[str, str | None]) -> list[list[Any]]:
    """[map index, "task: state"] for every shard task of `indexes` that did not succeed and never will.
    `states`: Airflow's task states of the run, keyed `{task_id}_{map_index}`."""
    return [
        [index, f"{task.rsplit('.', 1)[-1]}: {state}"]
        for index in indexes
        for task in SHARD_TASKS
        if (state := states.get(f"{task}_{index}")) in NOT_SUCCEEDED
    ]


def shards_succeeded(indexes: list[int], states: dict[str, str | None]) -> bool:
    return all(states.get(f"{SHARD_TASKS[-1]}_{index}") == "success" for index in indexes)


def failed_message(dataset: str, groups: list[dict[str, Any]], failures: list[list[Any]]) -> str:
    named = ", ".join(f"{group_label(groups[index])} ({what})" for index, what in failures)
    return (
        f"{dataset}: not verified, shards did not finish: {named}. Clear the run's failed tasks (finished answers "
        "are kept): the shards run again and this task waits for them"
    )


class ShardsDidNotFinish(AirflowFailException):
    """The wait fails at once, never retried: its shards stay failed until cleared. Unlike a user error, clearing the
    run's failed tasks mends it, and the failure alert says so (regen_airflow.alerts)."""

    mended_by_clearing = True


def shard_states(dag_id: str, run_id: str) -> dict[str, str | None]:
    """The run's shard task states, from the execution API (a task's or the triggerer's call)."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    found = RuntimeTaskInstance.get_task_states(dag_id=dag_id, task_ids=list(SHARD_TASKS), run_ids=[run_id])
    return dict(found.get(run_id, {}))


def settled(indexes: list[int], states: dict[str, str | None]) -> dict[str, Any] | None:
    """The trigger's event once the shards of `indexes` are settled (all succeeded, or one failed); else None."""
    if failures := shard_failures(indexes, states):
        return {"status": "failed", "failures": failures}
    if shards_succeeded(indexes, states):
        return {"status": "success"}
    return None


class OwnShardsTrigger(BaseTrigger):
    """Polls the states of one run's shard tasks of the given map indexes (the triggerer reaches Airflow's execution
    API as a task does); fires {"status": "success"} once all succeeded, {"status": "failed", "failures": [...]} as
    soon as one failed."""

    def __init__(self, dag_id: str, run_id: str, indexes: list[int], poll_s: float) -> None:
        super().__init__()
        self.dag_id, self.run_id, self.indexes, self.poll_s = dag_id, run_id, list(indexes), poll_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs = {"dag_id": self.dag_id, "run_id": self.run_id, "indexes": self.indexes, "poll_s": self.poll_s}
        return f"{type(self).__module__}.{type(self).__qualname__}", kwargs

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from asgiref.sync import sync_to_async

        started = monotonic()
        while True:
            states = await sync_to_async(shard_states)(self.dag_id, self.run_id)
            if (event := settled(self.indexes, states)) is not None:
                yield TriggerEvent(event)
                return
            await sleep(next_poll_s(monotonic() - started, self.poll_s))


class WaitForOwnShards(BaseOperator):
    """Waits, deferred (no worker slot held), until the shard tasks of `prepared`'s dataset finished; fails naming
    the shards when one of them failed. Nothing to wait for (no groups: list_shards failed; no shards of its own)
    returns at once: verify_dataset then says what is missing."""

    template_fields = ("prepared", "groups")

    def __init__(
        self, *, prepared: Any, groups: Any, poll_s: float, wait_limit: timedelta = timedelta(days=7), **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.prepared, self.groups, self.poll_s, self.wait_limit = prepared, groups, poll_s, wait_limit

    def execute(self, context: Any) -> None:
        if not self.prepared or not self.groups:
            return
        indexes = own_indexes(self.prepared["dataset"], self.groups)
        if not indexes:  # unchanged since its last version, or no shards listed for it
            return
        ti = context["ti"]
        if context["dag_run"].triggering_user_name == DAG_TEST_USER:  # no triggerer: see the module's docstring
            event = settled(indexes, shard_states(ti.dag_id, ti.run_id))
            if event is None:
                now, started = datetime.now(UTC), context["dag_run"].start_date
                waited = (now - started).total_seconds() if started else self.poll_s
                raise AirflowRescheduleException(now + timedelta(seconds=next_poll_s(waited, self.poll_s)))
            return self.execute_complete(context, event)
        trigger = OwnShardsTrigger(ti.dag_id, ti.run_id, indexes, self.poll_s)
        self.defer(trigger=trigger, method_name="execute_complete", timeout=self.wait_limit)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> None:
        if event["status"] != "success":
            raise ShardsDidNotFinish(failed_message(self.prepared["dataset"], self.groups, event["failures"]))
