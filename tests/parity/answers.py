"""Answers as Kimi-K2.5 writes them, valid and defective, drawn by hypothesis: reasoning with and without its end, tool
sections (several, empty, unclosed, before the reasoning end), call ids in every spelling SGLang's kimi_k2 detector
meets, arguments that are and are not JSON objects, text around it all; after a history with earlier calls."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from tests.parity.conversations import NAMES, TEXT, arguments_value, one_in

# Text without reasoning markers: where the answer has them is drawn on purpose, not by chance.
PROSE = TEXT.map(lambda t: t.replace("</think>", "").replace("<think>", "")).filter(lambda t: t != "")

BEGIN, END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL, ARGUMENTS, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
MARKERS = (BEGIN, END, CALL, ARGUMENTS, CALL_END)
MAYBE_TEXT = st.one_of(st.just(""), PROSE)


@st.composite
def tools(draw: st.DrawFn) -> list[dict[str, Any]]:
    names = draw(st.lists(NAMES, min_size=0 if draw(one_in(7)) else 1, max_size=3, unique=True))
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "parameters": {
                    "type": "object",
                    "properties": {key: {"type": "string"} for key in draw(st.lists(NAMES, max_size=3, unique=True))},
                },
            },
        }
        for name in names
    ]


@st.composite
def call_id(draw: st.DrawFn, name: str, index: int) -> str:
    return draw(
        st.sampled_from(
            [
                f"functions.{name}:{index}",
                f"functions.{name}:{index}",
                f" functions.{name}:{index} ",  # whitespace around: read
                f"functions.{name}:{index}\n",
                f"{name}:{index}",  # no prefix: read
                f"{index}",  # a bare counter: the function inferred from the tools
                f"functions.github:{name}:{index}",  # a colon in the name: the call is skipped
                f"functions.{name} :{index}",  # whitespace inside: skipped
                f"call_{name}",  # no index: skipped
                "functions.undeclared_tool:0",
            ]
        )
    )


@st.composite
def arguments(draw: st.DrawFn) -> str:
    value = json.dumps(draw(arguments_value()), ensure_ascii=False)
    return draw(
        st.sampled_from(
            [value, value, f" {value}\n", value.replace(", ", ","), '{"city": "Par', "[1, 2]", "{}", '{"a": NaN}', "x"]
        )
    )


@st.composite
def section(draw: st.DrawFn, names: list[str], first_index: int) -> str:
    calls = []
    for i in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(names)) if names else draw(NAMES)
        closed = not draw(one_in(12))
        between = draw(st.sampled_from(["", "", "\n", " junk "]))
        calls.append(
            f"{CALL}{draw(call_id(name, first_index + i))}{ARGUMENTS}{draw(arguments())}{CALL_END if closed else ''}"
            + between
        )
    closed = not draw(one_in(8))
    return BEGIN + "".join(calls) + (END if closed else "")


def kimi_call_id(name: str, index: int) -> str:
    return f"functions.{name}:{index}"


@st.composite
def history(
    draw: st.DrawFn, names: list[str], call_id: Callable[[str, int], str] = kimi_call_id
) -> list[dict[str, Any]]:
    """A user turn, maybe after an earlier turn with calls (given ids in the model's form) and their results; SGLang
    numbers Kimi's new call ids after them."""
    messages: list[dict[str, Any]] = []
    if names and draw(st.booleans()):
        messages.append({"role": "user", "content": "first"})
        calls = [
            {
                "id": call_id(name, i),
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(draw(arguments_value()))},
            }
            for i, name in enumerate(draw(st.lists(st.sampled_from(names), min_size=1, max_size=3)))
        ]
        messages.append({"role": "assistant", "content": "", "tool_calls": calls})
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "result"} for c in calls]
    messages.append({"role": "user", "content": draw(PROSE.filter(str.strip))})
    return messages


