"""Every answer judged on its ids, against the profile's token roles; nothing here knows a model. Pure: no disk,
no network (the validate stage, regen.stages.validate, reads and writes around it; on-policy turns and the fleet
check ask it too).

`judge` finds the output's structural tokens (EOS, turn markers, reasoning and tool-call tokens) in one vectorized
lookup, then walks only those positions through a small state machine:

    [reasoning_start at 0, if the prompt did not open reasoning]  reasoning ... reasoning_end
    answer, and tool calls in the profile's grammar (regen.tool_calls)   EOS

with calls as `section_begin (call_begin ID argument_begin {JSON} call_end)+ section_end` (Kimi's sections), or as
`(call_begin BODY call_end)+` whose body is read as SGLang's detector reads it (tagged JSON or XML, Qwen's).
An answer is judged by what SGLang 0.5.23's reasoning parser and tool-call detector make of it (tests/parity/): a
usable message is kept, flagged where they read it only leniently; what they lose or garble is rejected.
- Tool calls right after the reasoning with no reasoning_end (Kimi-K2.5 emits them; the first section ends the
  reasoning): kept, `tool_call_without_reasoning_end`. A reasoning end after such a section: rejected
  (`tool_call_in_reasoning`), since SGLang then reads the calls as reasoning.
- The reasoning start repeated at the very start (SGLang strips every leading one): kept, `reasoning_start_repeated`.
- A section left open at EOS, an empty section: kept, `tool_call_section_unclosed` / `tool_call_section_empty`.
- Call ids SGLang reads leniently (whitespace around, no `functions.` prefix, a bare counter): kept, flagged
  (regen.tool_calls); one it skips: rejected.
- A marker spelt in ordinary tokens: rejected (`markup_as_text`): SGLang's parsers read the text, so read markup.
An answer cut by `max_new_tokens` that is valid so far goes to the flagged `truncated/` split, by where the cut fell.
The server must agree with itself: `text == decode(output_ids)` and `prompt_tokens` == the prompt sent.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from functools import cache
from typing import Any

import numpy as np

from regen.chat import TokenRoles
from regen.chat_request import standard_tools
from regen.reasons import OK, Reason, split_of
from regen.records import RawAnswer, text_digest
from regen.tool_call_detectors import read_xml_calls, redumped_arguments
from regen.tool_calls import BadCall, arguments_problem, read_section_call_id, read_tagged

FLAG_NO_REASONING_END = "tool_call_without_reasoning_end"
FLAG_START_REPEATED = "reasoning_start_repeated"
FLAG_SECTION_UNCLOSED = "tool_call_section_unclosed"
FLAG_SECTION_EMPTY = "tool_call_section_empty"
FLAG_MARKUP_STRAY = "tool_call_markup_stray"  # a call outside a section, a marker closing nothing: read all the same
Decode = Callable[[list[int]], str]


class Mark(IntEnum):
    """What a structural token is; 0 (no mark) for every ordinary token."""

    EOS = 1
    ROLE = 2
    REASONING_START = 3
    REASONING_END = 4
    SECTION_BEGIN = 5
    SECTION_END = 6
    CALL_BEGIN = 7
    ARGUMENT_BEGIN = 8
    CALL_END = 9


@cache
def mark_table(roles: TokenRoles) -> np.ndarray:
    """id -> Mark, over the whole vocabulary: one gather finds every structural token of an output."""
    table = np.zeros(roles.vocab_size, dtype=np.int8)
    table[list(roles.role_ids)] = Mark.ROLE
    table[list(roles.eos_ids)] = Mark.EOS
    for token, mark in ((roles.reasoning_start, Mark.REASONING_START), (roles.reasoning_end, Mark.REASONING_END)):
        if token is not None:
            table[token] = mark
    calls = roles.tool_calls
    if calls:
        for token, mark in (
            (calls.section_begin, Mark.SECTION_BEGIN),
            (calls.section_end, Mark.SECTION_END),
            (calls.call_begin, Mark.CALL_BEGIN),
            (calls.argument_begin, Mark.ARGUMENT_BEGIN),
            (calls.call_end, Mark.CALL_END),
        ):
            if token is not None:
                table[token] = mark
    return table


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: str  # "ok" or a Reason value
    detail: str = ""
    flags: tuple[str, ...] = ()
    reasoning_len: int = 0  # output ids up to and including the end of reasoning
    tool_calls: int = 0
    decoded: str | None = None  # decode(output_ids), when it was computed

    @property
    def split(self) -> str | None:
        return split_of(self.verdict)


def _reject(reason: Reason, detail: str) -> Judgement:
    return Judgement(reason.value, detail)


@dataclass
class _Walk:
    """The state machine over an output's structural tokens."""

    output: list[int]
    roles: TokenRoles
    tools: frozenset[str] | None  # declared function names; None: the prompt declares no tools
    decode: Decode
    phase: str = "answer"  # reasoning | answer | off (reasoning turned off by the prompt)
    schemas: Callable[[], list[dict[str, Any]]] = list  # the declared tools, read where a bare call id needs them
    reasoning_len: int = 0
    flags: list[str] = field(default_factory=list)
    in_section: bool = False
    section_calls: int = 0
    sections: bool = False  # a section began: the content ended there
    ended_by_section: bool = False  # the reasoning ended at a tool section, not at its end token
    call: str = ""  # "" outside a call; sections: "id" after call_begin, "args" after argument_begin; tagged: "body"
    call_start: int = 0
    id_text: str = ""
    calls: int = 0

    def step(self, pos: int, mark: int) -> Judgement | None:
        if mark == Mark.EOS:
            return None if pos == len(self.output) - 1 else _reject(Reason.EOS_NOT_AT_END, f"EOS at {pos}")
        if mark == Mark.ROLE:
            return _reject(Reason.ROLE_TOKEN_IN_OUTPUT, f"turn marker {self.output[pos]} at {pos}")
        if mark == Mark.REASONING_START:
            if pos == 0 and self.phase == "answer":  # a model that opens its reasoning itself (prompt did not)
                self.phase = "reasoning"
                return None
            if self.phase == "reasoning" and all(t == self.roles.reasoning_start for t in self.output[:pos]):
                self._flag(FLAG_START_REPEATED)  # SGLang strips every leading one
                return None
            return _reject(Reason.REASONING_START_IN_OUTPUT, f"reasoning start at {pos}")
        if mark == Mark.REASONING_END:
            return self._reasoning_end(pos)
        return self._tool_token(pos, mark)

    def _reasoning_end(self, pos: int) -> Judgement | None:
        if self.phase == "reasoning":
            self.phase, self.reasoning_len = "answer", pos + 1
            return None
        if self.ended_by_section:
            return _reject(
                Reason.TOOL_CALL_IN_REASONING,
                f"reasoning end at {pos} after a tool section: SGLang reads all before it as reasoning, calls too",
            )
        if self.phase == "off":
            return _reject(Reason.UNEXPECTED_REASONING_END, f"reasoning end at {pos}, but the prompt closed reasoning")
        return _reject(Reason.REASONING_END_REPEATED, f"second reasoning end at {pos}")

    def _tool_token(self, pos: int, mark: int) -> Judgement | None:
        calls = self.roles.tool_calls
        assert calls is not None  # tool marks exist only for a profile with a grammar
        if self.tools is None:  # SGLang parses no calls for a request without tools: the markup stays in the text
            return _reject(Reason.TOOL_CALL_WITHOUT_TOOLS, f"{Mark(mark).name.lower()} at {pos}, but no tools declared")
        if calls.sectioned:
            return self._section_token(pos, mark)
        if mark == Mark.CALL_BEGIN and not self.call:
            self.call, self.call_start = "body", pos
            return self._tools_start(pos)
        if mark == Mark.CALL_END and self.call == "body":
            self.call = ""
            return self._tagged(self.output[self.call_start + 1 : pos], pos, calls.format)
        return _reject(Reason.TOOL_CALL_UNBALANCED, f"{Mark(mark).name.lower()} out of order at {pos}")

    def _section_token(self, pos: int, mark: int) -> Judgement | None:
        """kimi_k2's reading: the content ends at the first section; after it, every `call_begin ID argument_begin
        {JSON} call_end` is a call, in a section or not; other markers there lose nothing."""
        name = Mark(mark).name.lower()
        if self.call == "id":
            if mark != Mark.ARGUMENT_BEGIN:
                return _reject(Reason.TOOL_CALL_UNBALANCED, f"{name} in a call id at {pos}: SGLang skips the call")
            self.call = "args"
            return self._call_id(self.output[self.call_start + 1 : pos], pos)
        if self.call == "args":
            if mark != Mark.CALL_END:
                return _reject(Reason.TOOL_CALL_UNBALANCED, f"{name} in a call's arguments at {pos}")
            self.call = ""
            return self._arguments(self.output[self.call_start + 1 : pos], pos)
        if mark == Mark.SECTION_BEGIN:
            if (rejected := self._tools_start(pos)) is not None:
                return rejected
            if self.in_section:  # the one before was never closed
                self._flag(FLAG_SECTION_UNCLOSED if self.section_calls else FLAG_SECTION_EMPTY)
            self.in_section, self.sections, self.section_calls = True, True, 0
            return None
        if not self.sections:
            return _reject(Reason.TOOL_CALL_UNBALANCED, f"{name} at {pos} before any section: SGLang leaves it as text")
        if mark == Mark.CALL_BEGIN:
            self.call, self.call_start = "id", pos
            if not self.in_section:
                self._flag(FLAG_MARKUP_STRAY)
            return None
        if mark == Mark.SECTION_END and self.in_section:
            self._close_section()
            self.in_section = False
            return None
        self._flag(FLAG_MARKUP_STRAY)  # an end with nothing to end: SGLang's detector passes over it
        return None

    def _close_section(self) -> None:
        if self.in_section and not self.section_calls:
            self._flag(FLAG_SECTION_EMPTY)

    def _flag(self, flag: str) -> None:
        if flag not in self.flags:
            self.flags.append(flag)

    def _tools_start(self, pos: int) -> Judgement | None:
        if self.phase != "reasoning":
            return None
        calls = self.roles.tool_calls
        if calls is not None and not calls.ends_reasoning:  # e.g. deepseek-v3's parser ends reasoning at <tool_call>
            ends_at = calls.reasoning_ends_at
            if not ends_at or ends_at not in self.decode(self.output[:pos]):
                return _reject(Reason.TOOL_CALL_IN_REASONING, f"tool call at {pos}: SGLang reads it as reasoning")
            # That text, written before this call, ended the reasoning for SGLang: the call is in the answer, and a
            # reasoning end after it is one too many (not a section closing the reasoning).
            self.phase, self.reasoning_len = "answer", pos
            self._flag(FLAG_NO_REASONING_END)
            return None
        # The first call marker ends reasoning implicitly.
        self.phase, self.reasoning_len, self.ended_by_section = "answer", pos, True
        self._flag(FLAG_NO_REASONING_END)
        return None

    def _call_id(self, ids: list[int], pos: int) -> Judgement | None:
        self.id_text, self.call_start = self.decode(ids), pos
        return None

    def _arguments(self, ids: list[int], pos: int) -> Judgement | None:
        """The arguments must be what SGLang can send back in the next turn: a JSON object to orjson (its detector
        keeps the text as it is; the next request with it in the history is answered with a 400 otherwise)."""
        text = self.decode(ids)
        grammar = self.roles.tool_calls
        assert grammar is not None
        if grammar.parser == "deepseekv31":  # its detector re-dumps what Python's json reads: judge what it returns
            try:
                text = redumped_arguments(text)
            except BadCall as e:
                return _reject(e.reason, f"arguments of call at {pos}: {e.detail}")
        problem = arguments_problem(text)
        if problem:
            return _reject(Reason.TOOL_CALL_BAD_ARGUMENTS, f"arguments of call at {pos} are {problem}")
        try:
            name, flags = read_section_call_id(self.id_text, self.schemas, text, grammar.parser, grammar.call_id)
        except BadCall as e:
            return _reject(e.reason, f"call at {self.call_start}: {e.detail}")
        for flag in flags:
            self._flag(flag)
        self.section_calls += 1
        return self._called(name)

    def _tagged(self, ids: list[int], pos: int, format: str) -> Judgement | None:
        text = self.decode(ids)
        try:
            calls = read_tagged(format, text)
        except BadCall as e:
            return _reject(e.reason, f"call at {pos}: {e.detail}")
        grammar = self.roles.tool_calls
        if format == "tagged_xml" and grammar is not None:  # values typed as qwen3_coder types them must be JSON
            begin, end = self.decode([grammar.call_begin]), self.decode([grammar.call_end])
            if read_xml_calls(f"{begin}{text}{end}", begin, end, standard_tools(self.schemas())) is None:
                return _reject(
                    Reason.TOOL_CALL_BAD_ARGUMENTS,
                    f"call at {pos}: a value typed by its schema is not JSON (a Python set?): SGLang drops every call",
                )
        for name, _ in calls:
            rejected = self._called(name)
            if rejected is not None:
                return rejected
        return None

    def _called(self, name: str) -> Judgement | None:
        """A well-formed call: to a function the prompt declares (a name-less call id cannot be looked up)."""
        if self.tools is None:
            return _reject(Reason.TOOL_CALL_WITHOUT_TOOLS, f"call to {name!r}, but the prompt declares no tools")
        if name and name not in self.tools:
            return _reject(Reason.TOOL_CALL_UNDECLARED, f"call to {name!r}; declared: {sorted(self.tools)[:10]}")
        self.calls += 1
        return None

    def finish(self, truncated: bool) -> Judgement:
        last = self.output[-1]
        if truncated:
            where = Reason.TRUNCATED_IN_REASONING if self.phase == "reasoning" else Reason.TRUNCATED_IN_ANSWER
            return Judgement(where.value, "", tuple(self.flags), self.reasoning_len, self.calls)
        if last not in self.roles.eos_ids:
            return _reject(Reason.NO_EOS_AT_END, f"stopped on {last}, not an EOS id")
        if self.call:
            return _reject(Reason.TOOL_CALL_UNBALANCED, "a tool call not closed before EOS: SGLang loses it")
        if self.in_section:  # SGLang reads the calls in it all the same
            self._flag(FLAG_SECTION_UNCLOSED if self.section_calls else FLAG_SECTION_EMPTY)
            self.in_section = False
        if self.phase == "reasoning":
            return _reject(Reason.REASONING_END_MISSING, "reasoning never ended")
        return Judgement(OK, "", tuple(self.flags), self.reasoning_len, self.calls)


