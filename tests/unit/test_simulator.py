"""The simulator speaks SGLang's native protocol: shapes, EOS, batches, errors, and Kimi-shaped answers."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from regen.chat import ChatRenderer
from tests.conftest import Simulator, start_simulator

THINK_END, IM_END = 163607, 163586
SAMPLING = {"max_new_tokens": 512, "temperature": 0.7, "top_p": 0.95, "top_k": -1}


def generate(sim: Simulator, body: dict[str, Any]) -> requests.Response:
    return requests.post(f"{sim.url}/generate", json=body, timeout=30)


@pytest.fixture(scope="module")
def prompt(renderer: ChatRenderer) -> list[int]:
    return renderer.render_ids([{"role": "user", "content": "What is 2 + 2?"}], None)


def test_single_request_shape_and_eos(simulator: Simulator, prompt: list[int]) -> None:
    resp = generate(simulator, {"input_ids": prompt, "sampling_params": SAMPLING, "rid": "single-1"})
    assert resp.status_code == 200
    body = resp.json()
    assert set(body) == {"text", "output_ids", "meta_info"}
    meta = body["meta_info"]
    assert meta["id"] == "single-1"
    assert meta["finish_reason"] == {"type": "stop", "matched": IM_END}
    assert body["output_ids"][-1] == IM_END  # the matched stop token stays in output_ids
    assert meta["completion_tokens"] == len(body["output_ids"])
    assert meta["prompt_tokens"] == len(prompt)
    assert body["output_ids"].count(THINK_END) == 1  # reasoning closed once; <think> was in the prompt
    assert 163606 not in body["output_ids"]


def test_same_prompt_and_seed_give_the_same_answer(simulator: Simulator, prompt: list[int]) -> None:
    params = {**SAMPLING, "sampling_seed": 7}
    first = generate(simulator, {"input_ids": prompt, "sampling_params": params}).json()["output_ids"]
    second = generate(simulator, {"input_ids": prompt, "sampling_params": params}).json()["output_ids"]
    other = generate(simulator, {"input_ids": prompt, "sampling_params": {**params, "sampling_seed": 8}}).json()
    assert first == second
    assert other["output_ids"] != first


def test_batch_answers_in_input_order_with_indexed_rids(simulator: Simulator, renderer: ChatRenderer) -> None:
    prompts = [renderer.render_ids([{"role": "user", "content": f"question {i}"}], None) for i in range(5)]
    singles = [
        generate(simulator, {"input_ids": p, "sampling_params": {**SAMPLING, "sampling_seed": 3}}).json()
        for p in prompts
    ]
    batch = generate(
        simulator, {"input_ids": prompts, "sampling_params": {**SAMPLING, "sampling_seed": 3}, "rid": "b"}
    ).json()
    assert isinstance(batch, list) and len(batch) == 5
    assert [b["meta_info"]["id"] for b in batch] == [f"b_{i}" for i in range(5)]
    assert [b["meta_info"]["prompt_tokens"] for b in batch] == [len(p) for p in prompts]
    # Seeds are offset per batch item, as independent samples would be; item 0 matches the single request.
    assert batch[0]["output_ids"] == singles[0]["output_ids"]


def test_n_samples_per_prompt(simulator: Simulator, prompt: list[int]) -> None:
    body = generate(simulator, {"input_ids": prompt, "sampling_params": {**SAMPLING, "n": 3}, "rid": "n"}).json()
    ids = [b["meta_info"]["id"] for b in body]  # as SGLang 0.5.23 names them: each its own, never after the rid
    assert len(set(ids)) == 3 and "n" not in ids


def test_max_new_tokens_truncates_with_length(simulator: Simulator, prompt: list[int]) -> None:
    body = generate(simulator, {"input_ids": prompt, "sampling_params": {**SAMPLING, "max_new_tokens": 5}}).json()
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert len(body["output_ids"]) == 5 and IM_END not in body["output_ids"]


def test_stop_token_ids_end_generation_and_stay_in_output(simulator: Simulator, prompt: list[int]) -> None:
    params = {**SAMPLING, "stop_token_ids": [THINK_END], "sampling_seed": 1}
    body = generate(simulator, {"input_ids": prompt, "sampling_params": params}).json()
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": THINK_END}
    assert body["output_ids"][-1] == THINK_END


def test_text_honours_skip_special_tokens(simulator: Simulator, prompt: list[int], renderer: ChatRenderer) -> None:
    params = {**SAMPLING, "sampling_seed": 2}
    skipped = generate(simulator, {"input_ids": prompt, "sampling_params": params}).json()
    kept = generate(
        simulator,
        {"input_ids": prompt, "sampling_params": {**params, "no_stop_trim": True, "skip_special_tokens": False}},
    ).json()
    assert "</think>" in skipped["text"]  # not a special token: kept even when skipping
    assert "<|im_end|>" not in skipped["text"]
    assert kept["text"].endswith("<|im_end|>")
    assert kept["text"] == renderer.decode(kept["output_ids"])


def test_tool_declaring_prompts_sometimes_call_a_declared_tool(simulator: Simulator, renderer: ChatRenderer) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    calls = 0
    for i in range(12):
        prompt = renderer.render_ids([{"role": "user", "content": f"weather {i}?"}], [tool])
        out = generate(simulator, {"input_ids": prompt, "sampling_params": SAMPLING}).json()["output_ids"]
        assert out[-1] == IM_END
        if 163595 in out:
            calls += 1
            text = renderer.decode(out)
            assert "</think><|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0" in text
            arguments = text.split("<|tool_call_argument_begin|>")[1].split("<|tool_call_end|>")[0]
            assert set(json.loads(arguments)) == {"city"}
            assert text.endswith("<|tool_calls_section_end|><|im_end|>")
    assert 0 < calls < 12


@pytest.mark.parametrize(
    "body,message",
    [
        pytest.param({"input_ids": [], "sampling_params": {}}, "input_ids cannot be empty.", id="empty"),
        pytest.param({"sampling_params": {}}, "Either text, input_ids or input_embeds should be provided.", id="none"),
        pytest.param({"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p must be in (0, 1], got 0.", id="p"),
        pytest.param({"input_ids": [1], "sampling_params": {"top_k": 0}}, "top_k must be -1", id="top_k"),
        pytest.param({"input_ids": [1], "sampling_params": {"temperature": -1}}, "temperature must be", id="temp"),
        pytest.param(
            {"input_ids": [1] * 16384},
            "The input (16384 tokens) is longer than the model's context length (16384 tokens).",
            id="too-long",
        ),
    ],
)
def test_engine_errors_are_400_with_sglang_shape(simulator: Simulator, body: dict[str, Any], message: str) -> None:
    resp = generate(simulator, body)
    assert resp.status_code == 400
    assert resp.json()["error"]["message"].startswith(message)


def test_malformed_json_is_a_400_schema_error(simulator: Simulator) -> None:
    resp = requests.post(f"{simulator.url}/generate", data=b"{not json", timeout=10)
    assert resp.status_code == 400
    body = resp.json()
    assert body["object"] == "error" and body["code"] == 400 and body["type"] == "Bad Request"


def test_duplicate_running_rid_is_rejected(tmp_path: Path, prompt: list[int]) -> None:
    slow = start_simulator(tmp_path, "--decode-ms-per-token", "20")
    try:
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            first = pool.submit(generate, slow, {"input_ids": prompt, "sampling_params": SAMPLING, "rid": "dup"})
            time.sleep(0.3)
            second = generate(slow, {"input_ids": prompt, "sampling_params": SAMPLING, "rid": "dup"})
            assert first.result().status_code == 200
        assert second.status_code == 400
        assert second.json()["error"]["message"] == "Duplicate request ID detected"
    finally:
        slow.process.terminate()


def test_info_endpoints(simulator: Simulator) -> None:
    for path in ("/model_info", "/get_model_info"):
        info = requests.get(simulator.url + path, timeout=5).json()
        assert info["model_path"] == "kimi-k2.5-mini" and info["is_generation"] is True
    for path in ("/server_info", "/get_server_info"):
        info = requests.get(simulator.url + path, timeout=5).json()
        assert info["context_length"] == 16384 and info["version"]
    models = requests.get(simulator.url + "/v1/models", timeout=5).json()
    assert models["object"] == "list" and models["data"][0]["id"] == "kimi-k2.5-mini"
    assert models["data"][0]["max_model_len"] == 16384


def test_health_is_503_until_warm(tmp_path: Path) -> None:
    warming = start_simulator(tmp_path, "--warmup-s", "2")
    try:
        assert requests.get(warming.url + "/health", timeout=5).status_code == 503
        assert requests.get(warming.url + "/model_info", timeout=5).status_code == 200  # answers before warm-up ends
        time.sleep(2.2)
        assert requests.get(warming.url + "/health", timeout=5).status_code == 200
        assert requests.get(warming.url + "/health_generate", timeout=5).text == ""
    finally:
        warming.process.terminate()


def test_running_limit_queues_requests(tmp_path: Path, prompt: list[int]) -> None:
    """With one running slot, concurrent requests take about the sum of their decode times."""
    limited = start_simulator(tmp_path, "--decode-ms-per-token", "2", "--max-running", "1")
    try:
        import concurrent.futures

        body = {"input_ids": prompt, "sampling_params": {**SAMPLING, "max_new_tokens": 100, "ignore_eos": False}}
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda _: generate(limited, body).json(), range(4)))
        elapsed = time.monotonic() - started
        decode = sum(len(r["output_ids"]) for r in results) * 0.002
        assert elapsed >= decode * 0.9
    finally:
        limited.process.terminate()


def test_every_answer_is_recorded(simulator: Simulator, prompt: list[int]) -> None:
    body = generate(simulator, {"input_ids": prompt, "sampling_params": SAMPLING, "rid": "recorded-1"}).json()
    record = next(r for r in simulator.records() if r["rid"] == "recorded-1")
    assert record["output_ids"] == body["output_ids"] and record["input_ids"] == prompt


def test_heavy_tailed_answer_lengths_are_lognormal_reproducible_and_bounded(renderer: ChatRenderer) -> None:
    """`--length-median`: a thinking model's answers, a median and a long tail (a lognormal of sigma 1 has its 90th
    percentile 3.6x its median), each answer's length the same for the same prompt; the default draws each part
    uniformly, with no tail."""
    import statistics

    from regen.simulator.model import ModelBehaviour, SimulatedModel

    prompts = [renderer.render_ids([{"role": "user", "content": f"question {n}"}], None) for n in range(400)]
    tailed = SimulatedModel(renderer.profile, ModelBehaviour(min_tokens=8, max_tokens=3000, length_median=300))
    uniform = SimulatedModel(renderer.profile, ModelBehaviour(min_tokens=8, max_tokens=600))

    def lengths(model: SimulatedModel) -> list[int]:
        return sorted(len(model.answer(p).ids) for p in prompts)

    heavy, flat = lengths(tailed), lengths(uniform)
    assert 220 < statistics.median(heavy) < 400  # the median asked for (plus the reasoning end and EOS)
    assert heavy[359] / statistics.median(heavy) > 2.5 and heavy[-1] > 5 * statistics.median(heavy)
    assert flat[359] / statistics.median(flat) < 1.6
    assert heavy[-1] <= 2 * 3000 + 2 and heavy[0] >= 2 * 8
    assert [len(tailed.answer(p).ids) for p in prompts[:20]] == [len(tailed.answer(p).ids) for p in prompts[:20]]


def test_a_hinted_answer_length_is_the_one_its_last_user_turn_spells(renderer: ChatRenderer) -> None:
    """`--length-hint`: a benchmark's on-policy turn gets the length its own prompt asks for, whatever the earlier
    turns (and their hints) in the conversation; a prompt without one, the lognormal's."""
    from regen.simulator.model import ModelBehaviour, SimulatedModel

    model = SimulatedModel(renderer.profile, ModelBehaviour(min_tokens=8, max_tokens=3000, length_hint=True))
    first = [{"role": "user", "content": "Question one. [[answer 400 tokens]]"}]
    later = [
        *first,
        {"role": "assistant", "content": "An answer."},
        {"role": "user", "content": "[[answer 60 tokens]]"},
    ]
    for messages, length in ((first, 400), (later, 60)):
        ids = model.answer(renderer.render_ids(messages, None)).ids
        assert len(ids) == length + 2  # reasoning and answer, half each, then the reasoning's end and EOS
    plain = renderer.render_ids([{"role": "user", "content": "No hint."}], None)
    unhinted = SimulatedModel(renderer.profile, ModelBehaviour(min_tokens=8, max_tokens=3000))
    assert model.answer(plain).ids == unhinted.answer(plain).ids


