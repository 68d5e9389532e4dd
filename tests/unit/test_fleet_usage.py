"""The run's fleet utilization two ways: client-side (request seconds, queueing included: an upper bound) and
server-side (the seconds each answer held a running slot, which SGLang says with --enable-metrics), the latter
checked against the simulator's own busy slot-seconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from regen.chat import ChatRenderer
from regen.config import Sampling
from regen.manifest import GenerationReport
from regen.run_report import fleet_utilization, sizing_warnings
from regen.sglang.parity import PROVEN_SGLANG_VERSION
from regen.stages.generate.generate import GenerateSettings, run_generate
from tests.conftest import prepare_sample
from tools.devstack import start_simulator

SLOTS = 2


def generate(tmp_path: Path, renderer: ChatRenderer, *simulator_args: str) -> tuple[list[GenerationReport], dict]:
    """A dataset's shards through a server of two slots, three requests a slot in flight: answers queue there."""
    prepared, storage = prepare_sample(tmp_path, renderer, "B1_glaive", 12)
    args = ("--max-running", str(SLOTS), "--decode-ms-per-token", "1", *simulator_args)
    with start_simulator(tmp_path, *args) as sim:
        settings = GenerateSettings([sim.url], Sampling().as_params(), concurrency=3 * SLOTS)
        reports = [run_generate(shard, storage, settings).generation for shard in prepared.shards]
        stats = sim.stats()
    return [r for r in reports if r is not None], stats


def test_the_server_side_figure_is_the_servers_own_busy_time(tmp_path: Path, renderer: ChatRenderer) -> None:
    reports, stats = generate(tmp_path, renderer, "--enable-metrics")
    usage = fleet_utilization(reports, [{"max_running_requests": SLOTS}])
    held = sum(r.slot_seconds for r in reports)
    assert sum(r.slot_timed for r in reports) == sum(r.answered for r in reports) == stats["answered"] > 0
    assert held == pytest.approx(stats["busy_slot_seconds"], rel=0.05)
    # Queued three deep, a request waits about twice as long as it runs: client-side counts both.
    assert held < 0.7 * usage["request_seconds"] and usage["utilization"] == 1.0  # (capped)
    assert usage["server_side"] == pytest.approx(held / (SLOTS * usage["window_s"]), abs=1e-3)


def test_without_the_servers_word_there_is_no_server_side_figure(tmp_path: Path, renderer: ChatRenderer) -> None:
    reports, _ = generate(tmp_path, renderer)
    usage = fleet_utilization(reports, [{"max_running_requests": SLOTS}])
    assert usage["server_side"] is None and usage["utilization"] is not None
    assert sum(r.slot_timed for r in reports) == 0


def spec(**settings: int) -> dict:
    return {"concurrency": 24, "shard_tasks": 4, "shard_size": 48, **settings}


def test_a_budget_that_keeps_the_fleet_fed_warns_of_nothing() -> None:
    fleet = [{"max_running_requests": 16}, {"max_running_requests": 16}]
    assert sizing_warnings(spec(), fleet) == []  # 4 x 24 = 96 requests, 3 a slot of 32
    assert sizing_warnings(spec(concurrency=48), fleet) == []
    # A fleet whose slots are unknown is not judged by them; a share above the shard's rows still is.
    assert sizing_warnings(spec(), [{"max_running_requests": None}]) == []
    assert len(sizing_warnings(spec(shard_size=20), [{}])) == 1


def test_a_share_no_shard_can_fill_is_named_with_the_shard_size_that_fills_it() -> None:
    # The bench's old on-policy settings: shards of 20 conversations, a share of 24; 80 requests at 32 slots.
    unused, thin = sizing_warnings(spec(shard_size=20), [{"max_running_requests": 32}])
    assert "a shard has 20 rows" in unused and "set shard_size to 24 or more" in unused
    assert "at most 80 requests at a fleet of 32 running slots (2.5 a slot)" in thin
    assert "set in_flight to 192" in thin


