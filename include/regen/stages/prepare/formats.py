"""Each prompt-dataset format -> OpenAI-shaped messages and tools, and the row -> prompts entry point.

Pure functions that never raise on bad data: a row that cannot become a prompt is a `Rejection` with a reason.
`auto` picks the format per row from the fields it has, in the order of `DETECTION`. A turn's `name` is carried
along where a format has one; tool results without one (Glaive's `FUNCTION RESPONSE:`, ShareGPT's `observation`)
are named after the answered call's function by `normalize` (shared docs, DATASETS.md and KIMI_K25.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from regen.reasons import Reason
from regen.stages.prepare.normalize import (
    Conversation,
    RawChat,
    Rejection,
    ToolResultNames,
    Turns,
    normalize_chat,
    select_prompts,
)

# Columns holding a reference answer: never carried into a prompt's metadata (the target model writes its own).
REFERENCE_COLUMNS = frozenset({"output", "response", "completion"})

SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "function_call": "tool_call",
    "function-call": "tool_call",
    "observation": "tool",
    "function_response": "tool",
    "function-response": "tool",
    "tool": "tool",
}

GLAIVE_TURN = re.compile(r"^(USER|ASSISTANT|FUNCTION RESPONSE):[ \t]*", re.MULTILINE)
GLAIVE_TOOLS_START = re.compile(r"^\{|-\s*\{", re.MULTILINE)  # a line opening a JSON object, or "... - {"
GLAIVE_CALL = re.compile(
    r"""\{\s*"name"\s*:\s*"(?P<name>[^"\\]+)"\s*,\s*"arguments"\s*:\s*'(?P<arguments>.*)'\s*\}""", re.S
)
GLAIVE_END = "<|endoftext|>"
GLAIVE_CALL_MARK = "<functioncall>"


def _fields(row: dict[str, Any]) -> str:
    return ", ".join(sorted(map(str, row)))[:200]


def _meta(row: dict[str, Any], consumed: frozenset[str]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in consumed and k not in REFERENCE_COLUMNS}


def _system(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A top-level `system` column (ShareGPT and Alpaca exports often have one) as the first message."""
    system = row.get("system")
    return [{"role": "system", "content": system}] if isinstance(system, str) and system.strip() else []


def _json_list(value: Any, what: str) -> Any:
    """Parquet exports often keep nested columns as JSON text."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        return Rejection(Reason.BAD_MESSAGES, f"{what} is text but not JSON: {e}")


def openai_messages(row: dict[str, Any]) -> RawChat | Rejection:
    """`messages` and `tools`; a legacy row (OpenAI's deprecated functions API) declares bare function schemas in
    `functions` instead, and its `function_call` and `function` turns are converted by `normalize`."""
    if "messages" not in row:
        return Rejection(Reason.MISSING_MESSAGES, f"no 'messages' field (fields: {_fields(row)})")
    tools = row.get("tools") if row.get("tools") is not None else row.get("functions")
    return RawChat(row["messages"], tools, _meta(row, frozenset({"messages", "tools", "functions"})))


def parse_calls(text: Any) -> list[dict[str, Any]] | Rejection:
    """A function call written as text: JSON `{"name", "arguments"}` (or a list of them), or Glaive's
    `{"name": "x", "arguments": '{"a": 1}'}` whose arguments are JSON inside single quotes."""
    if isinstance(text, dict | list):
        value = text
    elif isinstance(text, str):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            match = GLAIVE_CALL.fullmatch(text.strip())
            if match is None:
                detail = f"function call is not JSON nor Glaive's form: {text[:80]!r}"
                return Rejection(Reason.HISTORY_TOOL_CALL, detail)
            value = {"name": match["name"], "arguments": match["arguments"]}
    else:
        return Rejection(Reason.HISTORY_TOOL_CALL, f"function call is a {type(text).__name__}, not text")
    calls = value if isinstance(value, list) else [value]
    if not calls or not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in calls):
        return Rejection(Reason.HISTORY_TOOL_CALL, "function call has no name")
    return [{"type": "function", "function": {"name": c["name"], "arguments": c.get("arguments", {})}} for c in calls]


