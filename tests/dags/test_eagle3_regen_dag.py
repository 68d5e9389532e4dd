"""The DAG parses cleanly, wires the stages as designed, and does no I/O while parsing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bag():  # type: ignore[no-untyped-def]
    from airflow.dag_processing.dagbag import DagBag

    dags = DagBag(dag_folder=str(ROOT / "dags"))
    assert dags.import_errors == {}
    return dags


@pytest.fixture(scope="module")
def dag(bag):  # type: ignore[no-untyped-def]
    return bag.dags["eagle3_regen"]


def test_every_dag_file_parses_with_tags_retries_and_docs(bag) -> None:  # type: ignore[no-untyped-def]
    assert sorted(bag.dags) == ["eagle3_regen", "eagle3_training_handoff"]
    assert len(bag.dags) == len(list((ROOT / "dags").glob("*.py")))
    for dag in bag.dags.values():
        assert "eagle3" in dag.tags and dag.doc_md and not dag.catchup
        assert all(t.retries >= 1 for t in dag.tasks), dag.dag_id


def test_stages_and_order(dag) -> None:  # type: ignore[no-untyped-def]
    upstream = {t.task_id: sorted(t.upstream_task_ids) for t in dag.tasks}
    assert upstream == {
        "plan": [],
        "dataset_names": ["plan"],
        "prepare_dataset": ["check_server", "dataset_names", "plan"],
        "check_server": ["plan"],
        "list_prepare_parts": ["plan", "prepare_dataset"],
        "prepare_part": ["list_prepare_parts", "plan"],
        "list_shards": ["check_server", "plan", "prepare_dataset", "prepare_part"],
        "process_shard.generate_shard": ["check_server", "list_shards", "plan"],  # the fleet: how it admits requests
        "process_shard.validate_shard": ["plan", "process_shard.generate_shard"],
        "process_shard.export_shard": ["plan", "process_shard.validate_shard"],
        # A dataset's verify waits for its own shards only, deferred (below), never for every dataset's.
        "deliver_dataset.wait_for_shards": ["list_shards", "prepare_dataset"],
        "deliver_dataset.verify_dataset": ["deliver_dataset.wait_for_shards", "plan", "prepare_dataset"],
        "deliver_dataset.publish_dataset": [
            "check_server",
            "deliver_dataset.verify_dataset",
            "plan",
            "prepare_dataset",
        ],
        # It releases the run's claims, so it waits for every shard task too: a failed shard fails its dataset's
        # wait at once while its siblings still write.
        "report": ["check_server", "deliver_dataset.publish_dataset", "plan", "process_shard.export_shard"],
    }


def test_policy_pool_one_run_at_a_time_and_an_asset_per_dataset(dag) -> None:  # type: ignore[no-untyped-def]
    from airflow.sdk import AssetAlias

    from regen_airflow.alerts import FailureLog
    from regen_airflow.shard_states import WaitForOwnShards

    assert set(dag.tags) >= {"eagle3", "sglang"}
    assert dag.max_active_runs == 1
    assert dag.get_task("process_shard.generate_shard").pool == "sglang_fleet"
    publish, verify = dag.get_task("deliver_dataset.publish_dataset"), dag.get_task("deliver_dataset.verify_dataset")
    assert publish.outlets == [AssetAlias("eagle3_regen_datasets")] and verify.outlets == []
    # Both run after failed shards (complete datasets are published); publish refuses when its own verify failed.
    assert publish.trigger_rule == verify.trigger_rule == "all_done"
    # Its wait for its own shards is deferred to the triggerer, holding no worker slot, and runs after a failed
    # list_shards too (nothing to wait for: verify says what is missing).
    wait = dag.get_task("deliver_dataset.wait_for_shards")
    assert isinstance(wait, WaitForOwnShards) and wait.trigger_rule == "all_done" and wait.poll_s == 30
    assert all(any(isinstance(n, FailureLog) for n in t.on_failure_callback) for t in dag.tasks)


def test_the_handoff_dag_is_scheduled_on_every_published_dataset(bag) -> None:  # type: ignore[no-untyped-def]
    from airflow.sdk import AssetAlias

    handoff = bag.dags["eagle3_training_handoff"]
    assert handoff.timetable.asset_condition.objects == (AssetAlias("eagle3_regen_datasets"),)
    assert handoff.get_task("published_versions").inlets == [AssetAlias("eagle3_regen_datasets")]
    assert handoff.get_task("specforge_vocab_mapping").upstream_task_ids == {"verify_version"}


def test_mail_alerts_are_added_when_the_config_names_recipients() -> None:
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    from regen.config import AlertsConfig
    from regen_airflow.alerts import FailureLog, failure_notifiers

    assert [type(n) for n in failure_notifiers(AlertsConfig())] == [FailureLog]
    log_only, mail = failure_notifiers(AlertsConfig(email_to=["oncall@example.org"], smtp_conn_id="smtp_oncall"))
    assert isinstance(log_only, FailureLog) and isinstance(mail, SmtpNotifier)
    assert (mail.to, mail.smtp_conn_id) == (["oncall@example.org"], "smtp_oncall")


def test_params_make_a_valid_trigger_form(dag) -> None:  # type: ignore[no-untyped-def]
    params = dag.params
    params.validate()  # the defaults validate, as a schedule requires
    assert params.get_param("datasets").schema["items"]["enum"] == ["B1_glaive", "B2_opencodeinstruct", "C1_multiturn"]
    assert params.get_param("profile").schema["enum"] == ["kimi-k2.5", "kimi-k2.5-mini", "qwen3.6"]  # + the config's
    assert params.get_param("limit").value is None


def test_the_form_offers_exactly_what_a_run_takes_in_sections(dag) -> None:  # type: ignore[no-untyped-def]
    from regen.run_params import RunParams

    assert set(dag.params) == set(RunParams.model_fields)
    sections = {name: dag.params.get_param(name).schema.get("section") for name in dag.params}
    assert set(sections.values()) == {"What to run", "Servers", "Sampling", "Advanced"}
    assert all(dag.params.get_param(name).description for name in dag.params)


def test_a_run_setting_is_declared_once_and_the_form_and_plan_follow_it() -> None:
    """A field added to RunParams (here in a subclass) is in the form with its section, bounds and description, and
    plan checks its bounds; no other declaration is needed for either."""
    from pydantic import Field

    from regen.config import ConfigError, load_config
    from regen.run_params import RunParams, RunSpec, form

    class WithPriority(RunParams):
        priority: int | None = Field(
            None, ge=0, le=9, title="Priority", description="0-9.", json_schema_extra={"section": "Advanced"}
        )

    [field] = [spec for name, spec in form(load_config(), WithPriority).items() if name == "priority"]
    assert (field["type"], field["minimum"], field["maximum"], field["section"]) == (
        ["null", "integer"],
        0,
        9,
        "Advanced",
    )
    with pytest.raises(ConfigError, match="priority: Input should be less than or equal to 9"):
        RunSpec.from_params({"priority": 12}, "manual__1", load_config(), WithPriority)
    with pytest.raises(ConfigError, match="limit: Input should be a valid integer"):  # strict: true is not a number
        RunSpec.from_params({"limit": True}, "manual__1", load_config())


@pytest.mark.parametrize(
    "name,value,message",
    [
        pytest.param("temperature", -0.5, "is less than the minimum of 0", id="negative-temperature"),
        pytest.param("max_new_tokens", 0, "is less than the minimum of 1", id="no-tokens"),
        pytest.param("top_p", 0, "less than or equal to the minimum of 0", id="top-p"),
        pytest.param("datasets", [], "should be non-empty", id="no-datasets"),
        pytest.param("datasets", ["B1_glaive", "B1_glaive"], "has non-unique elements", id="a-dataset-twice"),
    ],
)
def test_the_form_refuses_bad_values(dag, name: str, value: object, message: str) -> None:  # type: ignore[no-untyped-def]
    from airflow.sdk.definitions.param import ParamsDict
    from airflow.sdk.exceptions import ParamValidationError

    params = ParamsDict(dag.params)
    with pytest.raises(ParamValidationError, match=message):
        params[name] = value


def test_params_reject_a_bad_profile(dag) -> None:  # type: ignore[no-untyped-def]
    from airflow.sdk.definitions.param import ParamsDict
    from airflow.sdk.exceptions import ParamValidationError

    params = ParamsDict(dag.params)
    with pytest.raises(ParamValidationError, match="'gpt-9' is not one of"):
        params["profile"] = "gpt-9"


PARSE_WITHOUT_NETWORK = """
import socket
def refuse(*args, **kwargs):
    raise AssertionError(f"network access while parsing: {args}")
