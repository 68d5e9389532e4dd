from __future__ import annotations

from typing import Any

import pytest

from regen.reasons import Reason
from regen.stages.prepare.formats import normalize_row
from regen.stages.prepare.normalize import Conversation, RawChat, Rejection, check_tools, normalize_chat, select_prompts

KIMI_IDS = "functions.{name}:{index}"
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]


def prompts(row: Any, turns: str = "final") -> list[Conversation]:
    result = normalize_row(row, "openai_messages", KIMI_IDS, turns)  # type: ignore[arg-type]
    assert isinstance(result, list), result
    return result


def test_final_assistant_turn_is_dropped_and_history_kept() -> None:
    row = {
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
            {"role": "assistant", "content": "reference"},
        ]
    }
    [prompt] = prompts(row)
    assert [m["content"] for m in prompt.messages] == ["a", "b", "c"]


def test_every_assistant_turn_gives_one_prompt_per_turn() -> None:
    row = {
        "tools": TOOLS,
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "assistant", "content": "greeting before any user turn: not a prompt"},
            {"role": "user", "content": "find x"},
            {"role": "assistant", "tool_calls": [{"function": {"name": "lookup", "arguments": "{}"}}]},
            {"role": "tool", "content": "found"},
            {"role": "assistant", "content": "x is here"},
            {"role": "user", "content": "thanks"},
            {"role": "assistant", "content": "welcome"},
        ],
    }
    cut = prompts(row, "every_assistant_turn")
    assert [[m["role"] for m in p.messages] for p in cut] == [
        ["system", "assistant", "user"],
        ["system", "assistant", "user", "assistant", "tool"],
        ["system", "assistant", "user", "assistant", "tool", "assistant", "user"],
    ]
    assert len({p.sample_id for p in cut}) == 3
    assert cut[-1].messages == prompts(row)[0].messages  # the last turn is the `final` prompt


def test_a_conversation_waiting_for_the_assistant_is_a_prompt_as_it_is() -> None:
    row = {
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ]
    }
    assert [len(p.messages) for p in prompts(row, "every_assistant_turn")] == [1, 3]
    assert [len(p.messages) for p in prompts(row)] == [3]


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
    [prompt] = prompts(row)
    assert prompt.messages[1]["tool_calls"][0]["id"] == "functions.lookup:0"
    assert prompt.messages[1]["tool_calls"][0]["function"]["arguments"] == '{"q": "x"}'
    assert prompt.messages[2] == {"role": "tool", "content": "found", "tool_call_id": "functions.lookup:0"}
    assert prompt.tools == TOOLS


def test_results_without_ids_answer_parallel_calls_in_order() -> None:
    calls = [{"function": {"name": "lookup", "arguments": "{}"}}, {"function": {"name": "lookup", "arguments": "{}"}}]
    raw = RawChat(
        [
            {"role": "user", "content": "two lookups"},
            {"role": "assistant", "tool_calls": calls},
            {"role": "tool", "content": "first"},
            {"role": "tool", "content": "second"},
        ],
        TOOLS,
        {},
    )
    conversation = normalize_chat(raw, KIMI_IDS)
    assert isinstance(conversation, Conversation)
    assert [m.get("tool_call_id") for m in conversation.messages[2:]] == ["functions.lookup:0", "functions.lookup:1"]