@st.composite
def answer(draw: st.DrawFn) -> dict[str, Any]:
    """A request (history, tools, thinking) and the text of the answer the model wrote to it, its EOS left out."""
    declared = draw(tools())
    names = [t["function"]["name"] for t in declared]
    messages = draw(history(names))
    earlier = sum(len(m.get("tool_calls") or []) for m in messages)
    thinking = not draw(one_in(4))
    sections = [draw(section(names, earlier)) for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2])))]
    text = draw(MAYBE_TEXT) + "".join(sections) + draw(st.sampled_from(["", "", " and then", "\n"]))
    if thinking:
        lead = draw(st.sampled_from(["", "", "", "<think>", "<think><think>"]))
        reasoning = draw(MAYBE_TEXT) + draw(st.sampled_from(["", "", "", "<think>"]))
        before_end = draw(section(names, earlier)) if draw(one_in(10)) else ""
        end = draw(st.sampled_from(["</think>"] * 8 + [""]))
        text = lead + reasoning + before_end + end + text
    elif draw(one_in(10)):
        text = "</think>" + text
    return {"messages": messages, "tools": declared, "thinking": thinking, "text": text}


# Qwen3.6 (qwen3_coder): calls as XML lines between <tool_call> and </tool_call>, values typed by the declared schema.
QWEN_TYPES = ["string", "integer", "number", "boolean", "array", "object", ["integer", "null"], "int", "float"]
QWEN_VALUES = [
    "12", "-3", "1.5", "2e3", "7.0", "true", "False", "null", "[1, 2]", '{"a": 1}', "{'a': 1}", "(1, 2)",
    "abc", " spaced ", "line\nbreak", "{1, 2}", "", "1_000", "0x10",
]  # fmt: skip


@st.composite
def qwen_tools(draw: st.DrawFn) -> list[dict[str, Any]]:
    names = draw(st.lists(NAMES, min_size=0 if draw(one_in(7)) else 1, max_size=3, unique=True))
    declared = []
    for name in names:
        keys = draw(st.lists(NAMES, max_size=3, unique=True))
        properties = {}
        for key in keys:
            kind = draw(st.sampled_from(QWEN_TYPES))
            properties[key] = {"anyOf": [{"type": "string"}, {"type": "null"}]} if draw(one_in(8)) else {"type": kind}
        parameters = {"type": "object", "properties": properties}
        declared.append({"type": "function", "function": {"name": name, "parameters": parameters}})
    return declared


@st.composite
def qwen_call(draw: st.DrawFn, declared: list[dict[str, Any]]) -> str:
    function = draw(st.sampled_from(declared))["function"] if declared else {"name": draw(NAMES), "parameters": {}}
    keys = [*(function["parameters"].get("properties") or {}), draw(NAMES)]
    parameters = ""
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(keys))
        close = draw(st.sampled_from(["</parameter>\n"] * 6 + ["\n", ""]))
        parameters += (
            f"<parameter={key}{'' if draw(one_in(15)) else '>'}\n{draw(st.sampled_from(QWEN_VALUES))}\n{close}"
        )
    name = function["name"] if not draw(one_in(20)) else "undeclared_tool"
    opening = "" if draw(one_in(25)) else ">"
    end = draw(st.sampled_from(["</function>\n"] * 8 + [""]))
    stray = draw(st.sampled_from([""] * 8 + ["stray text\n"]))
    return (
        f"<tool_call>\n{stray}<function={name}{opening}\n{parameters}{end}</tool_call>"
        if not draw(one_in(20))
        else f"<tool_call>\n<function={name}>\n{parameters}"
    )


@st.composite
def qwen_answer(draw: st.DrawFn) -> dict[str, Any]:
    declared = draw(qwen_tools())
    messages = [{"role": "user", "content": draw(PROSE.filter(str.strip))}]
    thinking = not draw(one_in(4))
    calls = "\n".join(draw(qwen_call(declared)) for _ in range(draw(st.sampled_from([0, 1, 1, 2]))))
    text = draw(MAYBE_TEXT) + ("\n\n" + calls if calls else "") + draw(st.sampled_from(["", "", "\n"]))
    if thinking:
        end = draw(st.sampled_from(["\n</think>\n\n"] * 8 + [""]))
        text = draw(MAYBE_TEXT) + end + text
    return {"messages": messages, "tools": declared, "thinking": thinking, "text": text}