socket.socket.connect = refuse
socket.create_connection = refuse
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=%r)
assert bag.import_errors == {}, bag.import_errors
assert "eagle3_regen" in bag.dags
import sys
assert "transformers" not in sys.modules, "heavy imports belong inside tasks"
print("ok")
"""


def test_parsing_opens_no_connections_and_skips_heavy_imports() -> None:
    code = PARSE_WITHOUT_NETWORK % str(ROOT / "dags")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")


def test_docker_compose_agrees_with_the_config_and_the_profile() -> None:
    """The pool's slots come from the config's fleet_pool_slots or shard_tasks ($$ is compose's escape for a shell $),
    the server loads the revision the production profile pins, and a triggerer runs."""
    import yaml

    from regen.profiles import lookup

    compose = yaml.safe_load((ROOT / "docker-compose.yaml").read_text())
    command = compose["services"]["airflow-init"]["command"]
    assert "pools set sglang_fleet $$(python -c 'from regen.config import load_config; " in command
    assert "print(load_config().defaults.pool_slots)')" in command
    assert f"--revision {lookup('kimi-k2.5').revision}" in compose["services"]["sglang"]["command"]
    # Each dataset's wait for its own shards is deferred: without a triggerer, no dataset would ever be verified.
    assert compose["services"]["airflow-triggerer"]["command"] == "airflow triggerer"


def test_the_alert_mail_escapes_what_it_quotes() -> None:
    """The failure mail is HTML: a server's error body in the exception, or a run id chosen at trigger, must not
    become markup in the recipient's mail client (rendered here without autoescape, the worst case)."""
    from types import SimpleNamespace

    import jinja2

    from regen_airflow.alerts import BODY, why

    hostile = "<img src=x onerror=alert(1)>"
    ti = SimpleNamespace(task_id=hostile, rendered_map_index=hostile, try_number=1)
    body = (
        jinja2.Environment(autoescape=False)
        .from_string(BODY)
        .render(dag=SimpleNamespace(dag_id="eagle3_regen"), run_id=hostile, ti=ti, why=why(RuntimeError(hostile)))
    )
    assert "<img" not in body and body.count("&lt;img src=x onerror=alert(1)&gt;") == 4


def test_the_failure_line_advises_what_fits_the_error() -> None:
    """A user error (failed at once, never retried) is fixed and triggered again; a transient fault is cleared."""
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowFailException

    from regen_airflow.alerts import failure_message

    ti = SimpleNamespace(task_id="plan", rendered_map_index=None, run_id="manual__1", try_number=1)
    user = failure_message({"ti": ti, "exception": AirflowFailException("unknown run parameters ['temprature']")})
    assert "Fix what it names" in user and "Clear" not in user
    transient = failure_message({"ti": ti, "exception": ConnectionResetError("peer reset")})
    assert "Clear the run's failed tasks to resume" in transient and "Fix what" not in transient


def test_the_alert_mail_advises_what_fits_the_error_too() -> None:
    """The mail is rendered by the notifier itself (Airflow's template rendering) with the log line's advice."""
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowFailException

    from regen.config import AlertsConfig
    from regen_airflow.alerts import failure_notifiers

    ti = SimpleNamespace(task_id="plan", rendered_map_index=None, run_id="manual__1", try_number=1)
    for error, expected, unexpected in (
        (AirflowFailException("unknown run parameters ['temprature']"), "Fix what it names", "Clear the run"),
        (ConnectionResetError("peer reset"), "Clear the run&#39;s failed tasks", "Fix what"),
    ):
        [_, mail] = failure_notifiers(AlertsConfig(email_to=["oncall@example.org"]))
        context = {"ti": ti, "run_id": ti.run_id, "exception": error, "dag": None}
        mail.render_template_fields(context)
        assert expected in mail.html_content and unexpected not in mail.html_content
