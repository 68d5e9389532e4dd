"""Airflow imports this module from its plugins folder (which it puts on sys.path) as every one of its processes
starts. In the two kinds that fork task processes, the scheduler (its LocalExecutor workers are forked from it) and
a Celery worker, it preloads the library and the default profile's renderer: each task forked after inherits them
(copy-on-write) instead of importing transformers and loading the tokenizer again, about 2 CPU-seconds a task.

A deployment with its own airflow_local_settings (in $AIRFLOW_HOME/config, which comes first on sys.path) can call
`preload_if_forking(sys.argv)` from it. EAGLE3_REGEN_PRELOAD=0 turns the preload off.
"""

from __future__ import annotations

import os
import sys


def forks_tasks(argv: list[str]) -> bool:
    """`airflow scheduler` or `airflow celery worker`: the processes whose children run tasks."""
    command = argv[1:3]
    return command[:1] == ["scheduler"] or command == ["celery", "worker"]


def preload_if_forking(argv: list[str]) -> None:
    if os.environ.get("EAGLE3_REGEN_PRELOAD", "1") != "0" and forks_tasks(argv):
        from regen import pipeline

        pipeline.preload()


preload_if_forking(sys.argv)