def _sharegpt_turn(turn: Any, position: int) -> dict[str, Any] | Rejection:
    if not isinstance(turn, dict):
        return Rejection(Reason.BAD_MESSAGE, f"turn {position} is not an object")
    speaker, value = turn.get("from", turn.get("role")), turn.get("value", turn.get("content"))
    role = SHAREGPT_ROLES.get(speaker) if isinstance(speaker, str) else None
    if role is None:
        return Rejection(Reason.UNKNOWN_ROLE, f"turn {position} is from {str(speaker)[:80]!r}")
    if role != "tool_call":
        named = {"name": turn["name"]} if "name" in turn else {}  # normalize keeps it when it is a name
        return {"role": role, "content": value, **named}
    calls = parse_calls(value)
    if isinstance(calls, Rejection):
        return calls
    return {"role": "assistant", "content": "", "tool_calls": calls}


def sharegpt(row: dict[str, Any]) -> RawChat | Rejection:
    turns = _json_list(row.get("conversations", row.get("messages")), "conversations")
    if isinstance(turns, Rejection):
        return turns
    if not isinstance(turns, list) or not turns:
        return Rejection(Reason.MISSING_MESSAGES, f"no 'conversations' turns (fields: {_fields(row)})")
    messages = _system(row)
    for position, turn in enumerate(turns):
        message = _sharegpt_turn(turn, position)
        if isinstance(message, Rejection):
            return message
        messages.append(message)
    consumed = frozenset({"conversations", "messages", "tools", "system"})
    return RawChat(messages, row.get("tools"), _meta(row, consumed))


def glaive_tools(system: str) -> tuple[str, list[dict[str, Any]]] | Rejection:
    """`SYSTEM: <prose> -` then pretty-printed function definitions separated by blank lines."""
    text = system.strip().removeprefix("SYSTEM:").strip()
    start = GLAIVE_TOOLS_START.search(text)
    if start is None:
        return text, []
    brace = start.end() - 1
    prose = text[:brace].rstrip().removesuffix("-").rstrip()
    decoder, position = json.JSONDecoder(), brace
    tools: list[Any] = []
    while position < len(text):
        if text[position].isspace():
            position += 1
            continue
        try:
            definition, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError as e:
            return Rejection(Reason.BAD_TOOLS, f"function definition {len(tools)} in 'system' is not JSON: {e}")
        tools.append({"type": "function", "function": definition} if isinstance(definition, dict) else definition)
    return prose, tools


def _glaive_assistant(text: str) -> dict[str, Any] | Rejection:
    text = text.replace(GLAIVE_END, "").strip()
    content, marker, call = text.partition(GLAIVE_CALL_MARK)
    if not marker:
        return {"role": "assistant", "content": content}
    calls = parse_calls(call.strip())
    if isinstance(calls, Rejection):
        return calls
    return {"role": "assistant", "content": content.strip(), "tool_calls": calls}


def glaive_messages(chat: str) -> list[dict[str, Any]] | Rejection:
    parts = GLAIVE_TURN.split(chat)
    if parts[0].strip() or len(parts) == 1:
        return Rejection(
            Reason.BAD_MESSAGES, "'chat' does not start with a USER:, ASSISTANT: or FUNCTION RESPONSE: turn"
        )
    messages: list[dict[str, Any]] = []
    calls = 0
    for marker, text in zip(parts[1::2], parts[2::2], strict=True):
        if marker == "USER":
            messages.append({"role": "user", "content": text.strip()})
        elif marker == "ASSISTANT":
            message = _glaive_assistant(text)
            if isinstance(message, Rejection):
                return message
            calls += len(message.get("tool_calls", []))
            messages.append(message)
        elif calls == 0:
            return Rejection(Reason.BAD_MESSAGE, "FUNCTION RESPONSE before any function call")
        else:
            messages.append({"role": "tool", "content": text.strip()})
    return messages


def glaive(row: dict[str, Any]) -> RawChat | Rejection:
    chat, system = row.get("chat"), row.get("system", "")
    if not isinstance(chat, str) or not chat.strip():
        return Rejection(Reason.MISSING_MESSAGES, f"no 'chat' transcript (fields: {_fields(row)})")
    if not isinstance(system, str):
        return Rejection(Reason.BAD_CONTENT, "'system' is not text")
    declared = glaive_tools(system)
    if isinstance(declared, Rejection):
        return declared
    prose, tools = declared
    messages = glaive_messages(chat)
    if isinstance(messages, Rejection):
        return messages
    system_turn = [{"role": "system", "content": prose}] if prose else []
    return RawChat(system_turn + messages, tools, _meta(row, frozenset({"system", "chat"})))


