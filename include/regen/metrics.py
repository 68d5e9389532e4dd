"""A run's live figures for Prometheus (series `eagle3_regen_*`, docs/operations.md#metrics).

Tasks are short-lived processes, so each task try keeps its series in a registry of its own and pushes it to a
Pushgateway, grouped by run, task, map index and try: no task's push overwrites another's, and a retry's counts add
to its killed try's instead of replacing them. A try pushes every `push_interval_s` while it runs (the Pushgateway's
`push_time_seconds` then tells a live try from a dead one) and once more at its end; `forget_runs` removes a run's
groups once it ended. Labels stay bounded: dataset, endpoint, stage, reason, outcome; never a sample or shard id.

Library code records into `current()`, the running try's registry. With no Pushgateway configured the series are kept
and never sent. A Pushgateway that is down, refuses or hangs is a hint's failure (regen.hints): one warning, never a
failed task, and never a slower one: pushes run on a thread of their own and a try's last push waits at most
`LAST_PUSH_S`.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, delete_from_gateway, push_to_gateway
from prometheus_client import disable_created_metrics as _disable_created_metrics

log = logging.getLogger(__name__)

JOB = "eagle3_regen"
PREFIX = "eagle3_regen_"
LAST_PUSH_S = 2.0  # a try's last push waits at most this long for a Pushgateway that does not answer

_disable_created_metrics()  # a counter's `_created` twin would only double what the Pushgateway holds per try


class TaskMetrics:
    """One task try's series (module docstring: who pushes what is in docs/operations.md#metrics)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)

        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(PREFIX + name, doc, labels, registry=self.registry)

        def gauge(name: str, doc: str, *labels: str) -> Gauge:
            return Gauge(PREFIX + name, doc, labels, registry=self.registry)

        # generate tasks
        outcome = "/generate attempts by outcome: answered, refused (a 400) or the fault's cause"
        self.requests = counter("requests", outcome, "dataset", "endpoint", "outcome")
        self.answers = counter("answers", "answers kept (checkpointed)", "dataset", "endpoint")
        self.output_tokens = counter("output_tokens", "output ids of the answers kept", "dataset", "endpoint")
        self.prompt_tokens = counter("prompt_tokens", "prompt tokens of the answers kept", "dataset", "endpoint")
        open_s = "seconds requests were open, client-side"
        self.request_seconds = counter("request_seconds", open_s, "dataset", "endpoint")
        self.slot_seconds = counter(
            "slot_seconds", "seconds answers held a running slot, as their server measured", "dataset", "endpoint"
        )
        self.in_flight = gauge("requests_in_flight", "samples asked and not yet answered or rejected", "dataset")
        self.settled = gauge(
            "settled_answers", "this try's shards' answers answered or rejected, earlier tries' included", "dataset"
        )
        self.fleet_losses = counter("fleet_losses", "answers lost to the fleet (docs/guarantees.md)", "dataset")
        self.ejections = counter("endpoint_ejections", "times an endpoint was ejected from the pool", "endpoint")
        # list_shards
        self.planned_answers = gauge("planned_answers", "answers the run's generate stage settles", "dataset")
        self.planned_shards = gauge("planned_shards", "shards the run generates", "dataset")
        # shard stages, prepare and publish
        self.shards_done = counter("shards_done", "shards through a stage", "dataset", "stage")
        self.rejections = counter("rejections", "samples rejected, by stage and reason", "dataset", "stage", "reason")
        self.published = counter("datasets_published", "versions published", "dataset")
        self.spearman = gauge(
            "length_prediction_spearman", "predicted answer lengths ranked against the answers'", "dataset"
        )
        # check_server
        self.fleet_slots = gauge("fleet_slots", "an endpoint's running slots (max_running_requests)", "endpoint")
        self.fleet_gpus = gauge("fleet_gpus", "an endpoint's GPUs", "endpoint")
        # every task
        self.succeeded = gauge("task_succeeded", "1 once this try succeeded")
        self._allowance: Gauge | None = None

    def loss_allowance(self, share: float) -> None:
        """plan's: the run's max_server_rejected_share. Registered only here: a gauge without labels is exported from
        its creation, and every other task would say 0."""
        if self._allowance is None:  # (plan run twice in one process: outside Airflow, the same registry)
            self._allowance = Gauge(
                PREFIX + "fleet_loss_allowance_ratio", "max_server_rejected_share", registry=self.registry
            )
        self._allowance.set(share)

    def stage_done(self, dataset: str, stage: str, stats: Mapping[str, Any]) -> None:
        """A shard through `stage`, with its stage stats (StageStats.to_dict()): its rejections by reason."""
        self.shards_done.labels(dataset, stage).inc()
        self.rejected(dataset, stage, stats.get("dropped_by_reason") or {})

    def rejected(self, dataset: str, stage: str, by_reason: Mapping[str, int]) -> None:
        for reason, count in by_reason.items():
            self.rejections.labels(dataset, stage, reason).inc(count)


