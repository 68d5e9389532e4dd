"""OpenAI-shaped messages -> one canonical conversation, then the prompts cut from it; or a rejection with a reason.

Every source format is first turned into OpenAI-shaped messages and tools (`formats.py`); this module checks them once
for all formats. Pure functions: no I/O, never raise on bad data. A prompt is the conversation up to an assistant turn
the target model regenerates: the final one (history kept), or each one in turn.

What the data gives is kept as it was given, so that the prompt is the one production renders for it: a `name` on
any role, the `developer` role, content given as text parts (how SGLang hands each to the template is
regen.chat_request's business, not this module's). A tool result without a name stays without one (Kimi-K2.5
renders it `tool`, as production does for OpenAI-SDK clients), unless the dataset asks `tool_result_names:
from_call`, for clients that send the called function's name. Legacy OpenAI rows (an assistant `function_call`, a
`function` role result) become one tool call and its tool result (OpenAI's deprecated `functions` API: one call per
assistant turn, no call ids).
"""

from __future__ import annotations

import hashlib
import json
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from regen.chat import canonical_json
from regen.chat_request import Refused, served_parameters
from regen.reasons import Reason
from regen.tool_calls import arguments_problem

Turns = Literal["final", "every_assistant_turn", "on_policy"]
ToolResultNames = Literal["as_given", "from_call"]
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
ROLE_ALIASES = {"function": "tool"}  # the legacy function-calling API's result turn


@dataclass(frozen=True)
class Conversation:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)
    # On-policy (regen.on_policy): the dataset's messages after the first regenerated turn's prompt, from its
    # recorded answer on; the later turns are cut from them as the conversation is regenerated.
    later: list[dict[str, Any]] = field(default_factory=list)
    # The answer the dataset gives at the cut (the assistant turn the target regenerates), as text: what predicts the
    # target's answer length on a first version (regen.stages.prepare.shards). Not part of the sample's identity.
    reference: str | None = None

    @cached_property
    def sample_id(self) -> str:
        """Stable across runs and file orders: a digest of the canonical prompt content (meta left out), and of the
        rest of the conversation for an on-policy one (two conversations may open alike)."""
        content = {"messages": self.messages, "tools": self.tools, **({"later": self.later} if self.later else {})}
        return hashlib.sha256(canonical_json(content).encode("utf-8")).hexdigest()[:20]


@dataclass(frozen=True)
class Rejection:
    reason: Reason
    detail: str


@dataclass(frozen=True)
class RawChat:
    """A row in OpenAI shape, not yet checked: what every format converter produces."""

    messages: Any
    tools: Any
    meta: dict[str, Any]


def _text(value: Any) -> str | None:
    """Message content as text, text parts joined (for checks: the parts themselves are kept); else not text."""
    if isinstance(value, str):
        return value
    parts = _text_parts(value)
    return None if parts is None else "".join(part["text"] for part in parts)


def _text_parts(value: Any) -> list[dict[str, str]] | None:
    """A list of OpenAI text parts, each as `{"type": "text", "text": ...}`; None when it is anything else."""
    if not isinstance(value, list) or not all(isinstance(p, dict) and p.get("type") == "text" for p in value):
        return None
    if not all(isinstance(p.get("text"), str) for p in value):
        return None
    return [{"type": "text", "text": p["text"]} for p in value]


