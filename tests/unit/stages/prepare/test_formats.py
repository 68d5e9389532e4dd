from __future__ import annotations

import json
from typing import Any

import pytest

from regen.stages.prepare.formats import detect_format, glaive_tools, normalize_row, parse_calls
from regen.stages.prepare.normalize import Conversation, Rejection

KIMI_IDS = "functions.{name}:{index}"

BMI = {
    "name": "calculate_bmi",
    "description": "Calculate the Body Mass Index (BMI)",
    "parameters": {
        "type": "object",
        "properties": {
            "weight": {"type": "number", "description": "The weight in kilograms"},
            "height": {"type": "number", "description": "The height in meters"},
        },
        "required": ["weight", "height"],
    },
}
NEWS = {
    "name": "get_news",
    "description": "Get the latest news headlines",
    "parameters": {"type": "object", "properties": {"country": {"type": "string"}}, "required": ["country"]},
}
GLAIVE_PREAMBLE = "SYSTEM: You are a helpful assistant with access to the following functions. Use them if required -"
GLAIVE_SYSTEM = f"{GLAIVE_PREAMBLE}\n{json.dumps(BMI, indent=4)}\n\n{json.dumps(NEWS, indent=4)}\n"
GLAIVE_CHAT = (
    "USER: Hi, I need to calculate my BMI. I weigh 70 kilograms and my height is 1.75 meters.\n\n\n"
    'ASSISTANT: <functioncall> {"name": "calculate_bmi", "arguments": \'{"weight": 70, "height": 1.75}\'} '
    "<|endoftext|>\n\n\n"
    'FUNCTION RESPONSE: {"bmi": 22.86}\n\n\n'
    "ASSISTANT: Your Body Mass Index (BMI) is 22.86. This is considered a healthy weight. <|endoftext|>\n\n\n"
    "USER: Great, thanks!\n\n\n"
    "ASSISTANT: You're welcome! <|endoftext|>\n"
)
GLAIVE_ROW = {"system": GLAIVE_SYSTEM, "chat": GLAIVE_CHAT}
OCI_ROW = {
    "id": "0c1a2b",
    "input": "Write a Python function that returns the n-th Fibonacci number.",
    "output": "def fib(n): ...",
    "domain": "generic",
    "generation_algorithm": "self-instruct",
    "llm_judgement": '{"requirement_conformance": {"score": "5"}}',
    "unit_tests": '["assert fib(0) == 0"]',
    "tests_execution_status": '["pass"]',
    "average_test_score": "1",
}
OPENAI_ROW = {
    "messages": [
        {"role": "system", "content": "Use tools when useful."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "I should call the weather tool.",
            "tool_calls": [
                {"id": "call_9", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_9", "content": '{"temp_c": 21}'},
        {"role": "assistant", "content": "It is 21 °C in Paris."},
    ],
    "tools": [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}],
}
SHAREGPT_ROW = {
    "id": "sg-1",
    "conversations": [
        {"from": "system", "value": "Be brief."},
        {"from": "human", "value": "What is 2+2?"},
        {"from": "gpt", "value": "4"},
        {"from": "human", "value": "And 3+3?"},
        {"from": "gpt", "value": "6"},
    ],
}
SHAREGPT_TOOLS_ROW = {
    "conversations": [
        {"from": "human", "value": "News for France please"},
        {"from": "function_call", "value": '{"name": "get_news", "arguments": {"country": "France"}}'},
        {"from": "observation", "value": '{"headlines": ["a", "b"]}'},
        {"from": "gpt", "value": "Here are the headlines: a, b."},
    ],
    "tools": json.dumps([NEWS]),
}
ALPACA_ROW = {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"}


def only(result: list[Conversation] | Rejection) -> Conversation:
    assert isinstance(result, list) and len(result) == 1, result
    return result[0]


def test_glaive_row_becomes_messages_tools_and_tool_calls() -> None:
    conversation = only(normalize_row(GLAIVE_ROW, "glaive", KIMI_IDS))
    assert conversation.tools == [{"type": "function", "function": BMI}, {"type": "function", "function": NEWS}]
    assert conversation.messages == [
        {
            "role": "system",
            "content": "You are a helpful assistant with access to the following functions. Use them if required",
        },
        {
            "role": "user",
            "content": "Hi, I need to calculate my BMI. I weigh 70 kilograms and my height is 1.75 meters.",
        },
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "functions.calculate_bmi:0",
                    "type": "function",
                    "function": {"name": "calculate_bmi", "arguments": '{"weight": 70, "height": 1.75}'},
                }
            ],
        },
        {  # Glaive's FUNCTION RESPONSE has no name: it stays without one (production renders it `tool`)
            "role": "tool",
            "content": '{"bmi": 22.86}',
            "tool_call_id": "functions.calculate_bmi:0",
        },
        {
            "role": "assistant",
            "content": "Your Body Mass Index (BMI) is 22.86. This is considered a healthy weight.",
        },
        {"role": "user", "content": "Great, thanks!"},
    ]


