"""`regen check-config` and `regen plan`: the config's problems one line each (exit 2), or a short summary (exit 0);
what a run's conf would run, checked as plan checks it, without sending or writing anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from regen.__main__ import main
from regen.config import DEFAULT_CONFIG, ConfigError, load_config
from regen.run_params import RunSpec

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "regen.yaml"
    path.write_text(text)
    return path


def test_check_config_names_every_problem_on_its_own_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write(
        tmp_path,
        "defaults: {sampling: {temprature: 1}, shard_sise: 5}\ndatasets: {C1: {paths: [x], turn: on_policy}}\n",
    )
    assert main(["check-config", str(config)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "regen check-config: defaults.sampling.temprature: not a field here; did you mean 'temperature'?",
        "regen check-config: defaults.shard_sise: not a field here; did you mean 'shard_size'?",
        "regen check-config: datasets.C1.turn: not a field here; did you mean 'turns'?",
    ]


@pytest.mark.parametrize(
    "text,problem",
    [
        pytest.param("[1, 2", "not valid YAML", id="yaml"),
        pytest.param("- a\n- b\n", "must be a mapping", id="not-a-mapping"),
        pytest.param("datasets: {a: {paths: [x]}}\ndefaults: {shard_tasks: 8, fleet_pool_slots: 2}", "pool", id="pool"),
    ],
)
def test_check_config_fails_with_exit_2_and_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, problem: str
) -> None:
    assert main(["check-config", str(write(tmp_path, text))]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert problem in line


def test_check_config_of_a_missing_file_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read it" in capsys.readouterr().err


def test_check_config_of_the_project_file_is_valid_with_a_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(DEFAULT_CONFIG)]) == 0
    first, *rest = capsys.readouterr().out.splitlines()
    assert first == f"{DEFAULT_CONFIG}: valid; 3 datasets, 3 profiles"
    summary = json.loads("\n".join(rest))
    assert summary["datasets"] == ["B1_glaive", "B2_opencodeinstruct", "C1_multiturn"]
    assert summary["fleet_pool_slots"] == summary["shard_tasks"] == 4


def test_plan_tells_what_a_conf_would_run_with_credentials_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    conf = {"datasets": ["B1_glaive"], "limit": 5, "endpoints": ["http://user:secret@127.0.0.1:30000"]}
    assert main(["plan", "--conf", json.dumps(conf), "--config", str(DEFAULT_CONFIG), "--run-id", "manual__1"]) == 0
    out = capsys.readouterr().out
    assert "secret" not in out and "user" not in out
    plan = json.loads(out)
    assert plan["endpoints"] == ["http://***@127.0.0.1:30000"]
    assert plan["version"] == "manual__1"
    assert plan["storage_root"] == str((ROOT / "var" / "storage").resolve())
    source = ROOT / "data" / "samples" / "B1_glaive.jsonl"
    assert plan["datasets"] == {
        "B1_glaive": {
            "turns": "final",
            "answers_per_prompt": 1,
            "files": 1,
            "bytes": source.stat().st_size,
            "shards_at_most": 1,
        }
    }
    assert plan["requests_per_shard_task"] == 64  # in_flight 256 over 4 shard tasks


def test_plan_names_a_missing_source_and_refuses_bad_conf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write(tmp_path, "datasets: {a: {paths: [missing-*.jsonl]}}\n")
    assert main(["plan", "--config", str(config)]) == 0
    assert json.loads(capsys.readouterr().out)["datasets"]["a"]["missing"] == [str(tmp_path / "missing-*.jsonl")]
    assert main(["plan", "--config", str(config), "--conf", '{"limt": 3}']) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "did you mean 'limit'" in line
    assert main(["plan", "--config", str(config), "--conf", "[1]"]) == 2
    assert "JSON object" in capsys.readouterr().err


def test_plan_fails_when_shard_tasks_exceed_the_fleet_pool(tmp_path: Path) -> None:
    """Four shard tasks' shares of in_flight and a pool of two slots would feed the fleet half of in_flight."""
    config = load_config(
        write(tmp_path, "datasets: {a: {paths: [x]}}\ndefaults: {shard_tasks: 4, fleet_pool_slots: 2}")
    )
    with pytest.raises(ConfigError, match=r"shard_tasks is 4 but the sglang_fleet pool has 2 slots"):
        RunSpec.from_params({}, "manual__1", config)
    wider = load_config(write(tmp_path, "datasets: {a: {paths: [x]}}\ndefaults: {shard_tasks: 2, fleet_pool_slots: 4}"))
    assert RunSpec.from_params({}, "manual__1", wider).concurrency == 128  # a pool shared with another DAG is fine


def test_check_config_probes_the_storage_root_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--probe-storage` runs plan's probe of defaults.storage_root: a file system without hard links is named, in
    one line, exit 2; a good root passes and keeps nothing of the probe."""
    import errno

    import yaml

    import regen.storage.local as local
    from tests.conftest import project_config_in

    folder = tmp_path / "deployment"
    folder.mkdir()
    path = project_config_in(folder, allowed_storage_roots=[str(tmp_path)])
    raw = yaml.safe_load(path.read_text())
    raw["defaults"]["storage_root"] = str(tmp_path / "root")
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["check-config", str(path), "--probe-storage"]) == 0
    assert [p for p in (tmp_path / "root").rglob("*") if p.is_file()] == []
    capsys.readouterr()

    def no_links(*args: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(local.os, "link", no_links)
    assert main(["check-config", str(path), "--probe-storage"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"regen check-config: storage root {tmp_path / 'root'}: conditional writes fail (")
    assert "hard links and flock on a local file system" in line