def _without_nulls(value: Any) -> Any:
    """Arrow (Parquet, HF datasets) stores nested schemas as structs and fills keys a row lacks with null."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _function_schema(tool: Any, i: int) -> dict[str, Any] | Rejection:
    """OpenAI `{"type": "function", "function": {...}}`, or a bare `{"name", "parameters"}` that is wrapped."""
    if not isinstance(tool, dict):
        return Rejection(Reason.BAD_TOOLS, f"tools[{i}] is not an object")
    fn = tool.get("function") if "function" in tool else tool
    if tool.get("type", "function") != "function" or not isinstance(fn, dict):
        return Rejection(Reason.BAD_TOOLS, f"tools[{i}] is not a function schema (type {tool.get('type')!r})")
    fn = _without_nulls(fn)
    if not (isinstance(fn.get("name"), str) and fn["name"]):
        return Rejection(Reason.BAD_TOOLS, f"tools[{i}] is not a function schema with a name")
    if not isinstance(fn.get("parameters", {}), dict):
        return Rejection(Reason.BAD_TOOLS, f"tools[{i}].function.parameters must be a JSON schema object")
    try:  # SGLang answers a schema that is not one, once its type names are made standard, with a 400
        served_parameters(fn.get("parameters"), i)
    except Refused as e:
        return Rejection(Reason.BAD_TOOLS, str(e)[:300])
    return {"type": "function", "function": fn}


def check_tools(tools: Any) -> list[dict[str, Any]] | Rejection:
    if tools is None:
        return []
    if isinstance(tools, str):
        try:
            tools = json.loads(tools) if tools.strip() else []
        except json.JSONDecodeError as e:
            return Rejection(Reason.BAD_TOOLS, f"tools is not JSON: {e}")
    if not isinstance(tools, list):
        return Rejection(Reason.BAD_TOOLS, f"tools must be a list, got {type(tools).__name__}")
    checked = []
    for i, tool in enumerate(tools):
        schema = _function_schema(tool, i)
        if isinstance(schema, Rejection):
            return schema
        checked.append(schema)
    return checked


def _arguments(raw: Any, label: str) -> str | Rejection:
    """Tool-call arguments as the JSON text of an object, whether they came as text or as an object. Checked as
    SGLang reads them before templating (regen.tool_calls.arguments_problem): what it refuses (NaN, a lone surrogate
    escape) the server would answer with a 400, so the row is rejected here."""
    if isinstance(raw, dict):
        raw = json.dumps(raw, ensure_ascii=False)
    if not isinstance(raw, str):
        return Rejection(Reason.HISTORY_TOOL_CALL_ARGUMENTS, f"{label}: arguments must be a JSON object")
    problem = arguments_problem(raw)
    if problem:
        return Rejection(Reason.HISTORY_TOOL_CALL_ARGUMENTS, f"{label}: arguments are {problem}")
    return raw


def _tool_call(call: Any, index: int, id_format: str) -> tuple[dict[str, Any], str] | Rejection:
    fn = call.get("function") if isinstance(call, dict) else None
    if not (isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]):
        return Rejection(Reason.HISTORY_TOOL_CALL, f"tool call {index} has no function name")
    arguments = _arguments(fn.get("arguments", "{}"), f"tool call {index} ({fn['name']})")
    if isinstance(arguments, Rejection):
        return arguments
    original_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else f"call_{index}"
    new_id = id_format.format(name=fn["name"], index=index, id=original_id)
    normalized = {"id": new_id, "type": "function", "function": {"name": fn["name"], "arguments": arguments}}
    return normalized, original_id


class _CallIds:
    """Tool-call ids of one conversation: the profile's ids replace the dataset's, and tool results follow them. A
    result without an id answers the oldest unanswered call (formats without ids list results in call order)."""

    def __init__(self) -> None:
        self.count = 0
        self.renamed: dict[str, str] = {}
        self.unanswered: deque[str] = deque()
        self.last = ""
        self.functions: dict[str, str] = {}  # new id -> name of the function called

    def add(self, original: str, new: str, function: str) -> None:
        self.renamed[original] = new
        self.unanswered.append(new)
        self.last = new
        self.count += 1
        self.functions[new] = function

    def answer(self, original: Any) -> str:
        if isinstance(original, str) and original:
            new = self.renamed.get(original, original)
            if new in self.unanswered:
                self.unanswered.remove(new)
            return new
        return self.unanswered.popleft() if self.unanswered else self.last


def _assistant(
    raw: dict[str, Any], message: dict[str, Any], position: int, ids: _CallIds, id_format: str
) -> Rejection | None:
    # SGLang's message model dumps a string reasoning_content as given, "" included, and a template may tell "" from
    # absent (Qwen3.6 reads reasoning from the content only when reasoning_content is not a string).
    reasoning = raw.get("reasoning_content")
    if isinstance(reasoning, str):
        message["reasoning_content"] = reasoning
    elif reasoning is not None:  # SGLang refuses the request (its model types it Optional[str])
        return Rejection(Reason.BAD_MESSAGE, f"message {position} reasoning_content is not text")
    calls = raw.get("tool_calls")
    if not calls and raw.get("function_call") is not None:
        calls = [{"type": "function", "function": raw["function_call"]}]  # legacy OpenAI: one call, no id
    calls = calls or []
    if not isinstance(calls, list):
        return Rejection(Reason.HISTORY_TOOL_CALL, f"message {position} tool_calls is not a list")
    for call in calls:
        result = _tool_call(call, ids.count, id_format)
        if isinstance(result, Rejection):
            return result
        normalized, original_id = result
        ids.add(original_id, normalized["id"], normalized["function"]["name"])
        message.setdefault("tool_calls", []).append(normalized)
    return None


def _message(
    raw: Any, position: int, ids: _CallIds, id_format: str, tool_result_names: ToolResultNames
) -> dict[str, Any] | Rejection:
    if not isinstance(raw, dict):
        return Rejection(Reason.BAD_MESSAGE, f"message {position} is not an object")
    role = raw.get("role")
    role = ROLE_ALIASES.get(role, role) if isinstance(role, str) else role
    if not isinstance(role, str) or role not in ROLES:
        return Rejection(Reason.UNKNOWN_ROLE, f"message {position} has role {str(role)[:80]!r}")
    given = raw.get("content")
    content = _text(given) if given is not None else ""
    if content is None:
        return Rejection(Reason.BAD_CONTENT, f"message {position} ({role}) content is neither text nor text parts")
    message: dict[str, Any] = {"role": role, "content": given if isinstance(given, str) else _text_parts(given) or ""}
    if isinstance(raw.get("name"), str) and raw["name"]:
        message["name"] = raw["name"]
    if role == "assistant":
        rejected = _assistant(raw, message, position, ids, id_format)
        if rejected is not None:
            return rejected
    elif role == "tool":
        message["tool_call_id"] = ids.answer(raw.get("tool_call_id"))
        if tool_result_names == "from_call" and "name" not in message and message["tool_call_id"] in ids.functions:
            message["name"] = ids.functions[message["tool_call_id"]]
    if not content.strip() and "tool_calls" not in message and role != "tool":
        return Rejection(Reason.EMPTY_CONTENT, f"message {position} ({role}) is empty")
    return message


def normalize_chat(
    raw: RawChat, id_format: str, tool_result_names: ToolResultNames = "as_given"
) -> Conversation | Rejection:
    """The whole conversation, every turn checked; tool-call ids rewritten with the profile's `id_format`."""
    raw_messages = raw.messages
    if isinstance(raw_messages, str):
        try:
            raw_messages = json.loads(raw_messages)
        except json.JSONDecodeError as e:
            return Rejection(Reason.BAD_MESSAGES, f"messages is not JSON: {e}")
    if not isinstance(raw_messages, list) or not raw_messages:
        return Rejection(Reason.MISSING_MESSAGES, "no messages")
    tools = check_tools(raw.tools)
    if isinstance(tools, Rejection):
        return tools
    ids = _CallIds()
    messages: list[dict[str, Any]] = []
    for position, item in enumerate(raw_messages):
        message = _message(item, position, ids, id_format, tool_result_names)
        if isinstance(message, Rejection):
            return message
        messages.append(message)
    return Conversation(messages=messages, tools=tools, meta=raw.meta)


