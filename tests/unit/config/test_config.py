from __future__ import annotations

from pathlib import Path

import pytest

from regen import pipeline
from regen.config import ConfigError, load_config
from regen.pipeline import RunSpec


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "regen.yaml"
    path.write_text(text)
    return path


def test_project_config_loads_and_resolves_paths() -> None:
    config = load_config()
    assert set(config.datasets) == {"B1_glaive", "B2_opencodeinstruct", "C1_multiturn"}
    for dataset in config.datasets.values():
        assert dataset.paths and Path(config.resolve(dataset.paths[0])).is_file()
    assert config.datasets["C1_multiturn"].turns == "on_policy"


@pytest.mark.parametrize(
    "text,message",
    [
        pytest.param("datasets: {}", "datasets", id="no-datasets"),
        pytest.param("datasets: {'bad/name': {paths: [x]}}", "becomes a storage key", id="unsafe-name"),
        pytest.param("defaults: {profile: nope}\ndatasets: {a: {paths: [x]}}", "unknown profile 'nope'", id="profile"),
        pytest.param("datasets: {a: {paths: [x], format: csv}}", "format", id="format"),
        pytest.param("defaults: {sampling: {top_k: 0}}\ndatasets: {a: {paths: [x]}}", "top_k must be -1", id="top-k"),
        pytest.param(
            "defaults: {shard_sise: 5}\ndatasets: {a: {paths: [x]}}",
            "defaults.shard_sise: not a field here; did you mean 'shard_size'",
            id="typo",
        ),
        pytest.param(
            "datasets: {C1: {paths: [x], turn: on_policy}}",
            "datasets.C1.turn: not a field here; did you mean 'turns'",
            id="typo-in-a-dataset",
        ),
        pytest.param(
            "datasets: {a: {paths: [x]}}\nprofiles: {m: {tokenizer: t, generation_suffix: s, eos_tokens: [e], "
            "tool_calls: {format: tagged_json, call_begin: b, call_ends: e}}}",
            "profiles.m.tool_calls.tagged_json.call_ends: not a field here; did you mean 'call_end'",
            id="typo-in-a-grammar",
        ),
        pytest.param("[1, 2", "not valid YAML", id="yaml"),
    ],
)
def test_bad_configs_fail_with_what_to_fix(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as failed:
        load_config(write(tmp_path, text))
    assert "errors.pydantic.dev" not in str(failed.value)  # one line a problem, no pydantic boilerplate
    assert failed.value.__cause__ is None and failed.value.__suppress_context__  # no chained traceback


def test_missing_config_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="REGEN_CONFIG"):
        load_config(tmp_path / "absent.yaml")


def test_run_spec_merges_params_over_defaults() -> None:
    run = RunSpec.from_params(
        {"datasets": ["B2_opencodeinstruct"], "limit": 3, "temperature": 0.6}, "manual__2026-11-30T01:02"
    )
    assert run.datasets == ["B2_opencodeinstruct"]
    assert run.version == "manual__2026-11-30T01-02"
    assert run.sampling["temperature"] == 0.6 and run.sampling["max_new_tokens"] == 4096
    assert run.sampling["top_k"] == -1 and run.sampling["n"] == 1  # every sampling value is explicit


