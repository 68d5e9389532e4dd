"""The chat template renders every Kimi-K2.5 rule exactly: strings and ids."""

from __future__ import annotations

from typing import Any

import pytest

from regen.chat import ChatRenderer, ModelProfile, get_profile

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOLS_JSON = (
    '[{"type":"function","function":{"name":"get_weather","description":"Weather for a city",'
    '"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]'
)


def call(name: str, index: int, arguments: str) -> dict[str, Any]:
    return {"id": f"functions.{name}:{index}", "type": "function", "function": {"name": name, "arguments": arguments}}


GEN = "<|im_assistant|>assistant<|im_middle|><think>"
CASES = [
    pytest.param(
        [{"role": "user", "content": "Hi"}], None, "<|im_user|>user<|im_middle|>Hi<|im_end|>" + GEN, id="plain"
    ),
    pytest.param(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        None,
        "<|im_system|>system<|im_middle|>Be brief.<|im_end|><|im_user|>user<|im_middle|>Hi<|im_end|>" + GEN,
        id="system",
    ),
    pytest.param(
        [
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1", "reasoning_content": "old thoughts"},
            {"role": "user", "content": "Q2"},
        ],
        None,
        "<|im_user|>user<|im_middle|>Q1<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think></think>A1<|im_end|>"
        "<|im_user|>user<|im_middle|>Q2<|im_end|>" + GEN,
        id="history-reasoning-dropped",
    ),
    pytest.param(
        [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "need the tool",
                "tool_calls": [call("get_weather", 0, '{"city": "Paris"}')],
            },
            {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": '{"temp": 21}'},
        ],
        [WEATHER_TOOL],
        f"<|im_system|>tool_declare<|im_middle|>{TOOLS_JSON}<|im_end|>"
        "<|im_user|>user<|im_middle|>Weather in Paris?<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>need the tool</think>"
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>'
        '<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\n{"temp": 21}<|im_end|>' + GEN,
        id="tool-call-and-result-keep-current-reasoning",
    ),
    pytest.param(
        [
            {"role": "user", "content": "Paris and Oslo?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    call("get_weather", 0, '{"city": "Paris"}'),
                    call("get_weather", 1, '{"city": "Oslo"}'),
                ],
            },
            {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "21"},
            {"role": "tool", "tool_call_id": "functions.get_weather:1", "content": "3"},
            {"role": "assistant", "content": "Paris 21, Oslo 3.", "reasoning_content": "compare"},
            {"role": "user", "content": "Thanks"},
        ],
        [WEATHER_TOOL],
        f"<|im_system|>tool_declare<|im_middle|>{TOOLS_JSON}<|im_end|>"
        "<|im_user|>user<|im_middle|>Paris and Oslo?<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think></think><|tool_calls_section_begin|>"
        '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>'
        '<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{"city": "Oslo"}<|tool_call_end|>'
        "<|tool_calls_section_end|><|im_end|>"
        "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\n21<|im_end|>"
        "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:1\n3<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think></think>Paris 21, Oslo 3.<|im_end|>"
        "<|im_user|>user<|im_middle|>Thanks<|im_end|>" + GEN,
        id="parallel-calls-then-answer-all-history-reasoning-dropped",
    ),
    pytest.param(
        [{"role": "user", "content": [{"type": "text", "text": "part one, "}, {"type": "text", "text": "two"}]}],
        None,
        "<|im_user|>user<|im_middle|>part one, two<|im_end|>" + GEN,
        id="content-parts",
    ),
]


@pytest.mark.parametrize("messages,tools,expected", CASES)
def test_rendered_prompt_is_exact(
    renderer: ChatRenderer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, expected: str
) -> None:
    assert renderer.render_text(messages, tools) == expected
    ids = renderer.render_ids(messages, tools)
    assert ids == renderer.tokenizer.encode(expected, add_special_tokens=False)
    assert ids[-len(renderer.roles.generation_suffix) :] == list(renderer.roles.generation_suffix)
    assert ids[-1] == 163606  # thinking on: the prompt's last token is <think>


def test_plain_prompt_ids_are_literal(renderer: ChatRenderer) -> None:
    ids = renderer.render_ids([{"role": "user", "content": "Hi"}], None)
    user, assistant = (renderer.tokenizer.encode(w, add_special_tokens=False) for w in ("user", "assistant"))
    hi = renderer.tokenizer.encode("Hi", add_special_tokens=False)
    assert ids == [163587, *user, 163601, *hi, 163586, 163588, *assistant, 163601, 163606]


def test_thinking_off_ends_with_empty_think() -> None:
    profile = ModelProfile(
        **{
            **get_profile("kimi-k2.5-mini").__dict__,
            "name": "kimi-k2.5-mini-instant",
            "chat_template_kwargs": {"thinking": False},
            "generation_suffix": "<|im_assistant|>assistant<|im_middle|><think></think>",
        }
    )
    instant = ChatRenderer(profile)
    text = instant.render_text([{"role": "user", "content": "Hi"}], None)
    assert text.endswith("<|im_assistant|>assistant<|im_middle|><think></think>")
    ids = instant.render_ids([{"role": "user", "content": "Hi"}], None)
    assert ids[-2:] == [163606, 163607]
    assert tuple(ids[-len(instant.roles.generation_suffix) :]) == instant.roles.generation_suffix


def test_token_roles_resolve_to_kimi_ids(renderer: ChatRenderer) -> None:
    roles = renderer.roles
    assert roles.reasoning_end == 163607
    assert roles.eos_ids == {163586, 163585}
    assert roles.tool_calls_begin == 163595
    assert roles.generation_suffix[0] == 163588 and roles.generation_suffix[-1] == 163606


def test_unknown_profile_says_which_exist() -> None:
    with pytest.raises(ValueError, match=r"known profiles: kimi-k2\.5, kimi-k2\.5-mini"):
        get_profile("kimi-k3")