def _text_problem(answer: RawAnswer, decoded: str) -> str | None:
    """Why the server's text is not decode(output_ids), or None when it is.

    At a length cut SGLang's detokenizer writes an unfinished UTF-8 character as U+FFFD, exactly as decode does (read
    from its detokenizer_manager: the hold-back of a trailing U+FFFD applies only to unfinished requests); a count of
    trailing U+FFFD that differs is still tolerated there, and only there. Nothing else may differ."""
    if answer.text_digest is None:
        return "the server sent no text (started with --skip-tokenizer-init?): its detokenizer cannot be checked"
    digest, tail = text_digest(decoded)
    if digest != answer.text_digest:
        return "the server's text is not decode(output_ids): it detokenizes with another tokenizer or settings"
    if tail != answer.text_replacement_tail and not answer.truncated:
        return f"{answer.text_replacement_tail} trailing U+FFFD in the server's text, {tail} in decode(output_ids)"
    return None


def judge(
    prompt_ids: np.ndarray | list[int],
    answer: RawAnswer,
    roles: TokenRoles,
    tools: frozenset[str] | None,
    decode: Decode,
    schemas: Callable[[], list[dict[str, Any]]] = list,
) -> Judgement:
    """The verdict for one record, from its ids: "ok", a truncation split, or the first defect found. `decode` is
    only ever given ids inside the vocabulary; `schemas`: the declared tools, where a bare call id must be read."""
    suffix = roles.generation_suffix
    ending = tuple(int(i) for i in prompt_ids[-len(suffix) :])
    if ending != suffix:
        return _reject(Reason.PROMPT_SUFFIX, f"prompt ends {list(ending)}, expected {list(suffix)}")
    output = answer.output_ids
    if not output:
        return _reject(Reason.EMPTY_OUTPUT, "no output ids")
    ids = np.asarray(output, dtype=np.int64)  # int64 first: an id of 2**31 or more must be seen, not wrapped
    if ids.min() < 0 or ids.max() >= roles.vocab_size:
        bad = int(ids[(ids < 0) | (ids >= roles.vocab_size)][0])
        return _reject(Reason.ID_OUT_OF_VOCAB, f"id {bad} outside the vocabulary of {roles.vocab_size}")
    prompt_tokens = answer.meta_info.get("prompt_tokens")
    if prompt_tokens != len(prompt_ids):
        detail = f"sent {len(prompt_ids)} prompt ids, server counted {prompt_tokens}"
        return _reject(Reason.PROMPT_TOKENS_MISMATCH, detail)
    judgement = judge_output(output, roles, tools, decode, roles.opening_phase, schemas, answer.truncated, ids)
    if judgement.split is None:
        return judgement
    decoded = judgement.decoded if judgement.decoded is not None else decode(output)
    problem = _text_problem(answer, decoded)
    if problem is not None:
        return _reject(Reason.TEXT_MISMATCH, problem)
    return dataclasses.replace(judgement, decoded=decoded)


