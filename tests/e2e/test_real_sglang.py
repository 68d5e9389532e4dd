"""The real SGLang 0.5.23 server on CPU (tests/real_sglang.py), answering the project's own client: its greedy answers
are in the target's format, the validator keeps them (a tool call when `get_weather` is declared, content otherwise),
and what the client got is what the server's own request log says it sent."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests

from regen.chat import ChatRenderer
from regen.config import Sampling
from regen.judge import declared_tools, judge
from regen.profiles import lookup
from regen.reasons import OK
from regen.records import RawAnswer, text_digest
from regen.sglang.client import Generation, SGLangClient
from regen.sglang.fleet import EndpointPool
from regen.sglang.parity import PROVEN_SGLANG_VERSION
from regen.sglang.server_check import ServerMismatch, check_fleet
from tests.real_sglang import CURRENCY, GET_WEATHER
from tools.real_sglang import RealServer, model_dir, real_server

pytestmark = pytest.mark.e2e
GREEDY = Sampling(temperature=0.0, max_new_tokens=96).as_params()
CASES = {
    "no tools": None,
    "get_weather declared": [GET_WEATHER],
    "another tool declared": [CURRENCY],
}


def _messages(question: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": question}]


async def _generate(url: str, prompts: dict[str, list[int]]) -> dict[str, Generation]:
    async with aiohttp.ClientSession() as session:
        client = SGLangClient(EndpointPool([url], session), session, request_timeout_s=120, max_attempts=1)
        answers = await asyncio.gather(*(client.generate(ids, GREEDY, name) for name, ids in prompts.items()))
    return dict(zip(prompts, answers, strict=True))


def _judged(renderer: ChatRenderer, prompt: list[int], generation: Generation, tools: Any) -> Any:
    answer = RawAnswer("x", generation.output_ids, generation.meta_info, *text_digest(generation.text))
    names = declared_tools(json.dumps(tools)) if tools else None
    return judge(prompt, answer, renderer.roles, names, renderer.decode, lambda: tools or [])


@pytest.mark.parametrize("profile", ["kimi-k2.5-mini", "qwen3.6"])
def test_the_real_servers_answers_are_kept_and_are_what_its_log_says(
    profile: str, request: pytest.FixtureRequest
) -> None:
    server: RealServer = request.getfixturevalue("real_sglang" if profile == "kimi-k2.5-mini" else "real_sglang_qwen")
    renderer = ChatRenderer(lookup(profile) if profile == "kimi-k2.5-mini" else _qwen_profile())
    questions = {f"{case} {i}": (tools, f"Question {i}: what is the weather in Paris?") for case, tools in CASES.items()
                 for i in range(2)}  # fmt: skip
    prompts = {name: renderer.render_ids(_messages(q), tools) for name, (tools, q) in questions.items()}
    got = _generate_sync(server.url, prompts)
    logged = {r["rid"]: r for r in server.finished()}
    for name, generation in got.items():
        tools = questions[name][0]
        verdict = _judged(renderer, prompts[name], generation, tools)
        assert verdict.verdict == OK, (name, verdict, renderer.decode(generation.output_ids))
        calls_expected = 1 if tools == [GET_WEATHER] else 0
        assert verdict.tool_calls == calls_expected and 0 < verdict.reasoning_len < len(generation.output_ids)
        assert generation.finish_reason["type"] == "stop"
        record = logged[generation.rid]  # the server's own log, read independently of the client
        assert record["input_ids"] == prompts[name]
        assert record["output_ids"] == generation.output_ids
        assert record["meta_info"]["finish_reason"] == generation.finish_reason


def _generate_sync(url: str, prompts: dict[str, list[int]]) -> dict[str, Generation]:
    return asyncio.run(_generate(url, prompts))


def _qwen_profile() -> Any:
    from regen.config import load_config

    return load_config().profiles["qwen3.6"]


def test_a_priority_reaches_the_real_server_which_without_priority_scheduling_answers_as_ever(
    real_sglang: RealServer,
) -> None:
    """`defaults.priority` on a fleet launched without --enable-priority-scheduling (docs/scaling.md): the request
    carries it, and the server ignores it (it aborts such a request only with --abort-on-priority-when-disabled)."""
    prompt = ChatRenderer(lookup("kimi-k2.5-mini")).render_ids(_messages("Question 7: weather in Oslo?"), None)

    async def ask(priority: int | None) -> Generation:
        async with aiohttp.ClientSession() as session:
            pool = EndpointPool([real_sglang.url], session)
            client = SGLangClient(pool, session, request_timeout_s=120, max_attempts=1, priority=priority)
            return await client.generate(prompt, GREEDY, f"priority-{priority}")

    with_priority, without = asyncio.run(ask(-5)), asyncio.run(ask(None))
    assert with_priority.output_ids == without.output_ids and with_priority.finish_reason["type"] == "stop"
    logged = [line for line in real_sglang.log.read_text().splitlines() if f"rid='{with_priority.rid}'" in line]
    assert logged and all("priority=-5" in line for line in logged), logged  # the request as the server read it


def test_check_server_passes_on_the_real_server_launched_as_production_launches_it(real_sglang: RealServer) -> None:
    """`--model-path <a folder> --served-model-name kimi-k2.5-mini`: judged by model_path, this failed ("serves
    '<the folder>', but profile 'kimi-k2.5-mini' expects one of ['kimi-k2.5-mini']")."""
    renderer = ChatRenderer(lookup("kimi-k2.5-mini"))
    [info] = check_fleet([real_sglang.url], renderer, Sampling(temperature=0.0).as_params(), deadline_s=60)
    assert info["model_path"] == str(real_sglang.model) and not info["model_path"].endswith("kimi-k2.5-mini")
    assert info["served_model_name"] == "kimi-k2.5-mini" and info["version"] == PROVEN_SGLANG_VERSION
    assert info["vocab_size"] == 163_840 and info["context_length"] == 16384
    assert info["seeds_honoured"] is False  # torch_native cannot run --enable-deterministic-inference
    assert info["probe_finish_reason"]["type"] == "stop" and info["probe_output_tokens"] > 0


def test_a_real_server_with_a_smaller_vocabulary_fails_check_server_and_stays_alive(tmp_path: Path) -> None:
    """Its model (Qwen's vocabulary of 151,936 ids) is smaller than the profile's Kimi tokenizer (163,840): the
    probe's ids (<|im_end|> is 163,586) would kill SGLang 0.5.23. The run fails at check_server, before any prompt."""
    folder = tmp_path / "smaller-model"
    folder.mkdir()
    for file in model_dir("kimi-k2.5-mini").iterdir():
        if file.suffix != ".safetensors":
            shutil.copy(file, folder / file.name)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 151_936}))
    renderer = ChatRenderer(lookup("kimi-k2.5-mini"))
    with real_server(tmp_path / "server.log", model=folder, extra_args=("--load-format", "dummy")) as small:
        with pytest.raises(ServerMismatch, match=r"vocabulary of 151936 ids, but profile 'kimi-k2.5-mini'.*163840"):
            check_fleet([small.url], renderer, Sampling(temperature=0.0).as_params(), deadline_s=60)
        assert small.alive() and requests.get(f"{small.url}/health_generate", timeout=30).status_code == 200
        assert small.finished() == []  # no prompt reached it
