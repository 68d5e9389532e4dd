"""A dataset's delivery waits for its own shard tasks only: what it reads of Airflow's task states, and how it
waits (deferred to the triggerer)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from regen_airflow.shard_states import (
    SHARD_TASKS,
    ShardsDidNotFinish,
    failed_message,
    own_indexes,
    shard_failures,
    shards_succeeded,
)

GROUPS = [  # list_shards' groups: a group's map index is its place here
    {"dataset": "small", "first": 0, "count": 1},
    {"dataset": "large", "first": 0, "count": 2},
    {"dataset": "large", "first": 2, "count": 2},
]


def states(**by_index: str | None) -> dict[str, str | None]:
    """Every shard task of map index i in the state given as i<N>=state; 'success' for the ones not named."""
    named = {int(key[1:]): state for key, state in by_index.items()}
    return {f"{task}_{i}": named.get(i, "success") for task in SHARD_TASKS for i in range(len(GROUPS))}


def finished(dataset: str, states: dict[str, str | None]) -> bool:
    """What the trigger decides for `dataset`: True once done, False while waiting; failed: the wait's message."""
    indexes = own_indexes(dataset, GROUPS)
    if failures := shard_failures(indexes, states):
        raise ShardsDidNotFinish(failed_message(dataset, GROUPS, failures))
    return shards_succeeded(indexes, states)


def test_a_dataset_whose_own_shards_succeeded_is_finished_whatever_the_others_do() -> None:
    running = states(i1="running", i2=None)
    assert finished("small", running)
    assert not finished("large", running)
    assert not finished("large", {})  # not expanded yet: still to run, not failed
    assert not finished("large", states(i2="up_for_retry"))
    assert finished("large", states())
    assert own_indexes("absent", GROUPS) == []  # no shards of its own (unchanged, or not prepared): no wait


def test_a_failed_shard_fails_its_own_dataset_at_once_naming_it_and_no_other() -> None:
    failed = {**states(i0="running"), f"{SHARD_TASKS[1]}_2": "failed", f"{SHARD_TASKS[2]}_2": "upstream_failed"}
    with pytest.raises(ShardsDidNotFinish) as raised:
        finished("large", failed)
    message = str(raised.value)
    assert "large/shard-00002 +1 (validate_shard: failed)" in message
    assert "large/shard-00002 +1 (export_shard: upstream_failed)" in message
    assert "shard-00000" not in message and "Clear the run's failed tasks" in message
    assert not finished("small", failed)  # the other dataset still waits for its own only


def test_the_wait_defers_to_a_trigger_the_triggerer_rebuilds_from_its_classpath() -> None:
    from types import SimpleNamespace

    from airflow._shared.module_loading import import_string
    from airflow.sdk.exceptions import TaskDeferred

    from regen_airflow.shard_states import OwnShardsTrigger, WaitForOwnShards

    wait = WaitForOwnShards(task_id="wait", prepared={"dataset": "large"}, groups=GROUPS, poll_s=2)
    ti = SimpleNamespace(dag_id="eagle3_regen", run_id="manual__1")
    run = SimpleNamespace(triggering_user_name="admin")  # triggered from the UI, run by the scheduler
    with pytest.raises(TaskDeferred) as deferred:
        wait.execute({"ti": ti, "dag_run": run})
    assert deferred.value.method_name == "execute_complete"
    classpath, kwargs = deferred.value.trigger.serialize()
    rebuilt = import_string(classpath)(**kwargs)  # what the triggerer does with the stored trigger
    assert isinstance(rebuilt, OwnShardsTrigger) and rebuilt.serialize() == (classpath, kwargs)
    assert kwargs == {"dag_id": "eagle3_regen", "run_id": "manual__1", "indexes": [1, 2], "poll_s": 2}
    # Nothing to wait for: no shards of its own, or no groups at all (list_shards failed): no deferral.
    assert WaitForOwnShards(task_id="w", prepared={"dataset": "absent"}, groups=GROUPS, poll_s=2).execute({}) is None
    assert WaitForOwnShards(task_id="w", prepared={"dataset": "large"}, groups=None, poll_s=2).execute({}) is None


