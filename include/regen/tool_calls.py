"""Tool-call grammars at work: how a model writes its calls (declared in its profile, regen.profiles), read back by
validation and written by the simulator. One format per family of SGLang's tool-call detectors
(sglang/srt/function_call/):

- `sections` (kimi_k2, deepseekv31): `section_begin (call_begin ID argument_begin JSON call_end)+ section_end`, every
  marker one token; ID in the profile's call-id format, JSON the arguments object. How an ID names its function is
  the profile's `tool_call_parser`'s rule (kimi_k2: `functions.NAME:INDEX` and its lenient spellings; deepseekv31:
  the ID is the name), or with none named, the profile's `call_id_format` read literally.
- `tagged_json` (qwen25, Hermes-style; Qwen3 2504): `(call_begin JSON call_end)+`, JSON being
  `{"name": ..., "arguments": {...}}`, written on a line of its own.
- `tagged_xml` (qwen3_coder; Qwen3.5, Qwen3.6): `(call_begin <function=NAME> (<parameter=KEY> VALUE </parameter>)*
  </function> call_end)+`, the inner tags being text, each on a line of its own.

A tagged call is read as leniently as SGLang's detector reads it, so an answer the server would turn into a call is
kept; what the detector would lose (no function name, a parameter whose name never closes, a key given twice, text
that is not part of the call) is a defect. What the detectors make of a whole answer's text, the calls SGLang's chat
API returns, is regen.tool_call_detectors.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from regen.reasons import Reason

# qwen3_coder's reading: a function runs to `</function>` (or the end), a parameter to `</parameter>`, the next
# `<parameter=`, `</function>` or the end; one newline around a value is the template's, not the value's.
XML_FUNCTION = re.compile(r"<function=(.*?)</function>|<function=(.*)$", re.DOTALL)
XML_PARAMETER = re.compile(r"<parameter=(.*?)(?:</parameter>|(?=<parameter=)|(?=</function>)|$)", re.DOTALL)
# kimi_k2's reading of a call id (sglang 0.5.23 function_call/kimik2_detector.py): one run of characters that are not
# whitespace, '<' or '|', with whitespace allowed around it; `[functions.]NAME:INDEX`, the name of word characters,
# '.' and '-'; or a bare counter, whose function is inferred from the declared tools. Any other id loses its call.
SECTION_CALL_ID = re.compile(r"\s*([^\s<|]+)\s*")
SECTION_ID_PARTS = re.compile(r"(?:functions\.)?(?P<name>[\w.\-]+):(?P<index>\d+)")
BARE_COUNTER = re.compile(r"\d+")
FLAG_SPACED_ID = "tool_call_id_spaced"  # whitespace around the call id: SGLang reads it, the drafter sees it
FLAG_UNPREFIXED_ID = "tool_call_id_without_functions_prefix"
FLAG_BARE_ID = "tool_call_id_bare_counter"  # the function inferred from the declared tools, as SGLang infers it


@dataclass(frozen=True)
class ToolCallIds:
    """The grammar resolved against a tokenizer: marker ids, and for `sections` the call ids' pattern."""

    format: str
    call_begin: int
    call_end: int
    section_begin: int | None = None
    section_end: int | None = None
    argument_begin: int | None = None
    call_id: re.Pattern[str] | None = None
    parser: str | None = None  # the profile's tool_call_parser: whose reading of the calls this is
    ends_reasoning: bool = True  # the first call marker ends reasoning (the reasoning parser's tool start)
    reasoning_ends_at: str | None = None  # else the text that does (deepseek-v3: `<tool_call>`), written as text

    @property
    def sectioned(self) -> bool:
        return self.format == "sections"

    def as_record(self) -> dict[str, Any]:
        fields = dataclasses.asdict(self)
        return {
            k: v
            for k, v in fields.items()
            if k not in ("call_id", "parser", "ends_reasoning", "reasoning_ends_at") and v is not None
        }


class BadCall(ValueError):
    """A call the server's detector would lose or garble: the reason validation reports, and what is wrong."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def read_section_call_id(
    text: str,
    tools: Callable[[], list[dict[str, Any]]],
    arguments: str = "",
    parser: str | None = "kimi_k2",
    pattern: re.Pattern[str] | None = None,
) -> tuple[str, tuple[str, ...]]:
    """The function a `sections` call id names, and the flags of an id read only leniently; a BadCall for an id whose
    call the reading loses. `parser`: the profile's tool_call_parser, whose rule reads the id; None: the id must be
    in the profile's call-id format (`pattern`, Profile.call_id_pattern), read literally."""
    if parser == "kimi_k2":
        return _kimi_call_id(text, tools, arguments)
    if parser == "deepseekv31":  # the id is the name, as written (its detector checks it against the tools)
        if not text:
            raise BadCall(Reason.TOOL_CALL_BAD_ID, "an empty function name: SGLang skips the call")
        return text, ()
    if pattern is None:
        raise ValueError(f"tool_call_parser {parser!r} reads no section call ids")
    match = pattern.fullmatch(text)
    if match is None:
        raise BadCall(Reason.TOOL_CALL_BAD_ID, f"call id {text[:80]!r} is not in the profile's call_id_format")
    name = match.groupdict().get("name") or ""
    if "name" in pattern.groupindex and not name.strip():
        raise BadCall(Reason.TOOL_CALL_BAD_ID, f"call id {text[:80]!r} names no function")
    return name, ()


