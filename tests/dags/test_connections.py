"""Credentials come from Airflow connections, never from a run's conf: the SGLang fleet's API keys."""

from __future__ import annotations

import json

import pytest
from yarl import URL

from regen_airflow.tasks import sglang_api_keys


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
