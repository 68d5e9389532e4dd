"""On-policy multi-turn regeneration: a conversation answered turn by turn by the target model itself.

Turn k's prompt is what a deployment would render for it: the profile's chat template over the dataset's user turns
and tool results plus the answers the target gave for turns 1..k-1. What the template does with an earlier answer
(Kimi-K2.5 drops the reasoning of past turns) is the template's business, not this module's. Each answer is read back
into an assistant message the way SGLang's chat endpoint reads one, reasoning parser first, then tool-call detector
(sglang 0.5.23: srt/parser/reasoning_parser.py, srt/function_call/kimik2_detector.py, qwen25_detector.py,
qwen3_coder_detector.py, srt/entrypoints/openai/serving_chat.py):

- `reasoning_content`: the text before the reasoning end, or before the first tool call when there is none (a call
  ends reasoning implicitly), kept as generated (no strip since sglang PR 24251); left out when empty.
- `content`: the text after it, up to the first tool call; "" when there is none. The `tagged_json` detector (qwen25)
  strips it, the others keep it as is; text after the calls is dropped, as the detectors drop it.
- `tool_calls`: in order. A `sections` call keeps its arguments as generated and gets the id SGLang gives it, the
  profile's id format at index (calls in the history + its place); a tagged call's arguments are the detector's JSON.

A turn whose calls are the dataset's (same functions, same arguments, in order) is followed by the dataset's recorded
tool results, answering the new calls' ids. Any other difference in calls ends the conversation: the recorded results
would answer calls the model did not make. Its later turns are rejected with `diverged_tool_call`. A turn that was
rejected, cut by the length limit, or cannot be read as a message ends it too (`earlier_turn_unusable`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from regen.chat import ChatRenderer, ModelProfile, TokenRoles
from regen.errors import FinalError
from regen.reasons import Reason
from regen.records import RawAnswer
from regen.tool_calls import BadCall, read_tagged

Message = dict[str, Any]
Decode = Callable[[list[int], bool], str]  # (ids, skip_special_tokens) -> text
STRIPPED_CONTENT = frozenset({"tagged_json"})  # formats whose SGLang detector strips the text before the calls


@dataclass(frozen=True)
class DatasetTurn:
    """One regenerated turn as the dataset recorded it."""

    recorded: list[Message]  # the dataset's assistant messages answering the turn; [] for a final, unanswered one
    then: list[Message]  # the dataset's messages after them, up to the next turn: tool results, a user turn


@dataclass(frozen=True)
class Ended:
    """Why a conversation ends after a turn: its later turns are rejected with this reason."""

    reason: Reason
    detail: str


def dataset_turns(later: list[Message]) -> list[DatasetTurn]:
    """The turns cut from a conversation's messages after its first prompt (normalise.select_prompts, on_policy): a
    turn per run of assistant messages, and one more when the conversation ends waiting for the assistant."""
    turns, i = [], 0
    while True:
        j = i
        while j < len(later) and later[j]["role"] == "assistant":
            j += 1
        k = j
        while k < len(later) and later[k]["role"] != "assistant":
            k += 1
        turns.append(DatasetTurn(later[i:j], later[j:k]))
        if k >= len(later):
            if k > j:
                turns.append(DatasetTurn([], []))
            return turns
        i = k


def turn_count(later_json: str) -> int:
    return len(dataset_turns(json.loads(later_json)))


def calls_of(messages: list[Message]) -> list[tuple[str, Any]]:
    """(function, arguments as a JSON value) of every tool call in the messages, in order."""
    calls = []
    for message in messages:
        for call in message.get("tool_calls") or []:
            arguments = call["function"]["arguments"]
            calls.append(
                (call["function"]["name"], orjson.loads(arguments) if isinstance(arguments, str) else arguments)
            )
    return calls


def after_answer(
    answer: RawAnswer | None,
    prompt_ids: list[int],
    prompt: list[Message],
    tools: list[Message],
    turn: DatasetTurn,
    renderer: ChatRenderer,
) -> list[Message] | Ended:
    """The next turn's prompt messages after this turn's answer (None: the turn was rejected), or why the
    conversation ends here."""
    if answer is None:
        return Ended(Reason.EARLIER_TURN_UNUSABLE, "it was rejected")
    if answer.truncated:
        return Ended(Reason.EARLIER_TURN_UNUSABLE, "it was cut by max_new_tokens")
    roles = renderer.roles
    tail = prompt_ids[-len(roles.generation_suffix) :]
    message = assistant_message(answer.output_ids, tail, roles, renderer.profile, renderer.decode, prompt, tools)
    return message if isinstance(message, Ended) else next_prompt(prompt, message, turn)


class HistoryDrift(FinalError):
    """A resumed conversation renders a finished turn's prompt otherwise than when it was generated."""