def test_too_few_requests_a_slot_warn_in_the_run_report(tmp_roots_allowed: Path) -> None:
    from regen import pipeline

    params = {"endpoints": ["http://127.0.0.1:30000"], "storage_root": str(tmp_roots_allowed), "in_flight": 32}
    run = pipeline.RunSpec.from_params(params, "sizing").model_copy(update={"datasets": []})  # 4 tasks, 8 each
    fleet = [{"url": "http://127.0.0.1:30000", "version": PROVEN_SGLANG_VERSION, "max_running_requests": 64}]
    assert pipeline.report(run, [], fleet)["warnings"] == [
        "the run keeps at most 32 requests at a fleet of 64 running slots (0.5 a slot): while shard tasks finish "
        "their last answers the fleet idles; set in_flight to 384 (6 a slot, with chain_priority on a fleet that "
        "schedules by priority) and shard_size to at least in_flight / shard_tasks (docs/scaling.md)"
    ]


def test_check_server_warns_of_the_budget_before_any_shard_is_sent(
    tmp_roots_allowed: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from regen import pipeline

    with start_simulator(tmp_roots_allowed, "--max-running", "64") as sim:
        params = {"endpoints": [sim.url], "storage_root": str(tmp_roots_allowed), "in_flight": 32}
        with caplog.at_level(logging.WARNING, logger="regen"):
            fleet = pipeline.check_server(pipeline.RunSpec.from_params(params, "sizing"))
    assert fleet[0]["max_running_requests"] == 64
    assert [m for m in caplog.messages if "a fleet of 64 running slots (0.5 a slot)" in m]


@pytest.fixture
def references(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """30 rows with reference answers of many lengths, in shards of 10."""
    source = tmp_path / "rows.jsonl"
    rows = [{"input": f"Question {i}?", "output": " ".join(["word"] * ((i * 37) % 60 + 1))} for i in range(30)]
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = {
        "defaults": {"storage_root": str(tmp_path / "storage"), "shard_size": 10, "tokenize_workers": 1},
        "governance": {"allowed_endpoints": ["127.0.0.1"]},
        "datasets": {"B1": {"format": "input_output", "paths": [str(source)]}},
    }
    (tmp_path / "regen.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("REGEN_CONFIG", str(tmp_path / "regen.yaml"))
    return tmp_path


def whole_run(tmp_path: Path) -> dict:
    """plan, the fleet check, each shard's stages, publish and the report, as the DAG's tasks call them, against a
    server of 4 slots that says how long each answer held one."""
    from regen import pipeline
    from tests.conftest import each_shard

    with start_simulator(tmp_path, "--max-running", "4", "--decode-ms-per-token", "1", "--enable-metrics") as sim:
        run = pipeline.RunSpec(**pipeline.plan({"endpoints": [sim.url], "in_flight": 8}, "v1"))
        fleet = pipeline.check_server(run)
        prepared = pipeline.finish_prepared(run, [pipeline.prepare_dataset(run, name) for name in run.datasets])
        for shard in each_shard(run, prepared):
            pipeline.export_shard(run, pipeline.validate_shard(run, pipeline.generate_shard(run, shard)))
        published = [pipeline.publish_dataset(run, p, [], pipeline.verify_dataset(run, p)) for p in prepared]
        return pipeline.report(run, published, fleet)


def test_the_run_report_sets_the_drain_model_beside_the_measured_figures(references: Path) -> None:
    report = whole_run(references)
    usage = report["fleet_usage"]
    model, answered = usage["model"], report["datasets"][0]["stages"]["generate"]["kept"]
    assert usage["server_side"] is not None and answered == 30
    assert model["answers"] == model["predicted_answers"] == answered  # every row had a reference answer
    assert 0 < model["predicted"] <= 1 and 0 < model["with_answer_lengths"] <= 1
    assert model["settings"] | {"decode_ms": None} == {
        **{"shard_size": 10, "shard_tasks": 4, "in_flight": 8, "slots": 4, "longest_first": True},
        **{"chain_priority": False, "decode_ms": None, "task_gap_s": 3.0},
    }
    assert model["settings"]["decode_ms"] == pytest.approx(1.0, rel=0.5)  # the server's 1 ms a token, as it said


def test_a_model_that_fails_is_a_warning_and_the_report_stands(
    references: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from regen.pipeline import run as run_task

    def broken(*_: object) -> dict:
        raise OverflowError("no model today")

    monkeypatch.setattr(run_task, "run_figures", broken)
    report = whole_run(references)
    assert "model" not in report["fleet_usage"] and report["fleet_usage"]["server_side"] is not None
    assert "the drain model's utilization was not worked out (OverflowError: no model today)" in report["warnings"]
    assert report["unpublished"] == [] and report["datasets"][0]["records"] > 0
