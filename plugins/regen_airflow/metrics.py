"""Each eagle3_regen task try's live series (regen.metrics), pushed to the config's Pushgateway from the task process
itself: a listener, so that no task's code has to remember it.

The running hook starts the try's series and their pusher; the success and failed hooks push them once more, saying
whether the try succeeded. As in regen_airflow.usage, those two hooks also fire in the scheduler and the API server,
so they act only for the try that began in this process. A run's start (plan) removes earlier runs' series from the
Pushgateway and its end (report) its own: they live on in Prometheus, and one run is active at a time
(max_active_runs=1). Nothing here fails or holds up a task: a config or Pushgateway fault is one warning.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from airflow.listeners import hookimpl

from regen import metrics

log = logging.getLogger(__name__)

DAG_ID = "eagle3_regen"
_running: tuple[Any, ...] | None = None  # the try that began in this process
_gateway: metrics.Pushgateway | None = None
_forgetting: threading.Thread | None = None  # plan's removal of earlier runs' groups


def _try_of(task_instance: Any) -> tuple[Any, ...]:
    fields = ("dag_id", "run_id", "task_id", "map_index", "try_number")
    return tuple(getattr(task_instance, name, None) for name in fields)


def configured_gateway() -> metrics.Pushgateway | None:
    """The config's Pushgateway, or None (none configured, or a config that does not load: plan says why)."""
    from regen.config import load_config

    try:
        config = load_config().metrics
    except Exception as e:
        log.warning("metrics: not pushed, the config does not load: %s", e)
        return None
    if not config.pushgateway:
        return None
    return metrics.Pushgateway(config.pushgateway.rstrip("/"), config.push_interval_s)


@hookimpl
def on_task_instance_running(previous_state: Any, task_instance: Any) -> None:
    global _running, _gateway, _forgetting
    if task_instance.dag_id != DAG_ID:
        return
    _running, _gateway = _try_of(task_instance), configured_gateway()
    run_id, task_id = task_instance.run_id, task_instance.task_id
    if _gateway is not None and task_id == "plan":  # beside the task: the Pushgateway may be slow
        forget = threading.Thread(target=metrics.forget_runs, args=(_gateway,), kwargs={"but": run_id}, daemon=True)
        _forgetting = forget
        forget.start()
    grouping = metrics.grouping_key(run_id, task_id, task_instance.map_index, task_instance.try_number)
    metrics.begin_task(_gateway, grouping)


def _ended(task_instance: Any, succeeded: bool) -> None:
    global _running
    if _running is None or _running != _try_of(task_instance):
        return
    _running = None
    metrics.end_task(succeeded)
    if _forgetting is not None:  # plan's process ends with the task: give the removal its time, boundedly
        _forgetting.join(metrics.LAST_PUSH_S)
    if _gateway is not None and task_instance.task_id == "report":  # the run ended: its series are Prometheus's
        metrics.forget_runs(_gateway, run=task_instance.run_id)


@hookimpl
def on_task_instance_success(previous_state: Any, task_instance: Any) -> None:
    _ended(task_instance, True)


@hookimpl
def on_task_instance_failed(previous_state: Any, task_instance: Any, error: Any) -> None:
    _ended(task_instance, False)
