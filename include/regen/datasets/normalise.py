"""Source rows -> one canonical conversation shape (OpenAI messages + tools), or a rejection with a reason.

Pure functions: no I/O, never raise on bad data. The prompt is the conversation up to the turn the target model
regenerates (the final assistant turn is dropped, its history kept).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from regen.chat import canonical_json

ROLES = frozenset({"system", "user", "assistant", "tool"})


@dataclass(frozen=True)
class Conversation:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def sample_id(self) -> str:
        """Stable across runs and file orders: a digest of the canonical prompt content."""
        content = canonical_json({"messages": self.messages, "tools": self.tools})
        return hashlib.sha256(content.encode("utf-8")).hexdigest()[:20]


@dataclass(frozen=True)
class Rejection:
    reason: str
    detail: str


def _text(value: Any) -> str | None:
    """Message content as text; content-part lists are joined; anything else is not text."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in value):
        texts = [p.get("text") for p in value]
        if all(isinstance(t, str) for t in texts):
            return "".join(texts)
    return None


def _check_tools(tools: Any) -> list[dict[str, Any]] | Rejection:
    if tools is None:
        return []
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as e:
            return Rejection("bad_tools", f"tools is not JSON: {e}")
    if not isinstance(tools, list):
        return Rejection("bad_tools", f"tools must be a list, got {type(tools).__name__}")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not (isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]):
            return Rejection("bad_tools", f"tools[{i}] is not a function schema with a name")
        if not isinstance(fn.get("parameters", {}), dict):
            return Rejection("bad_tools", f"tools[{i}].function.parameters must be a JSON schema object")
    return tools


def _tool_call(call: Any, index: int, id_format: str) -> tuple[dict[str, Any], str] | Rejection:
    fn = call.get("function") if isinstance(call, dict) else None
    if not (isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]):
        return Rejection("bad_tool_call", f"tool call {index} has no function name")
    arguments = fn.get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            json.loads(arguments)
        except json.JSONDecodeError as e:
            return Rejection("bad_tool_call_arguments", f"tool call {index} ({fn['name']}): {e}")
    elif isinstance(arguments, dict):
        arguments = json.dumps(arguments, ensure_ascii=False)
    else:
        return Rejection("bad_tool_call_arguments", f"tool call {index} ({fn['name']}): arguments must be JSON")
    new_id = id_format.format(name=fn["name"], index=index, id=call.get("id") or f"call_{index}")
    normalised = {"id": new_id, "type": "function", "function": {"name": fn["name"], "arguments": arguments}}
    return normalised, str(call.get("id") or new_id)


def _message(raw: Any, position: int, state: dict[str, Any], id_format: str) -> dict[str, Any] | Rejection:
    if not isinstance(raw, dict):
        return Rejection("bad_message", f"message {position} is not an object")
    role = raw.get("role")
    if role not in ROLES:
        return Rejection("unknown_role", f"message {position} has role {role!r}")
    content = _text(raw.get("content")) if raw.get("content") is not None else ""
    if content is None:
        return Rejection("bad_content", f"message {position} ({role}) content is neither text nor text parts")
    message: dict[str, Any] = {"role": role, "content": content}
    if role == "assistant":
        if isinstance(raw.get("reasoning_content"), str) and raw["reasoning_content"]:
            message["reasoning_content"] = raw["reasoning_content"]
        calls = raw.get("tool_calls") or []
        if not isinstance(calls, list):
            return Rejection("bad_tool_call", f"message {position} tool_calls is not a list")
        for call in calls:
            result = _tool_call(call, state["calls"], id_format)
            if isinstance(result, Rejection):
                return result
            normalised, original_id = result
            state["ids"][original_id] = normalised["id"]
            state["calls"] += 1
            message.setdefault("tool_calls", []).append(normalised)
    elif role == "tool":
        original = raw.get("tool_call_id")
        message["tool_call_id"] = state["ids"].get(original, original) if original else _last_call_id(state)
    if not content and "tool_calls" not in message and role != "tool":
        return Rejection("empty_content", f"message {position} ({role}) is empty")
    return message


def _last_call_id(state: dict[str, Any]) -> str:
    return next(reversed(state["ids"].values()), "") if state["ids"] else ""


def normalise_messages(
    raw_messages: Any, raw_tools: Any, id_format: str, meta: dict[str, Any] | None = None
) -> Conversation | Rejection:
    if isinstance(raw_messages, str):
        try:
            raw_messages = json.loads(raw_messages)
        except json.JSONDecodeError as e:
            return Rejection("bad_messages", f"messages is not JSON: {e}")
    if not isinstance(raw_messages, list) or not raw_messages:
        return Rejection("missing_messages", "no messages")
    tools = _check_tools(raw_tools)
    if isinstance(tools, Rejection):
        return tools
    state: dict[str, Any] = {"calls": 0, "ids": {}}
    messages: list[dict[str, Any]] = []
    for position, raw in enumerate(raw_messages):
        message = _message(raw, position, state, id_format)
        if isinstance(message, Rejection):
            return message
        messages.append(message)
    while messages and messages[-1]["role"] == "assistant":
        messages.pop()  # the turn the target model regenerates
    if not any(m["role"] == "user" for m in messages):
        return Rejection("no_user_turn", "no user message before the regenerated turn")
    return Conversation(messages=messages, tools=tools, meta=meta or {})


def normalise_row(row: Any, source_format: str, id_format: str) -> Conversation | Rejection:
    if not isinstance(row, dict):
        return Rejection("not_an_object", f"row is a {type(row).__name__}, not an object")
    if source_format == "openai_messages":
        if "messages" not in row:
            return Rejection("missing_messages", f"no 'messages' field (fields: {', '.join(sorted(row))[:200]})")
        return normalise_messages(row["messages"], row.get("tools"), id_format)
    if source_format == "input_output":
        instruction = row.get("input")
        if not isinstance(instruction, str) or not instruction.strip():
            return Rejection("empty_content", "'input' is missing or empty")
        meta = {k: v for k, v in row.items() if k not in ("input", "output")}
        return Conversation(messages=[{"role": "user", "content": instruction}], tools=[], meta=meta)
    raise ValueError(f"unknown source format {source_format!r}")
