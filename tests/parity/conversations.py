"""OpenAI chat requests as production clients send them, drawn by hypothesis: every shape SGLang's chat layer
reshapes before the template sees it (tool schemas with database type names, names on every role, the developer
role, content as text parts, tool results with and without names, history with reasoning), plus requests it refuses.

A conversation ends waiting for the assistant (a user turn or tool results), so the project's `final` prompt is the
whole request. Tool-call ids are the Kimi profile's own (`functions.{name}:{n}`), which normalize keeps as they are.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

Message = dict[str, Any]


def one_in(n: int) -> st.SearchStrategy[bool]:
    """True about once in n draws. Not `integers(0, n - 1) == 0`: hypothesis draws the bounds of a range far more
    often than their share, so the rare case would be common."""
    return st.integers(0, n - 1).map(lambda i: i == n // 2)


NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True)
WORDS = st.lists(
    st.sampled_from(
        "the a weather Paris 42 résumé 東京 naïve ünïcödé code def return {} [] : , . ? ! \n \t  "
        "<think> </think> 1.5 -3 true null".split(" ")
    ),
    min_size=1,
    max_size=12,
).map(" ".join)
# Some text is prose with odd spacing, some is any printable text at all.
TEXT = st.one_of(WORDS, st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=40))
VISIBLE = TEXT.filter(lambda t: t.strip() != "")

# Type names as tool sets spell them: JSON Schema's own, xLAM/APIGen's Python names, BFCL's, database columns'.
STANDARD_TYPES = ["string", "integer", "number", "boolean", "array", "object", "null"]
ALIAS_TYPES = [
    "int", "str", "float", "bool", "dict", "list", "List[int]", "list[str]", "Dict[str, Any]", "long", "int32",
    "uint8", "float64", "double", "decimal(10,2)", "varchar(255)", "text", "char", "uuid", "datetime", "timestamp",
    "bigint", "tinyint", "numeric", "real", "tuple", "set", "map", "enum", "bytes", "Array", "INTEGER", "String",
]  # fmt: skip
# Names that stay unknown: a schema with one is invalid, and SGLang refuses the request.
UNKNOWN_TYPES = ["any", "str, optional", "float, optional", "internal", "list_price", "callable", "Optional[int]"]


@st.composite
def parameter(draw: st.DrawFn, depth: int = 0) -> dict[str, Any]:
    kind = draw(st.sampled_from(STANDARD_TYPES + ALIAS_TYPES))
    schema: dict[str, Any] = {"type": kind}
    if draw(st.booleans()):
        schema["description"] = draw(WORDS)
    if kind in ("array", "list", "List[int]", "tuple") and depth < 2 and draw(st.booleans()):
        schema["items"] = draw(parameter(depth + 1))
    if kind in ("object", "dict") and depth < 2 and draw(st.booleans()):
        schema["properties"] = draw(st.dictionaries(NAMES, parameter(depth + 1), max_size=2))
    if draw(one_in(10)):
        schema["type"] = [kind, "null"]
    if draw(one_in(8)):
        schema["enum"] = draw(st.lists(NAMES, min_size=1, max_size=3, unique=True))
    return schema


@st.composite
def tool(draw: st.DrawFn, name: str, valid: bool = True) -> dict[str, Any]:
    """xLAM-, Glaive- or BFCL-style: a top-level `object` (BFCL says `dict`), typed properties, required names."""
    properties = draw(st.dictionaries(NAMES, parameter(), max_size=4))
    if not valid:
        broken = draw(st.sampled_from(["unknown", "type-not-a-name", "required-not-a-list"]))
        key = draw(NAMES)
        if broken == "unknown":
            properties[key] = {"type": draw(st.sampled_from(UNKNOWN_TYPES))}
        elif broken == "type-not-a-name":
            properties[key] = {"type": draw(st.sampled_from([5, {"a": 1}, True]))}
        else:
            properties[key] = {"type": "string", "required": draw(st.sampled_from([True, "yes", 3]))}
    parameters: dict[str, Any] = {"type": draw(st.sampled_from(["object", "dict"])), "properties": properties}
    if properties and draw(st.booleans()):
        parameters["required"] = draw(st.lists(st.sampled_from(sorted(properties)), unique=True, max_size=3))
    function: dict[str, Any] = {"name": name}
    keys = draw(st.permutations(["description", "parameters", "strict"]))  # key order is what a template prints
    for key in keys:
        if key == "description" and draw(st.booleans()):
            function["description"] = draw(WORDS)
        elif key == "parameters" and (not valid or not draw(one_in(10))):
            function["parameters"] = parameters
        elif key == "strict" and draw(one_in(6)):
            function["strict"] = draw(st.booleans())
    return {"type": "function", "function": function}


def content(text: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    """A string, or OpenAI text parts."""
    parts = st.lists(text.map(lambda t: {"type": "text", "text": t}), min_size=1, max_size=3)
    return st.one_of(text, parts)


def arguments_value() -> st.SearchStrategy[Any]:
    leaf = st.one_of(
        st.integers(-(2**40), 2**40), st.floats(allow_nan=False, allow_infinity=False, width=32), WORDS, st.booleans()
    )
    return st.dictionaries(NAMES, st.one_of(leaf, st.lists(leaf, max_size=3)), max_size=3)


@st.composite
def conversation(draw: st.DrawFn) -> dict[str, Any]:
    """One request: messages, tools (maybe none) and `thinking`; `refused` says what SGLang must refuse, if any."""
    names = draw(st.lists(NAMES, min_size=0, max_size=3, unique=True))
    refused = draw(st.sampled_from([None] * 12 + ["schema", "arguments", "arguments-not-an-object"]))
    refused = refused if names or refused is None else None
    broken = draw(st.integers(0, len(names) - 1)) if refused == "schema" else -1
    tools = [draw(tool(name, valid=i != broken)) for i, name in enumerate(names)]
    messages: list[Message] = []
    if draw(st.booleans()):
        role = draw(st.sampled_from(["system", "developer"]))
        messages.append(named({"role": role, "content": draw(content(VISIBLE))}, draw))
    calls_made = 0
    for turn in range(draw(st.integers(1, 3))):
        messages.append(named({"role": "user", "content": draw(content(VISIBLE))}, draw))
        last = turn == 0 and draw(st.booleans())
        if last:
            break
        kind = draw(st.sampled_from(["answer", "calls"] if names else ["answer"]))
        if kind == "answer":
            messages.append(assistant(draw, {"content": draw(content(VISIBLE))}))
            continue
        calls = []
        for _ in range(draw(st.integers(1, 2))):
            name = draw(st.sampled_from(names))
            value = draw(arguments_value())
            text = json.dumps(value, ensure_ascii=False, separators=draw(st.sampled_from([None, (",", ":")])))
            arguments: Any = value if draw(one_in(5)) else text
            calls.append({"id": f"functions.{name}:{calls_made}", "type": "function",
                          "function": {"name": name, "arguments": arguments}})  # fmt: skip
            calls_made += 1
        message = assistant(draw, {"content": draw(st.one_of(st.none(), st.just(""), VISIBLE)), "tool_calls": calls})
        messages.append(message)
        for call in calls:
            result: Message = {"role": "tool", "tool_call_id": call["id"], "content": draw(content(TEXT))}
            if draw(st.booleans()):
                result["name"] = call["function"]["name"]
            messages.append(result)
    if messages[-1]["role"] == "assistant":  # the conversation waits for the assistant
        messages.append(named({"role": "user", "content": draw(content(VISIBLE))}, draw))
    if refused in ("arguments", "arguments-not-an-object"):
        bad = '{"city": "Par' if refused == "arguments" else "[1, 2]"
        call = {"id": "functions.x:0", "type": "function", "function": {"name": names[0], "arguments": bad}}
        messages[-1:-1] = [{"role": "assistant", "content": "", "tool_calls": [call]}]
        messages.insert(len(messages) - 1, {"role": "tool", "tool_call_id": "functions.x:0", "content": "r"})
        messages[-2], messages[-1] = messages[-1], messages[-2]
        if messages[-1]["role"] == "assistant":  # keep the tool result last, waiting for the assistant
            messages.append({"role": "tool", "tool_call_id": "functions.x:0", "content": "r"})
    return {"messages": messages, "tools": tools, "thinking": draw(st.booleans()), "refused": refused}


def named(message: Message, draw: st.DrawFn) -> Message:
    if draw(one_in(3)):
        message["name"] = draw(NAMES)
    return message


def assistant(draw: st.DrawFn, fields: dict[str, Any]) -> Message:
    message = named({"role": "assistant", **fields}, draw)
    if draw(st.booleans()):
        message["reasoning_content"] = draw(TEXT)
    return message


# Text at Kimi's encode limits: runs of about 25,000 characters without whitespace. The template's special-token
# text around the content belongs to the run: at 24,965 characters of content the cut falls inside `<|im_end|>`.
LONG_TEXT = st.builds(
    lambda unit, length, tail: (unit * length)[:length] + tail,
    st.sampled_from(["x", "the", "東", "ab."]),
    st.sampled_from([12_495, 24_965, 24_968, 24_999, 25_001, 60_000]),
    st.sampled_from(["", " end", "\n\n"]),
)