def test_glaive_row_without_functions() -> None:
    row = {
        "system": "SYSTEM: You are a helpful assistant, with no access to external functions.",
        "chat": "USER: Tell me a joke.\n\n\nASSISTANT: Why did the chicken cross the road? <|endoftext|>\n",
    }
    conversation = only(normalize_row(row, "auto", KIMI_IDS))
    assert conversation.tools == []
    assert conversation.messages == [
        {"role": "system", "content": "You are a helpful assistant, with no access to external functions."},
        {"role": "user", "content": "Tell me a joke."},
    ]


def test_glaive_tools_parse_pretty_printed_definitions() -> None:
    assert glaive_tools(GLAIVE_SYSTEM) == (
        "You are a helpful assistant with access to the following functions. Use them if required",
        [{"type": "function", "function": BMI}, {"type": "function", "function": NEWS}],
    )
    assert glaive_tools(f"{GLAIVE_PREAMBLE} {json.dumps(NEWS)}")[1] == [{"type": "function", "function": NEWS}]


@pytest.mark.parametrize(
    "text,expected",
    [
        pytest.param(
            '{"name": "get_news", "arguments": \'{"country": "France"}\'}',
            [{"type": "function", "function": {"name": "get_news", "arguments": '{"country": "France"}'}}],
            id="glaive-single-quoted",
        ),
        pytest.param(
            '{"name": "get_news", "arguments": {"country": "France"}}',
            [{"type": "function", "function": {"name": "get_news", "arguments": {"country": "France"}}}],
            id="json-object",
        ),
        pytest.param(
            '[{"name": "a", "arguments": "{}"}, {"name": "b"}]',
            [
                {"type": "function", "function": {"name": "a", "arguments": "{}"}},
                {"type": "function", "function": {"name": "b", "arguments": {}}},
            ],
            id="json-list",
        ),
    ],
)
def test_function_calls_written_as_text(text: str, expected: list[dict[str, Any]]) -> None:
    assert parse_calls(text) == expected


def test_opencodeinstruct_row_keeps_metadata_without_the_reference_answer() -> None:
    conversation = only(normalize_row(OCI_ROW, "auto", KIMI_IDS))
    assert conversation.messages == [{"role": "user", "content": OCI_ROW["input"]}]
    assert conversation.meta == {k: v for k, v in OCI_ROW.items() if k not in ("input", "output")}


def test_openai_row_keeps_reasoning_and_renames_tool_call_ids() -> None:
    conversation = only(normalize_row(OPENAI_ROW, "auto", KIMI_IDS))
    assert [m["role"] for m in conversation.messages] == ["system", "user", "assistant", "tool"]
    assert conversation.messages[2]["reasoning_content"] == "I should call the weather tool."
    assert conversation.messages[2]["tool_calls"][0]["id"] == "functions.weather:0"
    assert conversation.messages[3]["tool_call_id"] == "functions.weather:0"
    assert "name" not in conversation.messages[3]  # none given: production renders the header `tool`
    named = only(normalize_row(OPENAI_ROW, "auto", KIMI_IDS, "final", "from_call"))
    assert named.messages[3]["name"] == "weather"  # from_call: the answered call's function