def _cuts(messages: list[dict[str, Any]]) -> list[int]:
    """Where a prompt may end: before each assistant turn (a run of assistant messages is one turn), and at the end
    when the conversation waits for the assistant."""
    cuts = [
        i
        for i, m in enumerate(messages)
        if m["role"] == "assistant" and (i == 0 or messages[i - 1]["role"] != "assistant")
    ]
    if messages[-1]["role"] != "assistant":
        cuts.append(len(messages))
    return cuts


def _encodable(prompts: list[Conversation]) -> Rejection | None:
    """Lone surrogates (from `\\ud800`-style JSON escapes) cannot be written as UTF-8, and Arrow rows may hold values
    JSON cannot (bytes in a tool schema): reject them here, not when a shard is written."""
    try:
        for prompt in prompts:
            _ = prompt.sample_id
        json.dumps(prompts[0].meta, ensure_ascii=False, default=str).encode("utf-8")
    except UnicodeEncodeError as e:
        return Rejection(Reason.INVALID_UTF8, f"text that is not valid Unicode: {e.reason} at {e.start}")
    except TypeError as e:
        return Rejection(Reason.BAD_TOOLS, f"tools hold a value that is not JSON: {e}")
    return None


def select_prompts(
    conversation: Conversation, turns: Turns, answer: str | None = None
) -> list[Conversation] | Rejection:
    """The prompts of one conversation, each ending where the assistant answers: the last such point (`final`) or
    every one (`every_assistant_turn`), each after a user turn; at least one, or a rejection. `on_policy`: one, the
    first such point, carrying the rest of the conversation (`later`). `answer`: the row's reference answer column
    (input/output and Alpaca rows keep their answer there), the reference of a prompt the conversation ends with."""
    messages, tools, meta = conversation.messages, conversation.tools, conversation.meta
    first_user = next((i for i, m in enumerate(messages) if m["role"] == "user"), len(messages))
    cuts = _cuts(messages)
    cuts = [c for c in (cuts[-1:] if turns == "final" else cuts) if c > first_user]
    if not cuts:
        return Rejection(Reason.NO_USER_TURN, "no user message before the regenerated turn")
    if turns == "on_policy":
        prompts = [Conversation(messages[: cuts[0]], tools, meta, later=messages[cuts[0] :])]
    else:
        prompts = [Conversation(messages[:c], tools, meta, reference=reference_at(messages, c, answer)) for c in cuts]
    return _encodable(prompts) or prompts


def reference_at(messages: list[dict[str, Any]], cut: int, answer: str | None) -> str | None:
    """The reference answer of the prompt cut at `cut`: the assistant turn there, or for a conversation that ends
    waiting for it, the row's answer column."""
    return reference_text(messages[cut:]) if cut < len(messages) else answer


def reference_text(answer: list[dict[str, Any]]) -> str | None:
    """The text of the assistant turn a conversation gives at a cut (its leading assistant messages): reasoning,
    content and tool calls' names and arguments, what the target's answer will hold; None when it gives none."""
    parts = []
    for message in answer:
        if message["role"] != "assistant":
            break
        parts += [str(message.get("reasoning_content") or ""), _text(message.get("content")) or ""]
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            parts += [str(function.get("name") or ""), str(function.get("arguments") or "")]
    text = "\n".join(p for p in parts if p)
    return text or None