@pytest.mark.parametrize(
    "params,message",
    [
        pytest.param({"datasets": ["nope"]}, "unknown dataset 'nope'", id="dataset"),
        pytest.param({"limit": 0}, "limit: Input should be greater than or equal to 1", id="limit"),
        pytest.param({"endpoints": ["localhost:30000"]}, "http", id="endpoint"),
        pytest.param({"top_p": 2}, "top_p: Input should be less than or equal to 1", id="top-p"),
        pytest.param({"temperature": -0.5}, "temperature: Input should be greater than or equal to 0", id="temp"),
        pytest.param({"max_new_tokens": 0}, "max_new_tokens: Input should be greater than or equal to 1", id="max"),
        pytest.param({"top_k": 0}, "top_k must be -1", id="top-k"),
        pytest.param({"sampling": {"temperature": 0.5}}, r"unknown run parameters \['sampling'\]", id="old-shape"),
        pytest.param(
            {"temprature": 0.5},
            r"unknown run parameters \['temprature'\]; for 'temprature' did you mean 'temperature'",
            id="typo",
        ),
        pytest.param({"datasets": []}, "datasets: List should have at least 1 item", id="no-datasets"),
        pytest.param(
            {"datasets": ["B1_glaive", "B1_glaive"]}, r"\['B1_glaive'\] are listed more than once", id="twice"
        ),
        pytest.param({"profile": "kimi-k3"}, "unknown profile 'kimi-k3'", id="profile"),
        pytest.param({"version": "latest"}, "version 'latest' is a name the storage layout uses", id="version-latest"),
        pytest.param({"in_flight": 0}, "in_flight: Input should be greater than or equal to 1", id="in-flight"),
        pytest.param({"shard_size": 0}, "shard_size: Input should be greater than or equal to 1", id="shard-size"),
        pytest.param(
            {"skip_unchanged": "false"}, "skip_unchanged: Input should be a valid boolean", id="skip-unchanged"
        ),
    ],
)
def test_bad_params_fail_fast_with_what_to_fix(params: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RunSpec.from_params(params, "run")


def test_version_takes_a_run_id_as_it_is() -> None:
    run = RunSpec.from_params({"version": "scheduled__2026-11-29T02:00:00+00:00"}, "manual__x")
    assert run.version == "scheduled__2026-11-29T02-00-00-00-00"


@pytest.mark.usefixtures("tmp_roots_allowed")
def test_plan_refuses_a_storage_root_that_takes_no_writes(tmp_path: Path) -> None:
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("a file where a directory should be")
    with pytest.raises(ConfigError, match=r"does not take writes: .*give a storage_root"):
        pipeline.plan({"storage_root": str(blocked / "root")}, "run")
    assert pipeline.plan({"storage_root": str(tmp_path / "ok")}, "run")["storage_root"] == str(tmp_path / "ok")
    assert list((tmp_path / "ok").rglob("*.write-check-*")) == []  # the probe cleans up after itself


@pytest.mark.usefixtures("tmp_roots_allowed")
@pytest.mark.parametrize("code", ["EIO", "ESTALE", "ETIMEDOUT"])
def test_a_local_root_s_fault_of_the_moment_at_plan_is_retried_not_a_setting_to_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    """An I/O error or a network file system's stale handle on plan's probe: plan fails to be retried (Airflow's
    retry), never with a ConfigError that stops the run and blames the storage_root."""
    import errno

    from regen.storage import LocalStorage

    def failing(self: LocalStorage, key: str, data: bytes) -> str:
        raise OSError(getattr(errno, code), f"{code} on {key}")

    monkeypatch.setattr(LocalStorage, "put_bytes", failing)
    with pytest.raises(OSError) as raised:
        pipeline.plan({"storage_root": str(tmp_path / "root")}, "run")
    assert not isinstance(raised.value, ConfigError) and raised.value.errno == getattr(errno, code)


@pytest.mark.usefixtures("tmp_roots_allowed")
def test_plan_refuses_a_storage_root_without_conditional_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims and the manifest's create rely on them: a root without them fails plan (not retried), naming it."""
    import errno

    import regen.storage.local as local

    def no_links(*args: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(local.os, "link", no_links)
    with pytest.raises(ConfigError, match=rf"storage root {tmp_path / 'root'}: conditional writes fail .*hard links"):
        pipeline.plan({"storage_root": str(tmp_path / "root")}, "run")


def test_make_demo_names_a_config_typo_in_one_short_message_before_starting_anything(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    path = write(tmp_path, "datasets: {C1_multiturn: {paths: [x.jsonl], turn: on_policy}}")
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "devstack.py"), "demo"],
        env={**os.environ, "REGEN_CONFIG": str(path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""  # nothing was started ("starting Airflow..." is not printed)
    assert done.stderr.splitlines() == [
        f"demo: config file {path} is invalid:",
        "  datasets.C1_multiturn.turn: not a field here; did you mean 'turns'?",
    ]
