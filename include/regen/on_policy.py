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
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import orjson

from regen.chat import ChatRenderer, TokenRoles
from regen.chat_request import standard_tools
from regen.errors import FinalError
from regen.judge import judge_output
from regen.profiles import Profile, SectionCalls, TaggedCalls
from regen.reasons import Reason
from regen.records import RawAnswer
from regen.tool_call_detectors import read_deepseek_calls, read_xml_calls
from regen.tool_calls import BadCall, read_section_call_id, read_tagged

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
    """The turns cut from a conversation's messages after its first prompt (normalize.select_prompts, on_policy): a
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
    profile: Profile,
    decode: Decode,
    history: list[Message],
    tools: list[Message],
) -> Message | Ended:
    """A finished answer (ending in its EOS) as the assistant message a client of SGLang's chat endpoint receives
    and sends back in the next turn's history; or why it cannot be one: an answer validation would not keep is no
    history to build on (validate.judge_output, the same verdict validate gives the turn). `history`: the prompt's
    messages (a `sections` call's id counts the calls in them)."""
    if not output_ids or output_ids[-1] not in roles.eos_ids:
        return Ended(Reason.EARLIER_TURN_UNUSABLE, "the answer does not end with an EOS id")
    outside = next((i for i in output_ids if not 0 <= i < roles.vocab_size), None)
    if outside is not None:  # judge_output reads ids inside the vocabulary only (validate rejects it: id_out_of_vocab)
        return Ended(Reason.EARLIER_TURN_UNUSABLE, f"id {outside} outside the vocabulary of {roles.vocab_size}")
    phase = roles.phase_after(prompt_tail)
    names = frozenset(tool["function"]["name"] for tool in tools) or None
    verdict = judge_output(list(output_ids), roles, names, lambda ids: decode(ids, False), phase, lambda: tools)
    if verdict.split != "train":
        return Ended(Reason.EARLIER_TURN_UNUSABLE, f"{verdict.verdict}: {verdict.detail}")
    # The detokenizer's text: the stop id trimmed, special tokens kept when the request has tools (serving_chat).
    text = decode(list(output_ids[:-1]), not tools)
    return read_message(text, phase == "reasoning", profile, history, tools)


def read_message(text: str, forced: bool, profile: Profile, history: list[Message], tools: list[Message]) -> Message:
    """The message SGLang's chat layer reads from an answer's text: its reasoning parser, then its tool-call detector
    when the request declares tools. `forced`: the prompt opened the reasoning."""
    grammar = profile.tool_calls
    tool_start = None if grammar is None else grammar.tokens().get("section_begin", grammar.call_begin)
    interrupt = profile.reasoning_tool_start
    reasoning, normal = split_reasoning(text, forced, profile.reasoning_start, profile.reasoning_end, interrupt)
    content, calls = normal, []
    if grammar is not None and tool_start is not None and tools and tool_start in normal:
        content = normal[: normal.index(tool_start)]
        earlier = sum(len(m.get("tool_calls") or []) for m in history)
        if isinstance(grammar, SectionCalls) and profile.tool_call_parser == "deepseekv31":
            content, found = read_deepseek_calls(
                normal, grammar.section_begin, grammar.call_begin, grammar.argument_begin, grammar.call_end, tools
            )
        elif isinstance(grammar, SectionCalls):
            found = _section_calls(normal, profile, grammar, tools)
        elif grammar.format == "tagged_xml":
            xml = read_xml_calls(normal, grammar.call_begin, grammar.call_end, standard_tools(tools))
            found, content = (xml, content) if xml is not None else ([], normal)  # None: the detector failed
        else:
            found = _tagged_calls(normal[len(content) :], grammar, tools)
        calls = [_call(name, arguments, earlier + i, profile) for i, (name, arguments) in enumerate(found)]
        if grammar.format in STRIPPED_CONTENT:
            content = content.strip()
    message: Message = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return message


def split_reasoning(
    text: str, forced: bool, start: str | None, end: str | None, tool_start: str | None
) -> tuple[str, str]:
    """(reasoning, the rest) as SGLang's reasoning parsers split a whole answer (parser/reasoning_parser.py,
    `BaseReasoningFormatDetector.detect_and_parse`): in reasoning when the prompt opened it or the text holds a
    reasoning start; every leading start stripped; up to the first reasoning end, or without one up to the first tool
    call, or else all of it."""
    if start is None or end is None or not (forced or start in text):
        return "", text
    while text.startswith(start):
        text = text[len(start) :]
    if end in text:
        reasoning, _, rest = text.partition(end)
        return reasoning, rest
    at = text.find(tool_start) if tool_start else -1
    return (text[:at], text[at:]) if at != -1 else (text, "")


def _call(name: str, arguments: str, index: int, profile: Profile) -> Message:
    """A call with the id SGLang gives it (`_process_tool_call_id`): for kimi_k2, the profile's id format at the
    calls in the history plus its place in the answer; for the tagged formats SGLang's ids are random, and their
    templates do not print them."""
    call_id = profile.tool_call_id_format.format(name=name, index=index, id=f"call_{index}")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _section_calls(text: str, profile: Profile, grammar: SectionCalls, tools: list[Message]) -> list[tuple[str, str]]:
    """kimi_k2's detector (function_call/kimik2_detector.py `detect_and_parse`): every call in the text, in every
    section, arguments as written; a call whose id names no function is skipped. With no parser named, the declared
    grammar's: every `call_begin ID argument_begin ARGUMENTS call_end`, its id read by the profile's format."""
    calls = []
    pattern = profile.call_id_pattern()
    for call_id, arguments in section_call_pattern(grammar, profile.tool_call_parser).findall(text):
        try:
            name, _ = read_section_call_id(call_id, lambda: tools, arguments, profile.tool_call_parser, pattern)
        except BadCall:
            continue
        calls.append((name, arguments))
    return calls


@cache
def section_call_pattern(grammar: SectionCalls, parser: str | None = "kimi_k2") -> re.Pattern[str]:
    if parser != "kimi_k2":
        between = re.escape(grammar.call_begin), re.escape(grammar.argument_begin), re.escape(grammar.call_end)
        return re.compile("{}(.*?){}(.*?){}".format(*between), re.DOTALL)
    return re.compile(
        re.escape(grammar.call_begin)
        + r"\s*([^\s<|]+)\s*"
        + re.escape(grammar.argument_begin)
        + r"\s*(\{.*?\})\s*"
        + re.escape(grammar.call_end),
        re.DOTALL,
    )


def _tagged_calls(text: str, grammar: TaggedCalls, tools: list[Message]) -> list[tuple[str, str]]:
    """The calls of the tagged_json grammar (qwen25), each between its begin and end marker."""
    calls = []
    for piece in text.split(grammar.call_begin)[1:]:
        body = piece.partition(grammar.call_end)[0]
        for name, arguments in read_tagged(grammar.format, body):
            calls.append((name, json.dumps(arguments, ensure_ascii=False)))
    return calls
