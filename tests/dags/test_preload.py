"""The processes that fork task processes preload the library and the default profile's renderer
(plugins/airflow_local_settings.py), so that a task forked after finds its renderer built."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import airflow  # noqa: F401 (its settings put the plugins folder on sys.path, and import the module below)
import airflow_local_settings
import pytest
from airflow_local_settings import forks_tasks

ROOT = Path(__file__).resolve().parents[2]

# In a fresh interpreter: preload as the scheduler would, fork as a LocalExecutor worker would, and in the child build
# the run spec as plan and the DAG do (a dict through XCom) and ask for its renderer, as a shard task does.
FORKED_TASK = """
import json, os, sys
import airflow_local_settings
from regen import pipeline
from regen.config import load_config
from regen.run_params import RunSpec

airflow_local_settings.preload_if_forking(sys.argv[1:])
before = pipeline.run._renderer.cache_info()
if not before.currsize:  # nothing preloaded: a task would build its own, as without the preload
    print(json.dumps({"preloaded": 0}))
    sys.exit(0)
read, write = os.pipe()
if os.fork() == 0:
    spec = RunSpec.model_validate(RunSpec.from_params({}, "run-1", load_config()).to_dict())
    renderer = pipeline.renderer_for(spec)
    info = pipeline.run._renderer.cache_info()
    found = {"hits": info.hits - before.hits, "misses": info.misses - before.misses,
             "table_built": renderer._decoder_built,
             "longest_token_known": "max_token_bytes" in vars(renderer),
             "parallelism": os.environ.get("TOKENIZERS_PARALLELISM"),
             "encodes": renderer.encode_texts(["a b", "c"], add_special_tokens=False) is not None}
    os.write(write, json.dumps(found).encode())
    os._exit(0)
os.wait()
print(json.dumps({"preloaded": before.currsize, "child": json.loads(os.read(read, 4096))}))
"""


def _forked_task(argv: list[str], env: dict[str, str] | None = None) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", FORKED_TASK, *argv],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**_env(), **(env or {})},
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": str(ROOT / "plugins")}


@pytest.mark.parametrize(
    ("argv", "forks"),
    [
        (["airflow", "scheduler"], True),
        (["/venv/bin/airflow", "scheduler", "--num-runs", "3"], True),
        (["airflow", "celery", "worker", "--concurrency", "4"], True),
        (["airflow", "api-server"], False),
        (["airflow", "dag-processor"], False),
        (["airflow", "celery", "flower"], False),
        (["airflow", "dags", "test", "eagle3_regen"], False),
        (["pytest"], False),
    ],
)
def test_only_the_scheduler_and_celery_workers_preload(argv: list[str], forks: bool) -> None:
    assert forks_tasks(argv) is forks


def test_a_task_forked_from_the_scheduler_finds_its_renderer_built() -> None:
    found = _forked_task(["airflow", "scheduler"])
    assert found["preloaded"] == 1
    # The plan-made spec's profile declaration is the preload's, key for key: the child reuses it, table and all.
    assert found["child"] == {
        "hits": 1,
        "misses": 0,
        "table_built": True,
        "longest_token_known": True,  # prepare's bound on text, read from the whole vocabulary once
        "parallelism": None,  # the tokenizer's thread pool was never used before the fork: the child keeps it
        "encodes": True,
    }


def test_nothing_is_preloaded_elsewhere_or_when_turned_off() -> None:
    assert _forked_task(["airflow", "api-server"]) == {"preloaded": 0}
    assert _forked_task(["airflow", "scheduler"], {"EAGLE3_REGEN_PRELOAD": "0"}) == {"preloaded": 0}


def test_a_broken_config_leaves_the_scheduler_running_and_plan_to_say_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "regen.yaml"
    config.write_text("defaults: {profile: no-such-profile}\ndatasets: {chat: {paths: [chat.jsonl]}}\n")
    monkeypatch.setenv("REGEN_CONFIG", str(config))
    with caplog.at_level("WARNING"):
        airflow_local_settings.preload_if_forking(["airflow", "scheduler"])
    assert "preload skipped (plan will report it)" in caplog.text
    assert "no-such-profile" in caplog.text
