"""Through the real sglang-router (PyPI `sglang-router`) in front of two simulators: check_server learns the fleet
behind the router, and generation through the router's one URL gets exactly the answers the workers sent."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from regen.chat import ChatRenderer
from regen.config import Sampling
from regen.sglang.fleet import FleetUnavailable
from regen.sglang.parity import PROVEN_SGLANG_VERSION
from regen.sglang.server_check import check_fleet
from regen.stages.generate.generate import GenerateSettings, run_generate
from tests.conftest import Simulator, prepare_sample, project_config_in, raw_answers, shard_prompt_ids, start_simulator
from tools.devstack import Stack, free_port
from tools.router import Router, start_router

pytestmark = pytest.mark.e2e
SAMPLING = Sampling().as_params()


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Simulator]]:
    folder = tmp_path_factory.mktemp("workers")
    fleet = [start_simulator(folder, "--omit-think-end-rate", "0") for _ in range(2)]
    yield fleet
    for simulator in fleet:
        simulator.stop()


@pytest.fixture(scope="module")
def router(workers: list[Simulator], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    log = tmp_path_factory.mktemp("router") / "router.log"
    with start_router([w.url for w in workers], log, policy="cache_aware") as running:
        yield running


def test_check_server_learns_the_workers_behind_the_router(
    router: Router, workers: list[Simulator], renderer: ChatRenderer
) -> None:
    [info] = check_fleet([router.url], renderer, SAMPLING, deadline_s=30)
    assert info["url"] == router.url and info["router"] is True
    assert info["model_path"] == "kimi-k2.5-mini"  # /get_model_info, forwarded to a worker
    assert sorted(w["url"] for w in info["workers"]) == sorted(w.url for w in workers)
    assert all(w["healthy"] and w["model_path"] == "kimi-k2.5-mini" for w in info["workers"])
    assert all(w["max_running_requests"] == 256 for w in info["workers"])
    assert info["max_running_requests"] == 512  # the fleet's capacity: both workers' running slots
    assert info["version"] == PROVEN_SGLANG_VERSION and info["context_length"] == 16384
    assert info["probe_output_tokens"] > 0


def test_generation_through_the_router_gets_the_workers_own_answers(
    router: Router, workers: list[Simulator], renderer: ChatRenderer, tmp_path: Path
) -> None:
    prepared, storage = prepare_sample(tmp_path, renderer, "B2_opencodeinstruct", 100)
    shard = prepared.shards[0]
    settings = GenerateSettings([router.url], SAMPLING, concurrency=8)
    done = run_generate(shard, storage, settings)

    answers = raw_answers(storage, done.raw_key)
    prompts = shard_prompt_ids(storage, shard)
    sent = {w.url: {r["rid"]: r for r in w.records()} for w in workers}
    answered_by = {url: [a for a in answers if a["rid"] in records] for url, records in sent.items()}
    assert len(answers) == len(prompts) == done.stats["generate"].kept == 48
    assert all(answered_by.values()), {url: len(a) for url, a in answered_by.items()}  # both workers answered
    assert sum(len(a) for a in answered_by.values()) == len(answers)  # each answer by exactly one worker
    for url, mine in answered_by.items():
        for answer in mine:
            recorded = sent[url][answer["rid"]]
            assert answer["endpoint"] == router.url
            assert recorded["input_ids"] == prompts[answer["id"]]  # the prompt passed the router untouched
            assert answer["output_ids"] == recorded["output_ids"]
            assert answer["meta_info"]["finish_reason"] == recorded["finish_reason"]


def test_a_router_without_a_healthy_worker_fails_at_the_deadline(renderer: ChatRenderer, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with start_router([dead], tmp_path / "router.log", wait_for_workers=False) as router:
        message = rf"^{re.escape(router.url)}/health_generate not ready after 3s \(last: HTTP 503\): the sglang-router"
        with pytest.raises(FleetUnavailable, match=message):
            check_fleet([router.url], renderer, SAMPLING, deadline_s=3)


@pytest.fixture(scope="module")
def routed_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The whole DAG with one endpoint: a router in front of the stack's two simulators (about 90 s, mostly Airflow
    starting)."""
    home = tmp_path_factory.mktemp("airflow")
    config = project_config_in(home, allowed_storage_roots=[str(home / "storage")])  # the run writes under the test's
    with pytest.MonkeyPatch.context() as patched:
        patched.setenv("REGEN_CONFIG", str(config))
        with (
            Stack(home, purpose="router_e2e", simulators=2, pool_slots=2) as stack,
            # Round robin: cache-aware routing sends B1's prompts, which share a long system prompt, to one worker
            # until the load differs by 32 (seen: all 37 to one), and this run is to show both workers answering.
            start_router([s.url for s in stack.fleet], home / "router.log", policy="round_robin") as router,
        ):
            conf = {"endpoints": [router.url], "datasets": ["B1_glaive"], "storage_root": str(home / "storage")}
            yield {
                **stack.outcome(stack.trigger(conf), timeout_s=300),
                "router": router.url,
                "answered": [len(s.records()) for s in stack.fleet],
                "logs": home / "logs",
            }


def test_the_dag_runs_through_the_router(routed_run: dict[str, Any]) -> None:
    assert routed_run["state"] == "success", f"{routed_run['states']}\nlogs: {routed_run['logs']}"
    [endpoint] = routed_run["fleet"]
    assert endpoint["url"] == routed_run["router"] and endpoint["router"] is True
    assert len(endpoint["workers"]) == 2 and endpoint["max_running_requests"] == 512
    [published] = routed_run["report"]["datasets"]
    assert published["dataset"] == "B1_glaive" and sum(published["splits"].values()) == 36
    assert all(routed_run["answered"]) and sum(routed_run["answered"]) >= 36  # both workers answered, probes too
    assert routed_run["report"]["fleet_usage"]["slots"] == 512
