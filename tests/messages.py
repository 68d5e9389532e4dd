"""Chat messages in OpenAI shape, as the tests' conversations write them: one spelling of an assistant turn, its
tool calls (with the ids Kimi-K2.5's template prints: `functions.{name}:{index}`) and their results."""

from __future__ import annotations

from typing import Any


def assistant(content: str, reasoning: str | None = None, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An assistant turn: `reasoning` as `reasoning_content`, `calls` as `tool_calls` (each left out when None)."""
    turn: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        turn["reasoning_content"] = reasoning
    if calls is not None:
        turn["tool_calls"] = calls
    return turn


def call(index: int, arguments: str | dict[str, Any], name: str = "get_weather") -> dict[str, Any]:
    return {"id": f"functions.{name}:{index}", "type": "function", "function": {"name": name, "arguments": arguments}}


def result(index: int, content: str, name: str = "get_weather") -> dict[str, Any]:
    """The tool's answer to call `index`, named for its function as Kimi-K2.5's template heads the turn."""
    return {"role": "tool", "name": name, "tool_call_id": f"functions.{name}:{index}", "content": content}


def function_tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """A declared tool: a function taking an object of `properties`, its keys in the order OpenAI's docs write them
    (a template that prints tools as JSON prints them in this order)."""
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}
