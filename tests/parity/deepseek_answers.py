"""Answers in DeepSeek-V3.1's grammar, valid and defective, drawn by hypothesis: single and parallel calls, calls to
undeclared or empty names, arguments that are and are not JSON (objects or not), a call missing its separator or its
end, calls outside a section, sections left open, text before, between and after; reasoning with and without its end,
a section inside it, and Qwen's `<tool_call>` written as prose (the deepseek-v3 reasoning parser's tool start)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from tests.deepseek_style import CALL_BEGIN, CALL_END, SECTION_BEGIN, SECTION_END, SEPARATOR
from tests.parity.answers import MAYBE_TEXT, history, tools
from tests.parity.conversations import NAMES, arguments_value, one_in


@st.composite
def arguments(draw: st.DrawFn) -> str:
    value = json.dumps(draw(arguments_value()), ensure_ascii=False)
    broken = ['{"city": "Par', "[1, 2]", "{}", '{"a": NaN}', "x", "null", "0", '"text"', "", "{} {}"]
    return draw(st.sampled_from([value, value, value, f" {value}\n", value.replace(", ", ","), *broken]))


@st.composite
def call(draw: st.DrawFn, names: list[str]) -> str:
    name = draw(st.sampled_from(names)) if names else draw(NAMES)
    name = draw(st.sampled_from([name] * 8 + ["undeclared_tool", "", f" {name}", f"{name}\n"]))
    form = draw(st.sampled_from(["whole"] * 12 + ["no separator", "no end", "two separators"]))
    args = draw(arguments())
    if form == "no separator":
        return f"{CALL_BEGIN}{name}{args}{CALL_END}"
    if form == "no end":
        return f"{CALL_BEGIN}{name}{SEPARATOR}{args}"
    if form == "two separators":
        return f"{CALL_BEGIN}{name}{SEPARATOR}{name}{SEPARATOR}{args}{CALL_END}"
    return f"{CALL_BEGIN}{name}{SEPARATOR}{args}{CALL_END}"


@st.composite
def section(draw: st.DrawFn, names: list[str]) -> str:
    between = st.sampled_from(["", "", "", "\n", " junk "])
    calls = "".join(draw(call(names)) + draw(between) for _ in range(draw(st.integers(0, 3))))
    return SECTION_BEGIN + calls + ("" if draw(one_in(8)) else SECTION_END)


@st.composite
def deepseek_answer(draw: st.DrawFn) -> dict[str, Any]:
    """A request (history, tools) to the thinking profile and the text of the answer, its EOS left out."""
    declared = draw(tools())
    names = [t["function"]["name"] for t in declared]
    messages = draw(history(names, lambda _name, i: f"call_{i}"))
    stray = draw(call(names)) if draw(one_in(12)) else ""  # a call before any section
    sections = [draw(section(names)) for _ in range(draw(st.sampled_from([0, 1, 1, 1, 1, 2])))]
    text = draw(MAYBE_TEXT) + stray + "".join(sections) + draw(st.sampled_from(["", "", " and then", "\n"]))
    lead = draw(st.sampled_from(["", "", "", "<think>", "<think><think>"]))
    reasoning = draw(MAYBE_TEXT) + draw(st.sampled_from(["", "", "", "", "\n<tool_call>", "<think>"]))
    before_end = draw(section(names)) if draw(one_in(8)) else ""
    end = draw(st.sampled_from(["</think>"] * 8 + [""]))
    return {"messages": messages, "tools": declared, "text": lead + reasoning + before_end + end + text}
