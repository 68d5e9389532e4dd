"""A run of eagle3_regen's graph in this process: the pipeline's task functions in the DAG's order, each retried as
Airflow retries it (a FinalError fails at once), a dataset's failure holding back no other's. `stop_after` shard
groups, the rest of the run's shard tasks never run (a worker lost, a fleet gone): the run ends red, and its Resume
(the page's: datasets and version only) is what completes it."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
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
    retried: dict[str, str] = field(default_factory=dict)  # task -> the error of a try before its last


def task(outcome: RunOutcome, name: str, call: Callable[[], Any]) -> Any:
    """The task's value, or None once it failed (after its retries)."""
    from regen.errors import FinalError

    for attempt in range(1 + RETRIES):
        try:
            value = call()
        except FinalError as e:
            outcome.errors[name] = f"{type(e).__name__}: {e}"
            return None
        except Exception as e:  # what Airflow retries
            outcome.errors[name] = f"{type(e).__name__}: {e}"
            if attempt < RETRIES:
                outcome.retried[name] = outcome.errors[name]
            continue
        outcome.errors.pop(name, None)
        return value
    return None


def fleet_record(run: Any) -> list[dict[str, Any]]:
    """What generate reads of check_server's record of the fleet (how each server admits its waiting queue), from
    each server's /get_server_info: check_server itself is not run here, as its probe would fail on the fleet that
    answers with defects by design (the DAG's tests run it)."""
    import requests

    from regen.sglang.served_model import priority_order

    return [
        {"url": e.base, "priority_order": priority_order(requests.get(f"{e.base}/get_server_info", timeout=30).json())}
        for e in run.endpoints
    ]


def run_dag(params: dict[str, Any], run_id: str, when: datetime, stop_after: int | None = None) -> RunOutcome:
    from regen import pipeline
    from regen.run_params import RunSpec

    outcome = RunOutcome(run_id, params)
    planned = task(outcome, "plan", lambda: pipeline.plan(params, run_id, logical_date=when))
    if planned is None:
        return outcome
    run = RunSpec.model_validate(planned)
    outcome.version = run.version
    # (a release before generate_group took the fleet: PYTHONPATH at an older library, bench_generated_runs)
    takes_fleet = "fleet" in inspect.signature(pipeline.generate_group).parameters
    fleet = fleet_record(run) if takes_fleet else []
    summaries = [
        task(outcome, f"prepare_dataset[{d}]", lambda d=d: pipeline.prepare_dataset(run, d)) for d in run.datasets
    ]
    ready = [s for s in summaries if s]
    for part in pipeline.dataset_parts(run, ready):
        task(outcome, f"prepare_part[{part}]", lambda part=part: pipeline.prepare_dataset_part(run, part))
    listed = task(
        outcome,
        "list_shards",
        lambda: pipeline.run_groups(run, pipeline.finish_prepared(run, ready)),
    )
    for position, group in enumerate(listed or []):
        if stop_after is not None and position >= stop_after:
            outcome.errors[f"process_shard[{position}]"] = "never ran: the run was stopped"
            continue
        generate = partial(pipeline.generate_group, fleet=fleet) if takes_fleet else pipeline.generate_group
        for name, stage in (
            ("generate", generate),
            ("validate", pipeline.validate_group),
            ("export", pipeline.export_group),
        ):
            if task(outcome, f"{name}_group[{position}]", lambda s=stage, g=group: s(run, g)) is None:
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
