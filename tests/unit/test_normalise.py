from __future__ import annotations

import pytest

from regen.datasets.normalise import Conversation, Rejection, normalise_row

KIMI_IDS = "functions.{name}:{index}"
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]


def test_final_assistant_turn_is_dropped_and_history_kept() -> None:
    row = {
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
            {"role": "assistant", "content": "reference"},
        ]
    }
    result = normalise_row(row, "openai_messages", KIMI_IDS)
    assert isinstance(result, Conversation)
    assert [m["content"] for m in result.messages] == ["a", "b", "c"]


def test_tool_call_ids_follow_the_profile_and_results_follow_them() -> None:
    row = {
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": "find x"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_abc", "type": "function", "function": {"name": "lookup", "arguments": {"q": "x"}}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_abc", "content": "found"},
        ],
    }
    result = normalise_row(row, "openai_messages", KIMI_IDS)
    assert isinstance(result, Conversation)
    assert result.messages[1]["tool_calls"][0]["id"] == "functions.lookup:0"
    assert result.messages[1]["tool_calls"][0]["function"]["arguments"] == '{"q": "x"}'
    assert result.messages[2]["tool_call_id"] == "functions.lookup:0"
    assert result.tools == TOOLS


def test_sample_id_is_stable_and_content_addressed() -> None:
    row = {"messages": [{"role": "user", "content": "same"}]}
    a = normalise_row(row, "openai_messages", KIMI_IDS)
    b = normalise_row(dict(reversed(list(row.items()))), "openai_messages", KIMI_IDS)
    c = normalise_row({"messages": [{"role": "user", "content": "other"}]}, "openai_messages", KIMI_IDS)
    assert isinstance(a, Conversation) and isinstance(b, Conversation) and isinstance(c, Conversation)
    assert a.sample_id == b.sample_id != c.sample_id
    assert len(a.sample_id) == 20


@pytest.mark.parametrize(
    "row,reason",
    [
        pytest.param([1, 2], "not_an_object", id="not-object"),
        pytest.param({"prompt": "x"}, "missing_messages", id="no-messages"),
        pytest.param({"messages": []}, "missing_messages", id="empty-messages"),
        pytest.param({"messages": [{"role": "wizard", "content": "x"}]}, "unknown_role", id="role"),
        pytest.param({"messages": [{"role": "assistant", "content": "x"}]}, "no_user_turn", id="no-user"),
        pytest.param({"messages": [{"role": "user", "content": ""}]}, "empty_content", id="empty"),
        pytest.param({"messages": [{"role": "user", "content": 5}]}, "bad_content", id="content-type"),
        pytest.param(
            {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "bad_tools", id="tools"
        ),
        pytest.param(
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}],
                    },
                    {"role": "tool", "content": "r"},
                ]
            },
            "bad_tool_call_arguments",
            id="arguments",
        ),
    ],
)
def test_bad_rows_are_rejected_with_a_reason(row: object, reason: str) -> None:
    result = normalise_row(row, "openai_messages", KIMI_IDS)
    assert isinstance(result, Rejection)
    assert result.reason == reason and result.detail


def test_input_output_rows_keep_metadata() -> None:
    result = normalise_row(
        {"id": "x1", "input": "write code", "output": "ref", "domain": "generic"}, "input_output", KIMI_IDS
    )
    assert isinstance(result, Conversation)
    assert result.messages == [{"role": "user", "content": "write code"}]
    assert result.meta == {"id": "x1", "domain": "generic"}