def test_sharegpt_row_keeps_history_and_drops_the_final_answer() -> None:
    conversation = only(normalize_row(SHAREGPT_ROW, "auto", KIMI_IDS))
    assert conversation.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ]
    assert conversation.meta == {"id": "sg-1"}


# The one call both the ShareGPT and the legacy OpenAI rows below make, as OpenAI's messages carry it.
NEWS_CALL = {
    "id": "functions.get_news:0",
    "type": "function",
    "function": {"name": "get_news", "arguments": '{"country": "France"}'},
}


def test_sharegpt_function_calls_and_observations_become_tool_turns() -> None:
    conversation = only(normalize_row(SHAREGPT_TOOLS_ROW, "sharegpt", KIMI_IDS))
    assert conversation.tools == [{"type": "function", "function": NEWS}]  # a bare schema, wrapped
    assert conversation.messages[1:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [NEWS_CALL],
        },
        {  # an observation has no name: it stays without one
            "role": "tool",
            "content": '{"headlines": ["a", "b"]}',
            "tool_call_id": "functions.get_news:0",
        },
    ]


def test_sharegpt_turns_keep_their_names() -> None:
    row = {
        "conversations": [
            {"from": "human", "name": "alice", "value": "News for France please"},
            {"from": "function_call", "value": '{"name": "get_news", "arguments": {"country": "France"}}'},
            {"from": "observation", "name": "news_api", "value": "[]"},
            {"from": "human", "name": "", "value": "Thanks"},
        ],
    }
    messages = only(normalize_row(row, "sharegpt", KIMI_IDS)).messages
    assert [(m["role"], m.get("name")) for m in messages] == [
        ("user", "alice"),
        ("assistant", None),
        ("tool", "news_api"),  # the dataset's own name wins over the call's function
        ("user", None),  # an empty name is no name
    ]


def test_legacy_openai_function_call_rows_become_a_tool_call_and_its_named_result() -> None:
    row = {
        "messages": [
            {"role": "user", "content": "News for France please"},
            {
                "role": "assistant",
                "content": None,
                "function_call": {"name": "get_news", "arguments": '{"country": "France"}'},
            },
            {"role": "function", "name": "get_news", "content": '{"headlines": ["a"]}'},
            {"role": "assistant", "content": "Headline: a."},
        ],
        "functions": [NEWS],
    }
    conversation = only(normalize_row(row, "auto", KIMI_IDS))
    assert conversation.tools == [{"type": "function", "function": NEWS}]  # `functions`: bare schemas, wrapped
    assert conversation.meta == {}
    assert conversation.messages == [
        {"role": "user", "content": "News for France please"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [NEWS_CALL],
        },
        {
            "role": "tool",
            "name": "get_news",
            "content": '{"headlines": ["a"]}',
            "tool_call_id": "functions.get_news:0",
        },
    ]


@pytest.mark.parametrize(
    "row,content",
    [
        pytest.param(ALPACA_ROW, "Translate to French.\n\nGood morning", id="alpaca-with-input"),
        pytest.param(
            {"instruction": "Name three colours.", "input": "", "output": "red"},
            "Name three colours.",
            id="alpaca-no-input",
        ),
        pytest.param({"prompt": "Explain recursion.", "source": "x"}, "Explain recursion.", id="prompt"),
    ],
)
def test_single_turn_formats(row: dict[str, Any], content: str) -> None:
    conversation = only(normalize_row(row, "auto", KIMI_IDS))
    assert conversation.messages == [{"role": "user", "content": content}]
    assert "output" not in conversation.meta


@pytest.mark.parametrize(
    "row,expected",
    [
        pytest.param(OPENAI_ROW, "openai_messages", id="messages"),
        pytest.param({"messages": SHAREGPT_ROW["conversations"]}, "sharegpt", id="messages-from-value"),
        pytest.param(SHAREGPT_ROW, "sharegpt", id="conversations"),
        pytest.param(GLAIVE_ROW, "glaive", id="glaive"),
        pytest.param(ALPACA_ROW, "alpaca", id="alpaca"),
        pytest.param(OCI_ROW, "input_output", id="opencodeinstruct"),
        pytest.param({"prompt": "x"}, "prompt", id="prompt"),
        pytest.param({"text": "x"}, None, id="unknown"),
    ],
)
def test_formats_are_detected_from_the_fields(row: dict[str, Any], expected: str | None) -> None:
    assert detect_format(row) == expected