def test_results_keep_the_name_they_are_given_and_from_call_names_the_rest() -> None:
    """Production renders a result without a name as `tool` (OpenAI-SDK clients send none): as_given, the default,
    leaves it so; from_call names it after the function of the call it answers, for clients that send names."""
    calls = [
        {"id": "a", "function": {"name": "lookup", "arguments": "{}"}},
        {"id": "b", "function": {"name": "weather", "arguments": "{}"}},
    ]
    raw = RawChat(
        [
            {"role": "user", "content": "two tools"},
            {"role": "assistant", "tool_calls": calls},
            {"role": "tool", "tool_call_id": "b", "content": "sunny"},  # answers by id, out of order
            {"role": "tool", "content": "found"},  # no id: the oldest unanswered call, "a"
            {"role": "tool", "tool_call_id": "zzz", "content": "?"},  # an id no call has: no name to give
            {"role": "tool", "name": "given", "content": "named"},  # a name given is kept either way
        ],
        TOOLS,
        {},
    )
    as_given = normalize_chat(raw, KIMI_IDS)
    assert isinstance(as_given, Conversation)
    assert [m.get("name") for m in as_given.messages[2:]] == [None, None, None, "given"]
    conversation = normalize_chat(raw, KIMI_IDS, "from_call")
    assert isinstance(conversation, Conversation)
    assert [(m["tool_call_id"], m.get("name")) for m in conversation.messages[2:-1]] == [
        ("functions.weather:1", "weather"),
        ("functions.lookup:0", "lookup"),
        ("zzz", None),
    ]


def test_names_a_dataset_gives_are_kept_for_every_role() -> None:
    raw = RawChat(
        [
            {"role": "developer", "name": "policy", "content": "rules"},
            {"role": "user", "name": "alice", "content": "find x"},
            {"role": "assistant", "name": "kimi", "tool_calls": [{"function": {"name": "lookup", "arguments": "{}"}}]},
            {"role": "tool", "name": "lookup_v2", "content": "found"},  # the dataset's name wins over the call's
            {"role": "user", "name": "", "content": "thanks"},  # empty: no name
            {"role": "user", "name": 7, "content": "bye"},  # not text: no name
        ],
        TOOLS,
        {},
    )
    conversation = normalize_chat(raw, KIMI_IDS)
    assert isinstance(conversation, Conversation)
    assert [(m["role"], m.get("name")) for m in conversation.messages] == [
        ("developer", "policy"),
        ("user", "alice"),
        ("assistant", "kimi"),
        ("tool", "lookup_v2"),
        ("user", None),
        ("user", None),
    ]


def test_legacy_function_call_and_function_result_become_a_tool_call_and_tool_result() -> None:
    raw = RawChat(
        [
            {"role": "user", "content": "find x"},
            {"role": "assistant", "content": None, "function_call": {"name": "lookup", "arguments": {"q": "x"}}},
            {"role": "function", "name": "lookup", "content": "found"},
        ],
        TOOLS,
        {},
    )
    conversation = normalize_chat(raw, KIMI_IDS)
    assert isinstance(conversation, Conversation)
    assert conversation.messages[1:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "functions.lookup:0",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"q": "x"}'},
                }
            ],
        },
        {"role": "tool", "name": "lookup", "content": "found", "tool_call_id": "functions.lookup:0"},
    ]


def test_names_are_part_of_the_sample_id() -> None:
    [named] = prompts({"messages": [{"role": "user", "name": "alice", "content": "same"}]})
    [anonymous] = prompts({"messages": [{"role": "user", "content": "same"}]})
    assert named.sample_id != anonymous.sample_id


def test_sample_id_is_stable_and_content_addressed() -> None:
    row = {"messages": [{"role": "user", "content": "same"}]}
    [a] = prompts(row)
    [b] = prompts(dict(reversed(list(row.items()))))
    [c] = prompts({"messages": [{"role": "user", "content": "other"}]})
    [d] = prompts({**row, "source": "another file"})  # metadata is not content
    assert a.sample_id == b.sample_id == d.sample_id != c.sample_id
    assert len(a.sample_id) == 20


def test_tools_from_arrow_lose_the_nulls_arrow_filled_in() -> None:
    arrow_tool = {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": None,
            "parameters": {"type": "object", "properties": {"q": {"type": "string", "enum": None}, "n": None}},
        },
    }
    assert check_tools([arrow_tool]) == [
        {
            "type": "function",
            "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}},
        }
    ]


def test_the_developer_role_stays_developer_as_sglang_keeps_it() -> None:
    [prompt] = prompts({"messages": [{"role": "developer", "content": "rules"}, {"role": "user", "content": "hi"}]})
    assert prompt.messages[0] == {"role": "developer", "content": "rules"}


