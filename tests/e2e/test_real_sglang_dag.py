"""The whole DAG against production's own server: two real SGLang 0.5.23 servers on CPU (tests/real_sglang.py) behind
the real sglang-router, a Kimi dataset with tools and the on-policy sample dataset. Every published record is checked
against what the servers' own request logs (--log-requests-level 3) say they received and sent, read by this test
independently of the pipeline."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from regen.storage import LocalStorage, read_table
from tests.conftest import kept_keys, kept_records, project_config_in, raw_answers
from tests.real_sglang import CURRENCY, GET_WEATHER
from tools.devstack import Stack
from tools.real_sglang import RealServer, model_dir
from tools.router import start_router

pytestmark = pytest.mark.e2e
CITIES = ("Paris", "Lima", "Oslo", "Cairo", "Quito", "Hanoi", "Perth", "Dakar")


def weather_rows() -> list[dict[str, Any]]:
    """Kimi-style tool conversations: most declare get_weather (the model calls it), some another tool or none."""
    rows = []
    for i, city in enumerate(CITIES):
        tools = [GET_WEATHER] if i < 5 else [CURRENCY] if i < 7 else []
        messages = [
            {"role": "system", "content": "You are a helpful assistant with access to functions."},
            {"role": "user", "content": f"Request {i}: what is the weather like in {city} today?"},
            {"role": "assistant", "content": "A reference answer that the target model regenerates."},
        ]
        rows.append({"messages": messages, **({"tools": tools} if tools else {})})
    return rows


def with_dataset(config: Path, name: str, rows: list[dict[str, Any]]) -> None:
    data = config.parent / f"{name}.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    raw = yaml.safe_load(config.read_text())
    raw["datasets"][name] = {"description": "Weather tool calls.", "format": "openai_messages", "paths": [str(data)]}
    config.write_text(yaml.safe_dump(raw, sort_keys=False))


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory, real_sglang_pair: list[RealServer]) -> Iterator[dict[str, Any]]:
    home = tmp_path_factory.mktemp("airflow")
    storage_root = home / "storage"
    config = project_config_in(home, allowed_storage_roots=[str(storage_root)])
    with_dataset(config, "R1_weather", weather_rows())
    workers = [s.url for s in real_sglang_pair]
    with pytest.MonkeyPatch.context() as patched:
        patched.setenv("REGEN_CONFIG", str(config))
        with (
            Stack(home, purpose="real_sglang", simulators=0, pool_slots=2) as stack,
            start_router(workers, home / "router.log", policy="round_robin", tokenizer_path=model_dir()) as router,
        ):
            conf = {
                "endpoints": [router.url],
                "datasets": ["R1_weather", "C1_multiturn"],
                "storage_root": str(storage_root),
                "temperature": 0.0,
                "max_new_tokens": 64,
                # One request at a time: each server's later prompts then find the earlier ones' shared prefix in
                # its radix cache (prompts arriving together may be prefilled in one batch, none hitting it).
                "in_flight": 1,
            }
            yield {
                **stack.outcome(stack.trigger(conf), timeout_s=600),
                "router": router.url,
                "logs": home / "logs",
                "servers": real_sglang_pair,
            }


def published(report: dict[str, Any], dataset: str) -> tuple[dict[str, Any], LocalStorage, dict[str, Any]]:
    [entry] = [d for d in report["datasets"] if d["dataset"] == dataset]
    manifest_path = Path(entry["manifest"])
    manifest = json.loads(manifest_path.read_text())
    return manifest, LocalStorage(Path(manifest["root"])), entry


def test_the_dag_runs_against_real_servers_behind_the_real_router(real_run: dict[str, Any]) -> None:
    assert real_run["state"] == "success", f"{real_run['states']}\nlogs: {real_run['logs']}"
    [endpoint] = real_run["fleet"]
    assert endpoint["router"] is True and endpoint["served_model_name"] == "kimi-k2.5-mini"
    assert sorted(w["url"] for w in endpoint["workers"]) == sorted(s.url for s in real_run["servers"])
    assert all(w["model_path"] == "kimi-k2.5-mini" and w["version"] == "0.5.23" for w in endpoint["workers"])
    assert endpoint["seeds_honoured"] is False  # torch_native: no --enable-deterministic-inference
    # Launched with --enable-metrics (docs/operations.md), every answer says, through the router, how long it held a
    # running slot: the run report's server-side utilization (here without a figure: a server on CPU does not report
    # its max_running_requests, so the fleet's slots are unknown).
    for entry in real_run["report"]["datasets"]:
        [generation] = entry["generation"]
        assert generation["slot_timed"] == generation["answered"] > 0, generation
        assert 0 < generation["slot_seconds"] <= generation["request_seconds"], generation


@pytest.mark.parametrize("dataset", ["R1_weather", "C1_multiturn"])
def test_every_published_record_is_what_the_servers_log_says_they_sent(real_run: dict[str, Any], dataset: str) -> None:
    logged = {r["rid"]: r for server in real_run["servers"] for r in server.finished()}
    manifest, storage, entry = published(real_run["report"], dataset)
    raw = {a["id"]: a for shard in manifest["shards"] for a in raw_answers(storage, shard["raw"])}
    kept = [key for shard in manifest["shards"] for key in kept_keys(shard)]
    train = {r["id"]: r for key in kept for r in read_table(storage, key).to_pylist()}
    assert train and set(train) <= set(raw) and kept_records(manifest) == len(train)
    for answer_id, record in train.items():
        server = logged[raw[answer_id]["rid"]]  # the server's own log: what it was sent, and what it sent back
        assert record["input_ids"] == server["input_ids"] + server["output_ids"]  # bit-exact
        assert record["loss_mask"] == [0] * len(server["input_ids"]) + [1] * len(server["output_ids"])
        assert raw[answer_id]["meta_info"]["finish_reason"] == server["meta_info"]["finish_reason"]
        assert raw[answer_id]["meta_info"]["cached_tokens"] == server["meta_info"]["cached_tokens"]
    assert manifest["seeds_honoured"] is False
    cost = manifest["cost"]
    cached = sum(logged[a["rid"]]["meta_info"]["cached_tokens"] for a in raw.values())
    assert cost["cached_prompt_tokens"] == cached > 0  # the radix cache's real counts
    assert entry["verified"]["records_checked"] == len(raw)


def test_both_servers_answered_through_the_router(real_run: dict[str, Any]) -> None:
    """Over the run, not per dataset: round robin over two datasets' generate tasks asking one at a time in step can
    send each dataset's every request to one server (CI saw R1's 8 all on one, C1's on the other)."""
    rids_of = {s.url: {r["rid"] for r in s.finished()} for s in real_run["servers"]}
    answered_by = dict.fromkeys(rids_of, 0)
    for dataset in ("R1_weather", "C1_multiturn"):
        manifest, storage, _ = published(real_run["report"], dataset)
        for shard in manifest["shards"]:
            for answer in raw_answers(storage, shard["raw"]):
                for url, rids in rids_of.items():
                    answered_by[url] += answer["rid"] in rids
    assert all(answered_by.values()), answered_by


def test_the_weather_calls_are_kept_and_the_other_prompts_answer_in_content(real_run: dict[str, Any]) -> None:
    from regen.profiles import lookup
    from regen.tokenizers.fast_kimi import load_mini_tokenizer

    manifest, storage, _ = published(real_run["report"], "R1_weather")
    roles = manifest["token_roles"]
    call_begin = roles["tool_call_ids"]["call_begin"]
    train = [r for s in manifest["shards"] for key in kept_keys(s) for r in read_table(storage, key).to_pylist()]
    assert len(train) == len(CITIES) == manifest["stages"]["validate"]["kept"]  # every real answer kept
    answers = [[i for i, m in zip(r["input_ids"], r["loss_mask"], strict=True) if m] for r in train]
    calls = [a for a in answers if call_begin in a]
    assert len(calls) == 5  # the five prompts that declare get_weather
    text = load_mini_tokenizer().decode(calls[0])
    assert 'functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}' in text
    assert lookup("kimi-k2.5-mini").eos_tokens[0] in text
