"""The run's fleet utilization two ways: client-side (request seconds, queueing included: an upper bound) and
server-side (the seconds each answer held a running slot, which SGLang says with --enable-metrics), the latter
checked against the simulator's own busy slot-seconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from regen.chat import ChatRenderer
from regen.config import Sampling
from regen.manifest import GenerationReport
from regen.run_report import fleet_utilization
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