BROKEN_GLAIVE_CALL = GLAIVE_CHAT.replace('\'{"weight": 70, "height": 1.75}\'', "'{weight: 70}'")


@pytest.mark.parametrize(
    "row,source_format,reason",
    [
        pytest.param({"text": "x"}, "auto", "unknown_format", id="auto-unknown"),
        pytest.param({"system": GLAIVE_SYSTEM}, "glaive", "missing_messages", id="glaive-no-chat"),
        pytest.param({"chat": "hello there"}, "glaive", "bad_messages", id="glaive-no-markers"),
        pytest.param(
            {"system": GLAIVE_SYSTEM[:-40], "chat": GLAIVE_CHAT}, "glaive", "bad_tools", id="glaive-truncated-functions"
        ),
        pytest.param(
            {"system": GLAIVE_SYSTEM, "chat": BROKEN_GLAIVE_CALL},
            "glaive",
            "history_tool_call_arguments",
            id="glaive-arguments",
        ),
        pytest.param(
            {"chat": "USER: hi\n\nASSISTANT: <functioncall> get_news(France) <|endoftext|>"},
            "glaive",
            "history_tool_call",
            id="glaive-call",
        ),
        pytest.param(
            {"chat": "USER: hi\n\nFUNCTION RESPONSE: {}"}, "glaive", "bad_message", id="glaive-orphan-response"
        ),
        pytest.param({"chat": "ASSISTANT: Hello! <|endoftext|>"}, "glaive", "no_user_turn", id="glaive-no-user"),
        pytest.param({"conversations": []}, "sharegpt", "missing_messages", id="sharegpt-empty"),
        pytest.param({"conversations": "[{"}, "sharegpt", "bad_messages", id="sharegpt-not-json"),
        pytest.param(
            {"conversations": [{"from": "bot", "value": "x"}]}, "sharegpt", "unknown_role", id="sharegpt-role"
        ),
        pytest.param(
            {"conversations": [{"from": "human", "value": "  "}]}, "sharegpt", "empty_content", id="sharegpt-empty-turn"
        ),
        pytest.param(
            {"conversations": [{"from": "human", "value": 3}]}, "sharegpt", "bad_content", id="sharegpt-content"
        ),
        pytest.param(
            {"conversations": [{"from": "human", "value": "x"}, {"from": "function_call", "value": "call it"}]},
            "sharegpt",
            "history_tool_call",
            id="sharegpt-call",
        ),
        pytest.param({**SHAREGPT_ROW, "tools": "[{"}, "sharegpt", "bad_tools", id="sharegpt-tools"),
        pytest.param({"input": ""}, "input_output", "empty_content", id="oci-empty"),
        pytest.param({"input": ["a"]}, "input_output", "empty_content", id="oci-not-text"),
        pytest.param({"instruction": None, "input": "x"}, "alpaca", "empty_content", id="alpaca-no-instruction"),
        pytest.param({"instruction": "x", "input": 5}, "alpaca", "bad_content", id="alpaca-input"),
        pytest.param({"prompt": ""}, "prompt", "empty_content", id="prompt-empty"),
        pytest.param({"prompt": [{"role": "oracle", "content": "x"}]}, "prompt", "unknown_role", id="prompt-messages"),
    ],
)
def test_broken_rows_of_every_format_are_rejected_with_a_reason(
    row: dict[str, Any], source_format: str, reason: str
) -> None:
    result = normalize_row(row, source_format, KIMI_IDS)
    assert isinstance(result, Rejection)
    assert result.reason == reason and result.detail


def test_an_explicit_format_overrides_detection() -> None:
    row = {"prompt": "from the prompt column", "input": "from the input column"}
    assert only(normalize_row(row, "auto", KIMI_IDS)).messages[0]["content"] == "from the input column"
    assert only(normalize_row(row, "prompt", KIMI_IDS)).messages[0]["content"] == "from the prompt column"