def input_output(row: dict[str, Any]) -> RawChat | Rejection:
    instruction = row.get("input")
    if not isinstance(instruction, str) or not instruction.strip():
        return Rejection(Reason.EMPTY_CONTENT, "'input' is missing or empty")
    return RawChat([{"role": "user", "content": instruction}], None, _meta(row, frozenset({"input"})))


def alpaca(row: dict[str, Any]) -> RawChat | Rejection:
    instruction, extra = row.get("instruction"), row.get("input")
    if not isinstance(instruction, str) or not instruction.strip():
        return Rejection(Reason.EMPTY_CONTENT, "'instruction' is missing or empty")
    if extra is not None and not isinstance(extra, str):
        return Rejection(Reason.BAD_CONTENT, f"'input' is a {type(extra).__name__}, not text")
    content = f"{instruction}\n\n{extra}" if extra and extra.strip() else instruction
    messages = [*_system(row), {"role": "user", "content": content}]
    return RawChat(messages, None, _meta(row, frozenset({"instruction", "input", "system"})))


def prompt(row: dict[str, Any]) -> RawChat | Rejection:
    """A `prompt` column: text (one user turn, after an optional `system`), or already a list of messages."""
    value = row.get("prompt")
    consumed = frozenset({"prompt", "system", "tools"})
    if isinstance(value, list):
        return RawChat(value, row.get("tools"), _meta(row, consumed))
    if not isinstance(value, str) or not value.strip():
        return Rejection(Reason.EMPTY_CONTENT, "'prompt' is missing or empty")
    return RawChat([*_system(row), {"role": "user", "content": value}], row.get("tools"), _meta(row, consumed))


CONVERTERS: dict[str, Callable[[dict[str, Any]], RawChat | Rejection]] = {
    "openai_messages": openai_messages,
    "sharegpt": sharegpt,
    "glaive": glaive,
    "input_output": input_output,
    "alpaca": alpaca,
    "prompt": prompt,
}
DETECTION = (
    ("messages", "openai_messages"),
    ("conversations", "sharegpt"),
    ("chat", "glaive"),
    ("instruction", "alpaca"),
    ("input", "input_output"),
    ("prompt", "prompt"),
)


def detect_format(row: dict[str, Any]) -> str | None:
    for column, source_format in DETECTION:
        if column in row:
            if source_format == "openai_messages" and _is_sharegpt(row[column]):
                return "sharegpt"
            return source_format
    return None


def _is_sharegpt(messages: Any) -> bool:
    return isinstance(messages, list) and bool(messages) and isinstance(messages[0], dict) and "from" in messages[0]


def normalize_row(
    row: Any,
    source_format: str,
    id_format: str,
    turns: Turns = "final",
    tool_result_names: ToolResultNames = "as_given",
) -> list[Conversation] | Rejection:
    """One dataset row -> its prompts (one per regenerated turn), or why it cannot give any."""
    if not isinstance(row, dict):
        return Rejection(Reason.NOT_AN_OBJECT, f"row is a {type(row).__name__}, not an object")
    chosen = detect_format(row) if source_format == "auto" else source_format
    if chosen is None:
        return Rejection(Reason.UNKNOWN_FORMAT, f"no field of a known format (fields: {_fields(row)})")
    if chosen not in CONVERTERS:
        raise ValueError(f"unknown source format {source_format!r}; known: auto, {', '.join(CONVERTERS)}")
    raw = CONVERTERS[chosen](row)
    if isinstance(raw, Rejection):
        return raw
    conversation = normalize_chat(raw, id_format, tool_result_names)
    if isinstance(conversation, Rejection):
        return conversation
    answer = next((row[c] for c in sorted(REFERENCE_COLUMNS) if isinstance(row.get(c), str) and row[c].strip()), None)
    return select_prompts(conversation, turns, answer)