def _kimi_call_id(text: str, tools: Callable[[], list[dict[str, Any]]], arguments: str) -> tuple[str, tuple[str, ...]]:
    """kimi_k2's rule: the function of the id, and the flags of an id SGLang reads only leniently; a BadCall for an
    id whose call SGLang's detector skips. `tools`: asked for only for a bare counter, whose function is inferred from
    them and the call's `arguments` text."""
    whole = SECTION_CALL_ID.fullmatch(text)
    if whole is None:
        raise BadCall(Reason.TOOL_CALL_BAD_ID, f"call id {text[:80]!r}: SGLang skips the call")
    call_id, flags = whole.group(1), (FLAG_SPACED_ID,) if whole.group(1) != text else ()
    parts = SECTION_ID_PARTS.fullmatch(call_id)
    if parts is not None:
        return parts.group("name"), flags + (() if call_id.startswith("functions.") else (FLAG_UNPREFIXED_ID,))
    if BARE_COUNTER.fullmatch(call_id):
        name = inferred_function(tools(), arguments)
        if name is not None:
            return name, (*flags, FLAG_BARE_ID)
    raise BadCall(Reason.TOOL_CALL_BAD_ID, f"call id {call_id[:80]!r} names no function: SGLang skips the call")


def inferred_function(tools: list[dict[str, Any]], arguments: str) -> str | None:
    """The function of a bare-counter call as kimi_k2 infers it: the only tool, or the one whose declared
    properties best match the argument keys (matches minus extras; the first of equals; none without properties)."""
    if not tools:
        return None
    if len(tools) == 1:
        return str(tools[0]["function"]["name"])
    try:
        keys = set(json.loads(arguments).keys())
    except (json.JSONDecodeError, TypeError, AttributeError, RecursionError):
        return None
    best, best_score = None, -1
    for tool in tools:
        properties = set(schema_properties(tool["function"].get("parameters") or {}))
        if not properties:
            continue
        score = len(keys & properties) - len(keys - properties)
        if score > best_score:
            best, best_score = str(tool["function"]["name"]), score
    return best


def schema_properties(schema: Any) -> dict[str, Any]:
    """A schema's top-level properties, or those of its anyOf/oneOf/allOf branches when it declares none (SGLang's
    `get_schema_properties`)."""
    if not isinstance(schema, dict):
        return {}
    if isinstance(schema.get("properties"), dict):
        return dict(schema["properties"])
    merged: dict[str, Any] = {}
    for keyword in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(keyword)
        for branch in branches if isinstance(branches, list) else []:
            for key, value in schema_properties(branch).items():
                merged.setdefault(key, value)
    return merged


def read_tagged(format: str, text: str) -> list[tuple[str, dict[str, Any]]]:
    """The calls (function name, arguments) in the text between a tagged call's begin and end tokens."""
    return _read_json(text) if format == "tagged_json" else _read_xml(text)


def write_tagged(format: str, name: str, arguments: dict[str, Any]) -> str:
    """The text between the begin and end tokens, as the model writes it (and its template renders a past call)."""
    if format == "tagged_json":
        return f'\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {_json(arguments)}}}\n'
    values = "".join(
        f"<parameter={key}>\n{value if isinstance(value, str) else _json(value)}\n</parameter>\n"
        for key, value in arguments.items()
    )
    return f"\n<function={name}>\n{values}</function>\n"


def arguments_problem(text: str) -> str | None:
    """Why `text` is not tool-call arguments SGLang can carry into the next request, or None. Its chat layer reads
    the arguments of every call in a request's history with orjson and answers a 400 unless they are a JSON object;
    so a history call that fails this is rejected at prepare, and an answer's call that fails it at validate."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        return f"not JSON: {e}"
    return None if isinstance(value, dict) else "JSON but not an object"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _read_json(text: str) -> list[tuple[str, dict[str, Any]]]:
    try:
        call = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise BadCall(Reason.TOOL_CALL_BAD_ARGUMENTS, f"the call is not JSON: {e}") from None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        raise BadCall(Reason.TOOL_CALL_MALFORMED, f"the call names no function: {text.strip()[:80]!r}")
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict):
        raise BadCall(Reason.TOOL_CALL_BAD_ARGUMENTS, f"arguments of {call['name']!r} are not a JSON object")
    return [(call["name"], arguments)]


def _read_xml(text: str) -> list[tuple[str, dict[str, Any]]]:
    functions = list(XML_FUNCTION.finditer(text))
    if not functions:
        raise BadCall(Reason.TOOL_CALL_MALFORMED, f"no <function=NAME> in the call: {text.strip()[:80]!r}")
    outside = XML_FUNCTION.sub("", text).strip()
    if outside:
        raise BadCall(Reason.TOOL_CALL_MALFORMED, f"text in the call outside its function: {outside[:80]!r}")
    calls = []
    for match in functions:
        body = match.group(1) if match.group(1) is not None else match.group(2)
        name, closed, parameters = body.partition(">")
        if not closed or not name:
            raise BadCall(Reason.TOOL_CALL_MALFORMED, f"function name not closed: {body[:80]!r}")
        arguments: dict[str, Any] = {}
        for parameter in XML_PARAMETER.finditer(parameters):
            key, closed, value = parameter.group(1).partition(">")
            if not closed:
                raise BadCall(Reason.TOOL_CALL_BAD_ARGUMENTS, f"parameter name not closed in {name!r}: {key[:60]!r}")
            if key in arguments:
                raise BadCall(Reason.TOOL_CALL_BAD_ARGUMENTS, f"parameter {key!r} given twice in {name!r}")
            arguments[key] = value.removeprefix("\n").removesuffix("\n")
        calls.append((name, arguments))
    return calls
