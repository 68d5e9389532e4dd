"""`tokenize_workers: null` is the machine's cores shared by the tasks its worker may run at once: under Celery with
concurrency C, C prepare tasks on one worker start pools of cores / C each, not C pools of every core."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from regen import pipeline
from regen.run_params import RunSpec
from regen.stages.prepare import prepare, tokenize
from regen_airflow.tasks import worker_task_slots
from tests.conftest import project_config_in


def test_the_worker_slots_are_the_executors_concurrency(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "CeleryExecutor")
    monkeypatch.setenv("AIRFLOW__CELERY__WORKER_CONCURRENCY", "4")
    assert worker_task_slots() == 4
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")
    monkeypatch.setenv("AIRFLOW__CORE__PARALLELISM", "3")
    assert worker_task_slots() == 3


def test_a_prepare_task_under_celery_tokenizes_with_its_share_of_the_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = project_config_in(tmp_path, allowed_endpoints=["127.0.0.1"], allowed_storage_roots=[str(tmp_path)])
    monkeypatch.setenv("REGEN_CONFIG", str(config))
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "CeleryExecutor")
    monkeypatch.setenv("AIRFLOW__CELERY__WORKER_CONCURRENCY", "4")
    for module in (tokenize, prepare):  # a machine of 12 cores
        monkeypatch.setattr(module, "available_cores", lambda: 12)
    pools: list[int] = []
    real = prepare.render_ordered

    def counted(items: Any, renderer: Any, workers: int, *args: Any) -> Any:
        pools.append(workers)
        return real(items, renderer, 1, *args)  # the test's machine has no 12 cores to give: rendered here

    monkeypatch.setattr(prepare, "render_ordered", counted)
    params = {"endpoints": ["http://127.0.0.1:30000"], "limit": 4, "storage_root": str(tmp_path / "storage")}
    run = RunSpec.from_params(params, "manual__pools")
    assert run.tokenize_workers is None  # the project's config: all cores
    summary = pipeline.prepare_dataset(run, run.datasets[0], None, worker_task_slots())
    assert summary["prompts"] == 4 and pools == [3]  # 12 cores over 4 tasks at once
    assert tokenize.pool_size(3, 4) == 3 and tokenize.pool_size(None, 16) == 1  # as configured; at least one