def test_empty_reasoning_is_kept_as_sglang_dumps_it() -> None:
    """Qwen3.6's template reads reasoning out of the content only when `reasoning_content` is not a string, so "" and
    absent render differently: production keeps "" (found by the differential test, content `</think>`)."""
    row = {
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "</think>", "reasoning_content": ""},
            {"role": "assistant", "content": "b", "reasoning_content": None},
            {"role": "user", "content": "c"},
        ]
    }
    [prompt] = prompts(row)
    assert prompt.messages[1] == {"role": "assistant", "content": "</think>", "reasoning_content": ""}
    assert prompt.messages[2] == {"role": "assistant", "content": "b"}


def test_select_prompts_rejects_conversations_with_nothing_to_answer() -> None:
    conversation = Conversation(messages=[{"role": "assistant", "content": "x"}], tools=[])
    assert select_prompts(conversation, "every_assistant_turn") == Rejection(
        Reason.NO_USER_TURN, "no user message before the regenerated turn"
    )


@pytest.mark.parametrize(
    "row,reason",
    [
        pytest.param([1, 2], "not_an_object", id="not-object"),
        pytest.param({"prompt": "x"}, "missing_messages", id="no-messages"),
        pytest.param({"messages": []}, "missing_messages", id="empty-messages"),
        pytest.param({"messages": "[{"}, "bad_messages", id="messages-not-json"),
        pytest.param({"messages": [{"role": "wizard", "content": "x"}]}, "unknown_role", id="role"),
        pytest.param({"messages": ["hello"]}, "bad_message", id="message-not-object"),
        pytest.param({"messages": [{"role": "assistant", "content": "x"}]}, "no_user_turn", id="no-user"),
        pytest.param({"messages": [{"role": "user", "content": ""}]}, "empty_content", id="empty"),
        pytest.param({"messages": [{"role": "user", "content": 5}]}, "bad_content", id="content-type"),
        pytest.param(  # SGLang types it Optional[str] and answers 400
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": "y", "reasoning_content": 1},
                ]
            },
            "bad_message",
            id="reasoning-not-text",
        ),
        pytest.param({"messages": [{"role": "user", "content": "bad \ud800 text"}]}, "invalid_utf8", id="surrogate"),
        pytest.param(
            {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "bad_tools", id="tools"
        ),
        pytest.param(
            {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "retrieval"}]},
            "bad_tools",
            id="tools-not-functions",
        ),
        pytest.param(
            {"messages": [{"role": "user", "content": "x"}], "tools": {"name": "f"}}, "bad_tools", id="tools-not-list"
        ),
        pytest.param(
            {
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"function": {"name": "f", "parameters": {"default": b"\x00"}}}],  # Arrow binary
            },
            "bad_tools",
            id="tools-not-json",
        ),
        pytest.param(
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": "{}"}}]},
                ]
            },
            "history_tool_call",
            id="call-without-name",
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
            "history_tool_call_arguments",
            id="arguments",
        ),
        pytest.param(
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]},
                ]
            },
            "history_tool_call_arguments",
            id="arguments-not-object",
        ),
        pytest.param(  # json.loads reads NaN; SGLang's orjson refuses it, and so would the server (a 400)
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": '{"x": NaN}'}}]},
                ]
            },
            "history_tool_call_arguments",
            id="arguments-sglang-cannot-read",
        ),
        pytest.param(
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": "", "function_call": "auto"},
                ]
            },
            "history_tool_call",
            id="legacy-function-call-not-an-object",
        ),
        pytest.param(
            {
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "function_call": {"name": "f", "arguments": "{oops"}},
                ]
            },
            "history_tool_call_arguments",
            id="legacy-function-call-arguments",
        ),
    ],
)
def test_bad_rows_are_rejected_with_a_reason(row: object, reason: str) -> None:
    result = normalize_row(row, "openai_messages", KIMI_IDS)
    assert isinstance(result, Rejection)
    assert result.reason == reason and result.detail
