"""Live metrics (regen.metrics): each task try's series reach a real Pushgateway in a group of their own, the generate
path counts what its report counts, and a Pushgateway that is down or hangs never fails or holds up a task."""

from __future__ import annotations

import json
import logging
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from regen import metrics
from regen.chat import ChatRenderer
from regen.config import Sampling
from regen.stages.generate import generate
from regen.stages.generate.generate import GenerateSettings, run_generate
from tests.conftest import Simulator, prepare_sample
from tools.prometheus_stack import PrometheusStack


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[metrics.Pushgateway]:
    with PrometheusStack(tmp_path_factory.mktemp("prometheus")) as stack:  # a real Pushgateway (and Prometheus)
        yield metrics.Pushgateway(stack.pushgateway, push_interval_s=0.2)


@pytest.fixture(autouse=True)
def no_task_left() -> Iterator[None]:
    yield
    metrics.end_task(False)


def held(gateway: metrics.Pushgateway) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample the Pushgateway serves of this job: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"{gateway.url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("job") == metrics.JOB:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    """The sum over the samples of `name` whose labels include `labels`."""
    return sum(v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items())


def test_each_try_pushes_its_own_group_and_a_run_is_forgotten_alone(gateway: metrics.Pushgateway) -> None:
    first = metrics.begin_task(gateway, metrics.grouping_key("run-a", "process_shard.generate_shard", 3, 1))
    first.answers.labels("B1", "http://gpu-0:30000").inc(5)
    metrics.end_task(False)  # killed by the fleet: a retry follows
    retry = metrics.begin_task(gateway, metrics.grouping_key("run-a", "process_shard.generate_shard", 3, 2))
    retry.answers.labels("B1", "http://gpu-0:30000").inc(7)
    metrics.end_task(True)
    other = metrics.begin_task(gateway, metrics.grouping_key("run-b", "plan", None, 1))
    other.loss_allowance(0.02)
    metrics.end_task(True)

    samples = held(gateway)
    # A retry adds to its killed try's counts instead of replacing them: 5 + 7 answers in the run.
    assert value(samples, "eagle3_regen_answers_total", run="run-a") == 12
    assert value(samples, "eagle3_regen_answers_total", run="run-a", map_index="3", **{"try": "1"}) == 5
    assert value(samples, "eagle3_regen_task_succeeded", run="run-a", **{"try": "1"}) == 0
    assert value(samples, "eagle3_regen_task_succeeded", run="run-a", **{"try": "2"}) == 1
    assert value(samples, "eagle3_regen_fleet_loss_allowance_ratio", run="run-b", task="plan", map_index="-1") == 0.02
    # No series of a counter's creation time beside it; plan's allowance only from plan (a gauge without labels
    # would be exported as 0 by every task).
    assert not [name for name, _ in samples if name.endswith("_created")]
    assert [dict(ls)["task"] for n, ls in samples if n == "eagle3_regen_fleet_loss_allowance_ratio"] == ["plan"]

    assert metrics.forget_runs(gateway, run="run-a") == 2
    left = held(gateway)
    assert value(left, "eagle3_regen_answers_total", run="run-a") == 0
    assert value(left, "eagle3_regen_fleet_loss_allowance_ratio", run="run-b") == 0.02
    assert metrics.forget_runs(gateway, but="run-c") == 1  # a new run's plan: every earlier run's groups go
    assert held(gateway) == {}


def test_a_running_try_pushes_as_it_goes(gateway: metrics.Pushgateway) -> None:
    running = metrics.begin_task(gateway, metrics.grouping_key("run-live", "process_shard.generate_shard", 0, 1))
    running.in_flight.labels("B1").set(9)
    deadline = time.monotonic() + 10
    while value(held(gateway), "eagle3_regen_requests_in_flight", run="run-live") != 9:
        assert time.monotonic() < deadline, "the running try's series never reached the Pushgateway"
        time.sleep(0.1)
    pushed = value(held(gateway), "push_time_seconds", run="run-live")
    time.sleep(0.6)  # three intervals: a heartbeat even with nothing new
    assert value(held(gateway), "push_time_seconds", run="run-live") > pushed
    metrics.end_task(True)
    metrics.forget_runs(gateway, run="run-live")


def a_port_nothing_listens_on() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("fault", ["down", "hangs"])
def test_a_pushgateway_that_is_down_or_hangs_costs_a_task_one_warning_and_no_time(
    fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as silent:  # accepts connections (the kernel does) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        port = silent.getsockname()[1] if fault == "hangs" else a_port_nothing_listens_on()
        gateway = metrics.Pushgateway(f"http://127.0.0.1:{port}", push_interval_s=0.05)
        with caplog.at_level(logging.WARNING, logger="regen.metrics"):
            started = time.monotonic()
            task = metrics.begin_task(gateway, metrics.grouping_key("run-x", "plan", None, 1))
            task.loss_allowance(0.02)
            time.sleep(0.5)  # the task's work, during which pushes fail (down) or wait (hangs)
            metrics.end_task(True)
            took = time.monotonic() - started
            assert metrics.forget_runs(gateway, run="run-x") == 0
    assert took < 0.5 + metrics.LAST_PUSH_S + 0.5
    pushes = [r for r in caplog.records if "pushing to" in r.getMessage()]
    assert len(pushes) == 1, [r.getMessage() for r in caplog.records]
    assert "the task goes on" in pushes[0].getMessage()


def test_generate_counts_what_its_report_counts(tmp_path: Path, renderer: ChatRenderer, simulator: Simulator) -> None:
    prepared, storage = prepare_sample(tmp_path, renderer, "B2_opencodeinstruct", 30)
    shard = prepared.shards[0]
    task = metrics.begin_task(None, metrics.grouping_key("run-g", "process_shard.generate_shard", 0, 1))
    settings = GenerateSettings([simulator.url], Sampling(max_new_tokens=64).as_params(), concurrency=4)
    done = run_generate(shard, storage, settings)
    report = done.generation
    assert report is not None and report.answered == done.stats["generate"].kept > 0
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value for family in task.registry.collect() for s in family.samples
    }
    dataset = shard.location.dataset
    assert value(samples, "eagle3_regen_answers_total", dataset=dataset, endpoint=simulator.url) == report.answered
    assert value(samples, "eagle3_regen_output_tokens_total", dataset=dataset) == report.output_tokens
    assert value(samples, "eagle3_regen_prompt_tokens_total", dataset=dataset) == report.prompt_tokens
    assert value(samples, "eagle3_regen_requests_total", dataset=dataset) == report.requests
    assert value(samples, "eagle3_regen_requests_total", outcome="answered") == report.answered
    assert value(samples, "eagle3_regen_request_seconds_total") == pytest.approx(report.request_seconds, abs=0.01)
    assert value(samples, "eagle3_regen_settled_answers", dataset=dataset) == shard.num_prompts
    assert value(samples, "eagle3_regen_requests_in_flight", dataset=dataset) == 0
    assert value(samples, "eagle3_regen_fleet_losses_total", dataset=dataset) == 0

    again = metrics.begin_task(None, metrics.grouping_key("run-g", "process_shard.generate_shard", 0, 2))
    run_generate(shard, storage, settings)  # a try that finds the shard done settles all of it at once
    assert again.settled.labels(dataset)._value.get() == shard.num_prompts


def test_a_retry_settles_what_its_killed_try_had_checkpointed(
    tmp_path: Path, renderer: ChatRenderer, simulator: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepared, storage = prepare_sample(tmp_path, renderer, "B1_glaive", 8, limit=8)
    shard, dataset = prepared.shards[0], prepared.location.dataset
    settings = GenerateSettings([simulator.url], Sampling(max_new_tokens=32).as_params(), concurrency=8)
    killed = metrics.begin_task(None, metrics.grouping_key("run-k", "process_shard.generate_shard", 0, 1))

    def crash(*args: object) -> None:
        raise SystemExit("killed before the raw file")

    with monkeypatch.context() as patched, pytest.raises(SystemExit):
        patched.setattr(generate, "_write_raw", crash)
        run_generate(shard, storage, settings)
    assert killed.settled.labels(dataset)._value.get() == shard.num_prompts
    retry = metrics.begin_task(None, metrics.grouping_key("run-k", "process_shard.generate_shard", 0, 2))
    run_generate(shard, storage, settings)  # nothing left to ask: every answer was checkpointed
    assert retry.settled.labels(dataset)._value.get() == shard.num_prompts
    assert not [s for f in retry.registry.collect() if f.name == "eagle3_regen_answers" for s in f.samples]


def test_no_pushgateway_configured_pushes_nothing() -> None:
    task = metrics.begin_task(None, metrics.grouping_key("run-n", "plan", None, 1))
    task.loss_allowance(0.5)
    task.loss_allowance(0.3)  # plan twice in one process (a CLI, `airflow dags test`): one series, the last value
    [allowance] = [f for f in task.registry.collect() if f.name == "eagle3_regen_fleet_loss_allowance_ratio"]
    assert [s.value for s in allowance.samples] == [0.3]
    metrics.end_task(True)
    assert metrics._pusher is None
    assert json.dumps(metrics.grouping_key("r", "t", None, None)) == (
        '{"run": "r", "task": "t", "map_index": "-1", "try": "1"}'
    )