def test_under_dag_test_the_wait_reschedules_itself_until_its_shards_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    """dag.test() has no triggerer and would run the trigger inline, blocking the loop that runs the shards: there
    the wait asks once, and reschedules while its own shards are still to finish."""
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowRescheduleException

    from regen_airflow import shard_states
    from regen_airflow.shard_states import DAG_TEST_USER, ShardsDidNotFinish, WaitForOwnShards

    started = datetime.now(UTC) - timedelta(seconds=60)  # the run's: it has waited a minute, so it asks in 2 s
    context = {
        "ti": SimpleNamespace(dag_id="eagle3_regen", run_id="manual__1"),
        "dag_run": SimpleNamespace(triggering_user_name=DAG_TEST_USER, start_date=started),
    }
    wait = WaitForOwnShards(task_id="wait", prepared={"dataset": "large"}, groups=GROUPS, poll_s=2)
    export = "process_shard.export_shard"
    for states in [{}, {f"{export}_1": "success", f"{export}_2": "running"}]:
        monkeypatch.setattr(shard_states, "shard_states", lambda dag_id, run_id, found=states: found)
        with pytest.raises(AirflowRescheduleException) as rescheduled:
            wait.execute(context)
        assert 1.9 < (rescheduled.value.reschedule_date - datetime.now(UTC)).total_seconds() <= 2
    monkeypatch.setattr(shard_states, "shard_states", lambda *_: {f"{export}_1": "success", f"{export}_2": "success"})
    assert wait.execute(context) is None
    monkeypatch.setattr(shard_states, "shard_states", lambda *_: {f"{export}_1": "success", f"{export}_2": "failed"})
    with pytest.raises(ShardsDidNotFinish, match="large/shard"):
        wait.execute(context)


def test_the_trigger_asks_after_a_second_then_at_half_the_time_waited_up_to_poll_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A small dataset's shards end within seconds of the wait's start: asked every 30 s, each run's delivery would
    idle up to 30 s after its shards. It asks after 1 s, then after half what it has waited, at most every poll_s."""
    import asyncio

    from regen_airflow import shard_states
    from regen_airflow.shard_states import OwnShardsTrigger

    clock, sleeps, asks = [0.0], [], []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock[0] += seconds

    export = "process_shard.export_shard"

    def states(dag_id: str, run_id: str) -> dict[str, str]:
        asks.append(clock[0])
        return {f"{export}_1": "success" if len(asks) > 8 else "running"}

    monkeypatch.setattr(shard_states, "shard_states", states)
    monkeypatch.setattr(shard_states, "monotonic", lambda: clock[0])
    monkeypatch.setattr(shard_states, "sleep", sleep)

    async def first_event() -> Any:
        return await anext(OwnShardsTrigger("eagle3_regen", "manual__1", [1], poll_s=4).run())

    event = asyncio.run(first_event())
    assert event.payload == {"status": "success"} and len(asks) == 9
    assert sleeps == [1, 1, 1, 1.5, 2.25, 3.375, 4, 4]


def test_the_wait_fails_naming_the_failed_shard_when_the_trigger_says_so() -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from regen_airflow.alerts import advice
    from regen_airflow.shard_states import WaitForOwnShards

    wait = WaitForOwnShards(task_id="wait", prepared={"dataset": "large"}, groups=GROUPS, poll_s=2)
    assert wait.execute_complete({}, {"status": "success"}) is None
    with pytest.raises(AirflowFailException, match=r"large/shard-00002 \+1 \(validate_shard: failed\)") as failed:
        wait.execute_complete({}, {"status": "failed", "failures": [[2, "validate_shard: failed"]]})
    # Never retried (AirflowFailException), yet its alert advises clearing, which mends it, not a new run.
    assert "Clear the run's failed tasks to resume" in advice(failed.value)