def check_resumed(answer: RawAnswer, prompt_ids: list[int]) -> None:
    if answer.prompt_ids is not None and answer.prompt_ids != prompt_ids:
        raise HistoryDrift(
            f"{answer.id}: its prompt renders differently now than when it was generated: the chat template or "
            "tokenizer changed since; use the original one, or start a new version"
        )


def next_prompt(prompt: list[Message], answer: Message, turn: DatasetTurn) -> list[Message] | Ended:
    """The messages of the next turn's prompt: this turn's prompt, the model's answer and what the dataset recorded
    after the turn; or why the conversation ends here."""
    made, recorded = calls_of([answer]), calls_of(turn.recorded)
    if made != recorded:
        return Ended(
            Reason.DIVERGED_TOOL_CALL, f"called {_calls_text(made)}; the dataset called {_calls_text(recorded)}"
        )
    new_ids = [call["id"] for call in answer.get("tool_calls") or []]
    old_ids = [call["id"] for message in turn.recorded for call in message.get("tool_calls") or []]
    renamed = dict(zip(old_ids, new_ids, strict=True))
    then = [
        {**m, "tool_call_id": renamed.get(m["tool_call_id"], m["tool_call_id"])} if m["role"] == "tool" else m
        for m in turn.then
    ]
    return [*prompt, answer, *then]


def _calls_text(calls: list[tuple[str, Any]]) -> str:
    if not calls:
        return "no tool"
    text = ", ".join(f"{name}({json.dumps(arguments, ensure_ascii=False)})" for name, arguments in calls)
    return text if len(text) <= 300 else text[:297] + "..."


def assistant_message(
    output_ids: list[int],
    prompt_tail: list[int],
    roles: TokenRoles,
    profile: ModelProfile,
    decode: Decode,
    history: list[Message],
    tools: list[Message],
) -> Message | Ended:
    """A finished answer (ending in its EOS) as the assistant message a client of SGLang's chat endpoint receives
    and sends back in the next turn's history; or why it cannot be one. `history`: the prompt's messages (a
    `sections` call's id counts the calls in them)."""
    unusable = Reason.EARLIER_TURN_UNUSABLE
    if not output_ids or output_ids[-1] not in roles.eos_ids:
        return Ended(unusable, "the answer does not end with an EOS id")
    ids = list(output_ids[:-1])
    if roles.role_ids.intersection(ids):
        return Ended(unusable, "the answer runs into a next turn (a turn marker in it)")
    grammar = roles.tool_calls
    call_start = None if grammar is None else grammar.section_begin if grammar.sectioned else grammar.call_begin
    reasoning: list[int] = []
    thinking = roles.phase_after(prompt_tail) == "reasoning"
    opens = not thinking and roles.reasoning_start is not None and ids[:1] == [roles.reasoning_start]
    if thinking or opens:  # the prompt opened the reasoning, or the model opens it itself
        body = ids[1:] if opens else ids
        first_call = body.index(call_start) if call_start in body else len(body)
        end = body.index(roles.reasoning_end) if roles.reasoning_end in body else len(body)
        if roles.reasoning_start in body:
            return Ended(unusable, "the answer opens its reasoning twice")
        if end == first_call:  # both absent
            return Ended(unusable, "the answer's reasoning never ended")
        cut = min(end, first_call)
        reasoning, ids = body[:cut], body[cut + 1 if end < first_call else cut :]
    if roles.reasoning_end is not None and roles.reasoning_end in ids:
        return Ended(unusable, "a reasoning end in the answer after its reasoning")
    first_call = ids.index(call_start) if call_start in ids else len(ids)
    skip_special = not tools  # SGLang keeps special tokens in the text when the request has tools
    content = decode(ids[:first_call], skip_special)
    if grammar is not None and grammar.format in STRIPPED_CONTENT:
        content = content.strip()
    message: Message = {"role": "assistant", "content": content}
    if reasoning and (text := decode(reasoning, skip_special)):
        message["reasoning_content"] = text
    if first_call < len(ids):
        assert grammar is not None
        earlier = sum(len(m.get("tool_calls") or []) for m in history)
        try:
            calls = _calls(ids[first_call:], roles, profile, decode, earlier, tools)
        except BadCall as e:
            return Ended(unusable, f"its tool calls cannot be read: {e.detail}")
        message["tool_calls"] = calls
    return message