def test_a_prompt_the_fleet_aborts_is_aborted_on_every_attempt_and_is_not_a_hanging_one() -> None:
    from regen.simulator.faults import FaultModel

    faults = FaultModel(hang_prompt_rate=0.3, abort_prompt_rate=0.3)
    prompts = [[i, i + 1, 7] for i in range(2000)]
    aborted = [p for p in prompts if faults.aborts(p)]
    assert 500 < len(aborted) < 700 and all(faults.aborts(list(p)) for p in aborted)  # the same on every attempt
    both = sum(faults.hangs(p) for p in aborted)
    assert 120 < both < 240  # drawn apart: about 0.3 of the aborted ones also hang, not all or none
    assert not any(FaultModel().aborts(p) for p in prompts)


def test_slots_admit_by_priority_then_arrival_and_a_request_gone_while_waiting_takes_none() -> None:
    """regen.simulator.slots, as SGLang's waiting queue (tests/e2e/test_simulator_matches_real_sglang.py compares it
    with the real server's): a cancelled waiter is skipped, and a slot handed to one cancelled in between goes on."""
    import asyncio

    from regen.simulator.slots import Slots

    async def scenario(by_priority: bool, low_values_first: bool, first_gone: str | None = None) -> list[str]:
        slots, admitted = Slots(1, by_priority, low_values_first), []
        holder = slots.slot(0)
        await holder.__aenter__()

        async def ask(name: str, priority: int | None) -> None:
            async with slots.slot(priority):
                admitted.append(name)

        tasks = {name: asyncio.create_task(ask(name, p)) for name, p in [("a", 1), ("b", 5), ("c", None), ("d", 5)]}
        gone = asyncio.create_task(ask("gone", 9))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.sleep(0)
        await holder.__aexit__(None, None, None)
        if first_gone:  # handed the slot, and gone before it ran
            tasks.pop(first_gone).cancel()
        await asyncio.wait_for(asyncio.gather(*tasks.values()), 10)  # a slot lost: they would wait for ever
        assert slots.free == 1
        return admitted

    assert asyncio.run(scenario(False, False)) == ["a", "b", "c", "d"]
    assert asyncio.run(scenario(True, False)) == ["b", "d", "a", "c"]
    assert asyncio.run(scenario(True, True)) == ["a", "b", "d", "c"]
    assert asyncio.run(scenario(True, False, first_gone="b")) == ["d", "a", "c"]
