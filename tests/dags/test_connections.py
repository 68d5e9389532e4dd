"""Credentials come from Airflow connections, never from a run's conf: the SGLang fleet's API keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from yarl import URL

from regen.run_params import RunSpec
from regen_airflow.tasks import run_api_keys, run_s3_client, sglang_api_keys
from tests.conftest import project_config_in


def test_the_fleet_key_and_per_endpoint_keys_come_from_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    connection = {"conn_type": "http", "password": "fleet-key-1", "extra": {"api_keys": {"http://gpu-2:30000": "k2"}}}
    monkeypatch.setenv("AIRFLOW_CONN_SGLANG_DEFAULT", json.dumps(connection))
    keys = sglang_api_keys()
    assert keys.key_for(URL("http://gpu-1:30000/generate")) == "fleet-key-1"
    assert keys.key_for(URL("http://gpu-2:30000/generate")) == "k2"  # origin: scheme, host and port
    assert keys.key_for(URL("https://gpu-2:30000/generate")) == "fleet-key-1"
    assert "fleet-key-1" not in repr(keys) and "'sglang_default'" in keys.source


def test_without_the_connection_no_key_is_sent_and_the_error_would_say_where_to_set_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_SGLANG_DEFAULT", raising=False)
    keys = sglang_api_keys()
    assert keys.key_for(URL("http://gpu-1:30000/generate")) is None
    assert "'sglang_default'" in keys.source and "does not exist" in keys.source


def test_a_running_task_uses_what_plan_froze_not_the_config_edited_since(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The S3 client's retries and the fleet's key connection come from the run spec: a config edited mid-run
    (other values, or one that no longer parses) changes nothing a running task does."""
    path = project_config_in(tmp_path, allowed_endpoints=["127.0.0.1"])
    config = yaml.safe_load(path.read_text())
    config["defaults"] |= {"sglang_conn_id": "fleet_at_plan", "s3": {"retry_mode": "standard", "max_attempts": 3}}
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("REGEN_CONFIG", str(path))
    run = RunSpec.from_params({"endpoints": ["http://127.0.0.1:30000"]}, "manual__frozen").to_dict()

    config["defaults"] |= {"sglang_conn_id": "fleet_edited", "s3": {"retry_mode": "adaptive", "max_attempts": 9}}
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps({"conn_type": "aws", "extra": {"region_name": "x"}}))
    for edited in (yaml.safe_dump(config), "defaults: [not, a, mapping"):
        path.write_text(edited)
        client = run_s3_client(run)()
        assert client.meta.config.retries == {"mode": "standard", "total_max_attempts": 3}
        assert "'fleet_at_plan'" in run_api_keys(run).source
