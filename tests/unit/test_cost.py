"""What generation cost: prompt tokens, the part the server's prefix cache held, output tokens, server time,
GPU-hours from the fleet's own server info, and with a price the cost per 1M training tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from regen.chat import ChatRenderer
from regen.config import Sampling
from regen.manifest import GenerationReport
from regen.run_report import generation_cost
from regen.sglang.server_check import check_fleet
from regen.simulator.prefix_cache import PAGE, PrefixCache
from regen.stages.publish.publish import run_publish
from tests.conftest import Simulator, finish_shards, prepare_sample


def test_the_prefix_cache_holds_what_earlier_prompts_shared_in_whole_pages() -> None:
    cache = PrefixCache(capacity_tokens=10 * PAGE)
    system = list(range(40))  # a shared system prompt: two whole pages and a part
    assert cache.admit([*system, 100, 101]) == 0  # nothing before it
    assert cache.admit([*system, 200, 201, 202]) == 2 * PAGE  # the shared pages, not the part page
    again = [*system, 200, 201, 202]
    assert cache.admit(again) == (len(again) - 1) // PAGE * PAGE  # all but the last token's page
    assert cache.admit([1, *system]) == 0  # the same tokens after another prefix are another prefix


def test_the_least_recently_used_pages_go_first_when_the_cache_is_full() -> None:
    cache = PrefixCache(capacity_tokens=3 * PAGE)
    first, second = list(range(3 * PAGE)), list(range(1000, 1000 + 3 * PAGE))
    cache.admit(first)
    cache.admit(second)  # two pages each, three held: the first prompt's first page went
    assert cache.admit(second) == 2 * PAGE
    assert cache.admit(first) == 0  # its first page is gone, so nothing of it is a cached prefix


def test_the_simulator_reports_cached_tokens_and_prefills_only_the_rest(simulator: Simulator) -> None:
    prompt = list(range(5000, 5000 + 5 * PAGE))
    params = {"max_new_tokens": 4, "temperature": 0.0}
    answers = [
        requests.post(f"{simulator.url}/generate", json={"input_ids": prompt, "sampling_params": params}, timeout=30)
        for _ in range(2)
    ]
    assert [a.json()["meta_info"]["cached_tokens"] for a in answers] == [0, 4 * PAGE]


def report(seconds: float, prompt: int, cached: int, output: int) -> GenerationReport:
    return GenerationReport(
        100.0, 100.0 + seconds, 10, 10, seconds * 4, output, prompt_tokens=prompt, cached_tokens=cached
    )


def test_gpu_hours_and_cost_per_million_training_tokens() -> None:
    fleet = [{"gpus": 8, "max_running_requests": 64}, {"gpus": 8, "max_running_requests": 64}]
    reports = [report(900.0, 10_000, 4_000, 20_000), report(900.0, 10_000, 6_000, 20_000)]
    cost = generation_cost(reports, fleet, train_tokens=50_000, cost={"gpu_hour_price": 2.0, "currency": "USD"})
    # 7,200 request-seconds, each holding one of 128 slots of 16 GPUs: 900 GPU-seconds, 0.25 GPU-hours, $0.50.
    assert cost["request_seconds"] == 7200.0 and cost["gpu_hours"] == 0.25 and cost["cost"] == 0.5
    assert cost["cost_per_million_train_tokens"] == 10.0
    assert cost["gpu_hours_window"] == 16 * 900 / 3600  # the whole fleet over the generation window
    assert (cost["prompt_tokens"], cost["cached_prompt_tokens"], cost["cached_share"]) == (20_000, 10_000, 0.5)


def test_without_a_price_or_a_known_fleet_only_what_is_known_is_given() -> None:
    reports = [report(60.0, 100, 0, 100)]
    unpriced = generation_cost(reports, [{"gpus": 8, "max_running_requests": 8}], 200, {"gpu_hour_price": None})
    assert unpriced["gpu_hours"] is not None and unpriced["cost"] is None
    unknown = generation_cost(reports, [{"max_running_requests": 8}], 200, {"gpu_hour_price": 2.0})
    assert unknown["gpus"] is None and unknown["gpu_hours"] is None and unknown["cost"] is None
    counted = generation_cost(
        reports, [{"max_running_requests": 8}], 200, {"gpu_hour_price": 2.0, "gpus_per_endpoint": 4}
    )
    assert counted["gpus"] == 4 and counted["cost"] is not None


@pytest.fixture
def published(tmp_path: Path, renderer: ChatRenderer, simulator: Simulator) -> tuple[dict, list]:  # type: ignore[type-arg]
    prepared, storage = prepare_sample(tmp_path, renderer, "B1_glaive", 20)
    finish_shards(prepared.shards, storage, renderer, simulator.url)
    fleet = check_fleet([simulator.url], renderer, Sampling().as_params())
    summary = run_publish(prepared, storage, fleet, cost={"gpu_hour_price": 3.5, "currency": "EUR"})
    return json.loads(Path(summary["manifest"]).read_text()), fleet


def test_the_manifest_counts_what_generation_cost(published: tuple[dict, list]) -> None:  # type: ignore[type-arg]
    manifest, fleet = published
    cost = json.loads(Path(manifest["report"]["json"]).read_text())["cost"]
    assert manifest["cost"] == cost and fleet[0]["gpus"] == 8  # the simulator reports tp_size 8
    sent = manifest["stages"]["generate"]["kept"]
    assert cost["prompt_tokens"] > 0 and 0 < cost["cached_prompt_tokens"] < cost["prompt_tokens"]
    assert cost["gpus"] == 8 and cost["slots"] == fleet[0]["max_running_requests"]
    assert cost["gpu_hours"] == pytest.approx(cost["request_seconds"] * 8 / cost["slots"] / 3600, abs=1e-6)
    assert cost["currency"] == "EUR" and cost["cost"] == pytest.approx(cost["gpu_hours"] * 3.5, abs=1e-4)
    assert cost["train_tokens"] > 0 and sent > 0
