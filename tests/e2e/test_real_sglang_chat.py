"""On-policy turns are read as production reads them: the same turn sent greedy to the real server's
/v1/chat/completions (its own kimi_k2 reasoning parser and tool-call detector) and, rendered by the project, to its
/generate; the project's reading of the ids the chat endpoint generated (regen.on_policy.assistant_message: content,
reasoning, tool calls and their ids) is the chat endpoint's assistant message (issue 40 item 4). Without tools both
paths send the same prompt ids and get the same answer; with tools see the note in the test."""

from __future__ import annotations

from typing import Any

import pytest
import requests

from regen.chat import ChatRenderer
from regen.on_policy import assistant_message
from regen.profiles import lookup
from tests.messages import assistant, call
from tests.real_sglang import GET_WEATHER
from tools.real_sglang import RealServer

pytestmark = pytest.mark.e2e
MAX_NEW_TOKENS = 96
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
TURNS = {
    "a call": ([SYSTEM, {"role": "user", "content": "What is the weather in Paris?"}], [GET_WEATHER]),
    "after a call and its result": (
        [
            SYSTEM,
            {"role": "user", "content": "What is the weather in Paris?"},
            assistant("", "I should look it up.", [call(0, '{"city": "Paris"}')]),
            {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "rain, 12 C"},
            {"role": "user", "content": "And tomorrow?"},
        ],
        [GET_WEATHER],
    ),
    "no tools": ([SYSTEM, {"role": "user", "content": "Say hello."}], []),
}


def chat_message(
    server: RealServer, renderer: ChatRenderer, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": server.served_name,
        "chat_template_kwargs": renderer.profile.chat_template_kwargs,
        "messages": messages,
        "temperature": 0.0,
        "max_tokens": MAX_NEW_TOKENS,
        "skip_special_tokens": False,
    }
    if tools:
        body["tools"] = tools
    response = requests.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    [choice] = response.json()["choices"]
    return choice["message"]


def generated_ids(server: RealServer, prompt_ids: list[int]) -> list[int]:
    sampling = {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0.0, "skip_special_tokens": False}
    response = requests.post(
        f"{server.url}/generate", json={"input_ids": prompt_ids, "sampling_params": sampling}, timeout=120
    )
    assert response.status_code == 200, response.text
    return response.json()["output_ids"]


@pytest.mark.parametrize("turn", list(TURNS))
def test_the_projects_reading_of_generate_is_the_chat_endpoints_message(turn: str, real_sglang: RealServer) -> None:
    messages, tools = TURNS[turn]
    renderer = ChatRenderer(lookup("kimi-k2.5-mini"))
    prompt_ids = renderer.render_ids(messages, tools or None)
    output_ids = generated_ids(real_sglang, prompt_ids)
    theirs = chat_message(real_sglang, renderer, messages, tools)

    # The server's log holds what the chat endpoint tokenized and what it generated: read those very ids.
    chat_request = real_sglang.finished()[-1]
    if not tools:  # the same prompt, so the same greedy answer, by either path
        assert chat_request["input_ids"] == prompt_ids and chat_request["output_ids"] == output_ids
    # With tools they differ: the tiny model's folder holds the mini fast tokenizer, without Kimi-K2.5's remote code
    # that writes the TypeScript tool declarations, so this server's chat layer renders tools as JSON (production
    # serves Kimi-K2.5 with --trust-remote-code). The reading is compared on the chat endpoint's own ids.
    roles, tail = renderer.roles, list(renderer.roles.generation_suffix)
    read = chat_request["output_ids"]
    ours = assistant_message(read, tail, roles, renderer.profile, renderer.decode, messages, tools)
    assert isinstance(ours, dict), ours  # a turn validation keeps: history to build on
    calls = [{"id": c["id"], "function": c["function"]} for c in ours.get("tool_calls") or []]
    assert [{"id": c["id"], "function": c["function"]} for c in theirs.get("tool_calls") or []] == calls
    assert (theirs["content"] or "") == (ours["content"] or "")
    assert theirs.get("reasoning_content") == ours.get("reasoning_content")
    assert bool(calls) == bool(tools)  # the model calls get_weather exactly when it is declared
