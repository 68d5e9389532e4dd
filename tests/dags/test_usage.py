"""Every eagle3-regen task logs what it cost the machine (regen_airflow.usage), in a line the scale bench reads back."""

from __future__ import annotations

import logging
import os
import resource
from types import SimpleNamespace

import pytest

from regen_airflow import usage
from regen_airflow.usage import Usage, parse_usage_line, usage_line


def test_the_line_carries_the_task_and_its_numbers_and_reads_back() -> None:
    line = usage_line("process_shard.generate_shard", 3, 2, "success", Usage(12.3456, 412.51), Usage(0.5, 96.0), 265.14)
    assert line == (
        "eagle3-regen task usage: task=process_shard.generate_shard map_index=3 try=2 state=success "
        "cpu_s=12.346 peak_rss_mb=412.5 children_cpu_s=0.500 children_peak_rss_mb=96.0 start_rss_mb=265.1"
    )
    assert parse_usage_line(f'{{"event": "{line}", "level": "info"}}') == {
        "task": "process_shard.generate_shard",
        "map_index": 3,
        "try": 2,
        "state": "success",
        "cpu_s": 12.346,
        "peak_rss_mb": 412.5,
        "children_cpu_s": 0.5,
        "children_peak_rss_mb": 96.0,
        "start_rss_mb": 265.1,
    }
    assert parse_usage_line("a log without it") is None


def test_an_unmapped_task_reads_back_with_its_negative_map_index() -> None:
    line = usage_line("plan", -1, 1, "failed", Usage(0.1, 1.0), Usage(0.0, 0.0), 1.0)
    parsed = parse_usage_line(line)
    assert parsed is not None and (parsed["map_index"], parsed["state"]) == (-1, "failed")


def test_the_listener_logs_this_process_usage_for_the_pipelines_tasks_only(caplog: pytest.LogCaptureFixture) -> None:
    sum(i * i for i in range(2_000_000))  # some CPU of this process's own
    ti = SimpleNamespace(dag_id="eagle3_regen", task_id="prepare_dataset", map_index=0, try_number=1)
    with caplog.at_level(logging.INFO, logger=usage.__name__):
        usage.on_task_instance_running(previous_state=None, task_instance=ti)
        usage.on_task_instance_success(previous_state=None, task_instance=ti)
        usage.on_task_instance_failed(previous_state=None, task_instance=ti, error=RuntimeError("x"))
        usage.on_task_instance_success(previous_state=None, task_instance=SimpleNamespace(dag_id="other", task_id="t"))
    lines = [parse_usage_line(r.getMessage()) for r in caplog.records]
    assert [(p["task"], p["state"]) for p in lines if p] == [
        ("prepare_dataset", "success"),
        ("prepare_dataset", "failed"),
    ]
    own = resource.getrusage(resource.RUSAGE_SELF)
    first = lines[0]
    assert first is not None
    assert 0.1 < first["cpu_s"] <= own.ru_utime + own.ru_stime + 0.0005  # the line rounds to the millisecond
    assert 10 < first["peak_rss_mb"] <= own.ru_maxrss / 1024 + 0.1  # MiB, from Linux's KiB
    assert 10 < first["start_rss_mb"] <= first["peak_rss_mb"] + 1  # the kernel syncs its RSS counters lazily


def test_a_forked_task_tells_what_it_began_with_from_what_it_grew_by() -> None:
    """A task forked from a supervisor holding 300 MB starts its high-water mark there; the 200 MB it allocates
    itself are the difference."""
    held = bytearray(300 * 2**20)
    held[:: resource.getpagesize()] = b"\1" * len(held[:: resource.getpagesize()])  # touched: resident
    read, write = os.pipe()
    if os.fork() == 0:  # the task process
        try:
            ti = SimpleNamespace(dag_id="eagle3_regen", task_id="verify_dataset", map_index=0, try_number=1)
            usage.on_task_instance_running(previous_state=None, task_instance=ti)
            own = bytearray(200 * 2**20)
            own[:: resource.getpagesize()] = b"\1" * len(own[:: resource.getpagesize()])
            line = usage_line("t", 0, 1, "success", Usage.of(resource.RUSAGE_SELF), Usage(0, 0), usage._started[1])  # type: ignore[index]
            os.write(write, line.encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as lines:
        parsed = parse_usage_line(lines.read())
    os.wait()
    del held
    assert parsed is not None
    assert parsed["start_rss_mb"] > 300
    assert 195 < parsed["peak_rss_mb"] - parsed["start_rss_mb"] < 260


def test_no_line_where_no_task_began_the_scheduler_or_api_server_setting_a_state(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Airflow calls the failed and success hooks outside the task runner too (the scheduler failing a task whose
    process died, models/taskinstance.py; the API server marking one by hand): those processes' usage is no task's.
    Nor is a line logged for another try than the one that began here."""
    began = SimpleNamespace(dag_id="eagle3_regen", run_id="r", task_id="generate_shard", map_index=2, try_number=1)
    with caplog.at_level(logging.INFO, logger=usage.__name__):
        monkeypatch.setattr(usage, "_started", None, raising=False)  # a scheduler: the running hook never fired here
        usage.on_task_instance_failed(previous_state="running", task_instance=began, error="zombie")
        usage.on_task_instance_success(previous_state=None, task_instance=began)
        usage.on_task_instance_running(previous_state="queued", task_instance=began)
        usage.on_task_instance_failed(
            previous_state=None, task_instance=SimpleNamespace(**{**vars(began), "try_number": 2}), error="x"
        )
        usage.on_task_instance_success(previous_state="running", task_instance=began)
    lines = [parse_usage_line(r.getMessage()) for r in caplog.records]
    assert [(p["task"], p["try"], p["state"]) for p in lines if p] == [("generate_shard", 1, "success")]


def test_the_plugin_registers_the_usage_listener() -> None:
    from airflow.sdk import plugins_manager

    plugins, _ = plugins_manager._get_plugins()
    assert usage in [listener for plugin in plugins for listener in plugin.listeners]