def _calls(
    ids: list[int], roles: TokenRoles, profile: ModelProfile, decode: Decode, earlier: int, tools: list[Message]
) -> list[Message]:
    grammar = roles.tool_calls
    assert grammar is not None
    calls: list[Message] = []

    def call(name: str, arguments: str) -> None:
        index = earlier + len(calls)
        call_id = profile.tool_call_id_format.format(name=name, index=index, id=f"call_{index}")
        calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})

    bad = Reason.TOOL_CALL_UNBALANCED
    if grammar.sectioned:  # kimi_k2: the calls inside the section; what follows it is dropped
        if grammar.section_end not in ids:
            raise BadCall(bad, "a tool-call section that is not closed")
        ids = ids[: ids.index(grammar.section_end)]
    position = 0
    while grammar.call_begin in ids[position:]:
        begin = ids.index(grammar.call_begin, position)
        if grammar.call_end not in ids[begin:]:
            raise BadCall(bad, "a tool call that is not closed")
        end = ids.index(grammar.call_end, begin)
        position = end + 1
        if not grammar.sectioned:
            for name, arguments in read_tagged(grammar.format, decode(ids[begin + 1 : end], False)):
                typed = _typed(arguments, tools, name) if grammar.format == "tagged_xml" else arguments
                call(name, json.dumps(typed, ensure_ascii=False))
            continue
        if grammar.argument_begin not in ids[begin:end]:
            raise BadCall(bad, "a tool call without its argument token")
        argument_at = ids.index(grammar.argument_begin, begin)
        assert grammar.call_id is not None  # a sections grammar always has its id pattern
        match = grammar.call_id.fullmatch(decode(ids[begin + 1 : argument_at], False).strip())
        if match is None or not match.groupdict().get("name"):
            raise BadCall(Reason.TOOL_CALL_BAD_ID, "a call id that names no function")
        call(match.group("name"), _json_object(decode(ids[argument_at + 1 : end], False).strip()))
    if not calls:
        raise BadCall(bad, "a tool-call marker with no call after it")
    return calls


def _json_object(text: str) -> str:
    """Arguments as SGLang reads them before templating (orjson, regen.chat.as_served): a JSON object, or unusable."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise BadCall(Reason.TOOL_CALL_BAD_ARGUMENTS, f"arguments are not JSON: {e}") from None
    if not isinstance(value, dict):
        raise BadCall(Reason.TOOL_CALL_BAD_ARGUMENTS, "arguments are not a JSON object")
    return text


def _typed(arguments: dict[str, Any], tools: list[Message], name: str) -> dict[str, Any]:
    """XML parameter values as qwen3_coder's detector converts them: by the declared parameter's JSON-schema type
    (a string stays a string; a value that does not convert stays the text)."""
    function: dict[str, Any] = next((t["function"] for t in tools if t["function"]["name"] == name), {})
    properties = (function.get("parameters") or {}).get("properties") or {}
    typed: dict[str, Any] = {}
    for key, value in arguments.items():
        kind = (properties.get(key) or {}).get("type", "string")
        if kind == "string" or not isinstance(value, str):
            typed[key] = value
            continue
        try:
            typed[key] = None if value == "null" else json.loads(value)
        except json.JSONDecodeError:
            typed[key] = value
    return typed
