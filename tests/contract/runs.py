"""A run of eagle3_regen's graph in this process: the pipeline's task functions in the DAG's order, each retried as
Airflow retries it (a FinalError fails at once), a dataset's failure holding back no other's. `stop_after` shard
groups, the rest of the run's shard tasks never run (a worker lost, a fleet gone): the run ends red, and its Resume
(the page's: datasets and version only) is what completes it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

RETRIES = 1  # the DAG's default_args


@dataclass
class RunOutcome:
    run_id: str
    params: dict[str, Any]
    green: bool = False
    version: str | None = None
    published: dict[str, dict[str, Any]] = field(default_factory=dict)  # dataset -> publish_dataset's summary
    errors: dict[str, str] = field(default_factory=dict)  # task -> its last error


def task(outcome: RunOutcome, name: str, call: Callable[[], Any]) -> Any:
    """The task's value, or None once it failed (after its retries)."""
    from regen.errors import FinalError

    for _ in range(1 + RETRIES):
        try:
            value = call()
        except FinalError as e:
            outcome.errors[name] = f"{type(e).__name__}: {e}"
            return None
        except Exception as e:  # what Airflow retries
            outcome.errors[name] = f"{type(e).__name__}: {e}"
            continue
        outcome.errors.pop(name, None)
        return value
    return None


def run_dag(params: dict[str, Any], run_id: str, when: datetime, stop_after: int | None = None) -> RunOutcome:
    from regen import pipeline
    from regen.run_params import RunSpec

    outcome = RunOutcome(run_id, params)
    planned = task(outcome, "plan", lambda: pipeline.plan(params, run_id, logical_date=when))
    if planned is None:
        return outcome
    run = RunSpec.model_validate(planned)
    outcome.version = run.version
    summaries = [
        task(outcome, f"prepare_dataset[{d}]", lambda d=d: pipeline.prepare_dataset(run, d)) for d in run.datasets
    ]
    ready = [s for s in summaries if s]
    for part in pipeline.dataset_parts(run, ready):
        task(outcome, f"prepare_part[{part}]", lambda part=part: pipeline.prepare_dataset_part(run, part))
    listed = task(
        outcome,
        "list_shards",
        lambda: pipeline.shard_groups(pipeline.finish_prepared(run, ready), run.shard_task_limit),
    )
    for position, group in enumerate(listed or []):
        if stop_after is not None and position >= stop_after:
            outcome.errors[f"process_shard[{position}]"] = "never ran: the run was stopped"
            continue
        for stage in (pipeline.generate_group, pipeline.validate_group, pipeline.export_group):
            if task(outcome, f"{stage.__name__}[{position}]", lambda s=stage, g=group: s(run, g)) is None:
                break
    published = []
    for summary in ready:
        name = summary["dataset"]
        verified = task(outcome, f"verify_dataset[{name}]", lambda s=summary: pipeline.verify_dataset(run, s))
        done = task(
            outcome, f"publish_dataset[{name}]", lambda s=summary, v=verified: pipeline.publish_dataset(run, s, [], v)
        )
        if done is not None:
            published.append(done)
            outcome.published[name] = done
    outcome.green = task(outcome, "report", lambda: pipeline.report(run, published, [])) is not None
    return outcome
