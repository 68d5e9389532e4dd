"""Credentials come from Airflow connections, never from a run's conf: the SGLang fleet's API keys."""

from __future__ import annotations

import json
from base64 import b64encode
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


def test_a_task_gets_endpoint_logins_from_the_config_and_the_runs_params(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The run spec in XCom holds `***` for a URL's login: the task's keys carry it, from the config or the run's
    params (the trigger form's conf), and show it nowhere."""
    import yaml

    from tests.conftest import project_config_in

    path = project_config_in(tmp_path, allowed_endpoints=["gpu-*"])
    raw = yaml.safe_load(path.read_text())
    raw["defaults"]["endpoints"] = ["http://alice:from-config@gpu-1:30000"]
    path.write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("REGEN_CONFIG", str(path))
    monkeypatch.delenv("AIRFLOW_CONN_SGLANG_DEFAULT", raising=False)
    keys = sglang_api_keys(params={"endpoints": ["http://***@gpu-1:30000", "http://bob:from-run@gpu-2:30000"]})
    assert keys.login_for(URL("http://gpu-1:30000/generate")) == "Basic " + b64encode(b"alice:from-config").decode()
    assert keys.login_for(URL("http://gpu-2:30000/health")) == "Basic " + b64encode(b"bob:from-run").decode()
    assert keys.login_for(URL("http://gpu-3:30000/health")) is None
    assert "from-config" not in repr(keys) and "from-run" not in repr(keys)
    from airflow.sdk.log import redact  # Airflow's own masker, for what Airflow logs itself, knows them too

    assert redact("pw from-config, pw from-run") == "pw ***, pw ***"


def test_the_alert_mail_and_log_line_show_no_login(tmp_path: Path) -> None:
    """What a failed task says (its log line, its mail) quotes the exception: one about an endpoint shows it
    redacted."""
    from types import SimpleNamespace

    import jinja2

    from regen.chat import ChatRenderer
    from regen.profiles import lookup
    from regen.stages.generate.generate import GenerateSettings, run_generate
    from regen_airflow.alerts import BODY, failure_message, why
    from tests.conftest import free_port, prepare_sample

    prepared, storage = prepare_sample(tmp_path, ChatRenderer(lookup("kimi-k2.5-mini")), "B1_glaive", 4, limit=4)
    dead = f"http://alice:mail-secret@127.0.0.1:{free_port()}"
    settings = GenerateSettings([dead], {}, max_attempts=1, fleet_wait_s=1, backoff_max_s=0.1)
    with pytest.raises(Exception) as failed:
        run_generate(prepared.shards[0], storage, settings)
    ti = SimpleNamespace(task_id="generate_shard", rendered_map_index="B1_glaive/shard-00000", run_id="r", try_number=1)
    context = {"ti": ti, "exception": failed.value, "dag": SimpleNamespace(dag_id="eagle3_regen"), "run_id": "r"}
    body = jinja2.Environment(autoescape=True).from_string(BODY).render(**context, advice="", why=why(failed.value))
    line = failure_message(context)
    assert "127.0.0.1" in body and "127.0.0.1" in line
    assert "mail-secret" not in body and "mail-secret" not in line


@pytest.mark.parametrize(
    "url",
    [
        "http:/alice:form-secret@gpu-1:30000",
        "alice:form-secret@gpu-1:30000",
        "http://alice:form secret@gpu-1:30000",
        "http://alice:form-secret@gpu-1:30000/x?y",
    ],
)
def test_the_trigger_form_quotes_no_login_of_a_refused_url(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Airflow's own validation of the DAG's params quotes the value it refuses: a URL with a login passes the form,
    and plan refuses it with the login redacted."""
    from airflow.sdk import Param
    from airflow.sdk.exceptions import ParamValidationError

    from regen.config import ConfigError, load_config
    from regen.run_params import form

    monkeypatch.setenv("REGEN_CONFIG", str(project_config_in(tmp_path)))
    endpoints = Param(**form(load_config())["endpoints"])  # as the DAG declares it
    try:
        endpoints.resolve([url])
    except ParamValidationError as e:
        assert "secret" not in str(e)
    with pytest.raises(ConfigError) as at_plan:
        RunSpec.from_params({"endpoints": [url]}, "manual__1")
    assert "secret" not in str(at_plan.value) and "***@gpu-1:30000" in str(at_plan.value)