_current = TaskMetrics()  # outside a task (a CLI, a test): kept, never pushed


def current() -> TaskMetrics:
    """The running task try's series."""
    return _current


@dataclass(frozen=True)
class Pushgateway:
    url: str  # http://host:9091
    push_interval_s: float = 5.0

    def push(self, metrics: TaskMetrics, grouping: Mapping[str, str], timeout_s: float) -> None:
        push_to_gateway(self.url, JOB, metrics.registry, dict(grouping), timeout=timeout_s)

    def groups(self, timeout_s: float = LAST_PUSH_S) -> list[dict[str, str]]:
        """The grouping keys of this job's groups the Pushgateway holds (its API: /api/v1/metrics)."""
        with urllib.request.urlopen(f"{self.url.rstrip('/')}/api/v1/metrics", timeout=timeout_s) as resp:
            body = json.load(resp)
        groups = [group.get("labels", {}) for group in body.get("data", [])]
        return [g for g in groups if g.get("job") == JOB]

    def delete(self, grouping: Mapping[str, str], timeout_s: float = LAST_PUSH_S) -> None:
        key = {k: v for k, v in grouping.items() if k != "job"}
        delete_from_gateway(self.url, JOB, key, timeout=timeout_s)


class Pusher:
    """Pushes a try's series every interval on a thread of its own, and once more at `stop`."""

    def __init__(self, gateway: Pushgateway, metrics: TaskMetrics, grouping: Mapping[str, str]) -> None:
        self.gateway, self.metrics, self.grouping = gateway, metrics, dict(grouping)
        self.warned = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-pusher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.gateway.push_interval_s):
            self._push()
        self._push()  # the last: the try's final counts and whether it succeeded

    def _push(self) -> None:
        try:
            self.gateway.push(self.metrics, self.grouping, min(self.gateway.push_interval_s, LAST_PUSH_S))
        except Exception as e:  # any fault of the sink: the task goes on without it
            if not self.warned:
                self.warned = True
                log.warning(
                    "metrics: pushing to %s failed (%s); the task goes on, its figures are in its log and the run "
                    "report (one warning per task)",
                    self.gateway.url,
                    e,
                )

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(LAST_PUSH_S)


_pusher: Pusher | None = None


def begin_task(gateway: Pushgateway | None, grouping: Mapping[str, str]) -> TaskMetrics:
    """A task try starts: fresh series, pushed to `gateway` (None: kept only) under `grouping` (grouping_key)."""
    global _current, _pusher
    end_task(False)  # a try that never ended (in one process, `airflow dags test` runs every task in turn)
    _current = TaskMetrics()
    if gateway is not None:
        _pusher = Pusher(gateway, _current, grouping)
    return _current


def end_task(succeeded: bool) -> None:
    """The running try ended: its last push, saying whether it succeeded."""
    global _pusher
    if _pusher is None:
        return
    _current.succeeded.set(1 if succeeded else 0)
    pusher, _pusher = _pusher, None
    pusher.stop()


def forget_runs(gateway: Pushgateway, run: str | None = None, but: str | None = None) -> int:
    """Deletes the Pushgateway's groups of `run` (None: of every run but `but`): a run's series, once it ended, live
    on in Prometheus alone. Returns how many; a Pushgateway that fails is a warning, as for pushes."""
    try:
        groups = [g for g in gateway.groups() if (g.get("run") == run if run else g.get("run") != but)]
        for grouping in groups:
            gateway.delete(grouping)
    except Exception as e:
        log.warning("metrics: could not remove finished runs' series from %s: %s", gateway.url, e)
        return 0
    return len(groups)


def grouping_key(run_id: str, task_id: str, map_index: int | None, try_number: int | None) -> dict[str, str]:
    """A task try's Pushgateway group (module docstring)."""
    index = -1 if map_index is None else map_index
    return {"run": run_id, "task": task_id, "map_index": str(index), "try": str(try_number or 1)}