def judge_output(
    output: list[int],
    roles: TokenRoles,
    tools: frozenset[str] | None,
    decode: Decode,
    phase: str,
    schemas: Callable[[], list[dict[str, Any]]] = list,
    truncated: bool = False,
    ids: np.ndarray | None = None,
) -> Judgement:
    """The verdict on the output's own structure (ids already known to be inside the vocabulary), from the phase the
    prompt left it in (`TokenRoles.phase_after`). `ids`: the output as an array, where the caller has it already."""
    ids = np.asarray(output, dtype=np.int64) if ids is None else ids
    walk = _Walk(output, roles, tools, decode, phase=phase, schemas=schemas)
    marks = mark_table(roles)[ids]
    for pos in np.flatnonzero(marks).tolist():
        rejected = walk.step(pos, int(marks[pos]))
        if rejected is not None:
            return rejected
    judgement = walk.finish(truncated)
    if judgement.split is None:
        return judgement
    decoded = decode(output)
    for token in _markup_ids(roles):  # SGLang's parsers read the text: a marker spelt in ordinary tokens is markup
        marker = decode([token])
        if marker and decoded.count(marker) > int(np.count_nonzero(ids == token)):
            return _reject(Reason.MARKUP_AS_TEXT, f"{marker!r} spelt in ordinary tokens: SGLang reads it as markup")
    return dataclasses.replace(judgement, decoded=decoded)


@cache
def _markup_ids(roles: TokenRoles) -> tuple[int, ...]:
    """The reasoning and tool-call markers' ids (not EOS, not turn markers: no parser reads those in an answer)."""
    return tuple(int(t) for t in np.flatnonzero(mark_table(roles) >= Mark.REASONING_START))


def declared_tools(tools_json: str) -> frozenset[str] | None:
    """The function names a prompt declares (its stored `tools` column); None when it declares none."""
    tools = json.loads(tools_json) if tools_json else []
    names = frozenset(t["function"]["name"] for t in tools)
    return names or None
