"""Whole answers read as SGLang 0.5.23's tool-call detectors read them (`detect_and_parse`), into the calls its chat
API hands back: (function name, arguments as JSON text). Where regen.tool_calls judges one call against the grammar,
this is what the server makes of an answer's text as a whole, quirks included:

- qwen3_coder (`tagged_xml`) types each parameter's text by the declared parameter's schema (`xml_value`), and fails
  as a whole on a value JSON cannot hold;
- deepseekv31 (`sections`, the id the name) re-dumps the arguments from Python's `json.loads`, and fails as a whole
  on arguments that do not load or a call with no separator.

On-policy conversations carry these calls into the next turn's history (regen.on_policy); validation rejects an
answer whose calls the detector would drop (regen.judge).
"""

from __future__ import annotations

import json
import re
from typing import Any

from regen.reasons import Reason
from regen.tool_calls import XML_FUNCTION, XML_PARAMETER, BadCall, schema_properties


def read_xml_calls(text: str, begin: str, end: str, tools: list[dict[str, Any]]) -> list[tuple[str, str]] | None:
    """Every call qwen3_coder's detector reads in an answer's text (sglang 0.5.23 function_call/qwen3_coder_detector.py
    `detect_and_parse`): each `begin ... end` block (or, when none closes, the whole text), each function in it with a
    name, each parameter in it with a name, its value typed by the declared parameter (`xml_value`); the arguments as
    its JSON text. None where the detector fails as a whole (a value JSON cannot hold): SGLang then returns the text
    as content, with no calls. `tools`: as SGLang holds them, their type names made standard (regen.chat_request)."""
    if begin not in text:
        return []
    blocks = re.findall(re.escape(begin) + "(.*?)" + re.escape(end), text, re.DOTALL)
    if not blocks and "<function=" in text:
        blocks = [text]
    calls = []
    for block in blocks:
        for closed, open_ended in XML_FUNCTION.findall(block):
            body = closed or open_ended
            if ">" not in body:
                continue
            name, _, parameters = body.partition(">")
            declared = arguments_config(name, tools)
            values = {}
            for parameter in XML_PARAMETER.findall(parameters):
                if ">" not in parameter:
                    continue
                key, _, value = parameter.partition(">")
                values[key] = xml_value(value.removeprefix("\n").removesuffix("\n"), key, declared)
            try:
                calls.append((name, json.dumps(values, ensure_ascii=False)))
            except (TypeError, ValueError):
                return None
    return calls


def redumped_arguments(text: str) -> str:
    """A deepseekv31 call's arguments as its detector returns them: Python's `json.loads`, re-dumped (a falsy value
    as {}, `parse_base_json`); a BadCall where they do not load (the detector then drops every call)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise BadCall(
            Reason.TOOL_CALL_BAD_ARGUMENTS, f"not JSON to Python's json ({e}): SGLang drops every call"
        ) from e
    return json.dumps(value or {}, ensure_ascii=False)


def read_deepseek_calls(
    text: str, begin: str, call_begin: str, separator: str, call_end: str, tools: list[dict[str, Any]]
) -> tuple[str, list[tuple[str, str]]]:
    """(content, calls) as deepseekv31's detector reads a text holding its section begin (sglang 0.5.23
    function_call/deepseekv31_detector.py `detect_and_parse`, then serving_chat): the content is the text before the
    section, stripped; a call is each `call_begin NAME separator JSON call_end` anywhere in the text (NAME up to the
    last separator), to a declared function, its arguments re-dumped from Python's `json.loads` (a falsy value as
    {}). Arguments that do not load, or a call with no separator, fail the detector as a whole: the whole text is the
    content, with no calls."""
    content = text[: text.find(begin)].strip()
    detail = re.compile(f"{re.escape(call_begin)}(.*){re.escape(separator)}(.*){re.escape(call_end)}", re.DOTALL)
    names = {(tool.get("function") or {}).get("name") for tool in tools}
    calls = []
    for match in re.findall(f"{re.escape(call_begin)}.*?{re.escape(call_end)}", text, re.DOTALL):
        parts = detail.search(match)
        if parts is None:
            return text, []
        try:
            arguments = redumped_arguments(parts.group(2))
        except BadCall:
            return text, []
        if parts.group(1) and parts.group(1) in names:
            calls.append((parts.group(1), arguments))
    return content, calls


def arguments_config(name: str, tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The declared parameters of a function, as qwen3_coder looks them up."""
    for tool in tools:
        function = tool.get("function") or {}
        if tool.get("type", "function") == "function" and function.get("name") == name:
            parameters = function.get("parameters")
            if not isinstance(parameters, dict):
                return {}
            properties = schema_properties(parameters)
            return properties if properties or "properties" in parameters else parameters
    return {}


def xml_value(value: str, key: str, declared: dict[str, Any]) -> Any:
    """A parameter's text typed as qwen3_coder types it, by the declared parameter's type: null; a string as it is;
    integers and numbers as Python reads them (else the text); booleans true/false (anything else false); objects
    and arrays as JSON, then as a Python literal (else the text); an undeclared parameter as its text."""
    if value.lower() == "null":
        return None
    if key not in declared:
        return value
    kind = str(schema_type(declared[key]) or "string").strip().lower()
    if kind in ("string", "str", "text", "varchar", "char", "enum"):
        return value
    if kind.startswith(("int", "uint", "long", "short", "unsigned")):
        try:
            return int(value)
        except ValueError:
            return value
    if kind.startswith(("num", "float")):
        try:
            number = float(value)
        except ValueError:
            return value
        return int(number) if "." not in value and "e" not in value.lower() and number.is_integer() else number
    if kind in ("boolean", "bool", "binary"):
        return value.lower() == "true"
    if kind in ("object", "array", "arr") or kind.startswith(("dict", "list")):
        try:
            return json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            pass
    return python_literal(value)


def python_literal(value: str) -> Any:
    """`ast.literal_eval` of the text, quietly (SGLang's `safe_literal_eval`); the text itself where it is none."""
    import ast
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=SyntaxWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        try:
            return ast.literal_eval(value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return value


def schema_type(schema: Any) -> Any:
    """The primary type of a parameter's schema, as SGLang's `infer_type_from_json_schema` finds it."""
    if not isinstance(schema, dict):
        return None
    if "type" in schema:
        kind = schema["type"]
        if isinstance(kind, str):
            return kind
        if isinstance(kind, list) and kind:
            return next((k for k in kind if k != "null"), "string")
    if "anyOf" in schema or "oneOf" in schema:
        branches = schema.get("anyOf") or schema.get("oneOf")
        kinds = [k for k in (schema_type(b) for b in branches) if k] if isinstance(branches, list) else []
        if kinds:
            if len(set(kinds)) == 1:
                return kinds[0]
            if len(set(kinds)) == 2 and "null" in kinds:
                return next(k for k in kinds if k != "null")
            return "string" if "string" in kinds else kinds[0]
    if isinstance(schema.get("enum"), list):
        return _enum_type(schema["enum"])
    if isinstance(schema.get("allOf"), list):
        return next((k for k in (schema_type(b) for b in schema["allOf"]) if k and k != "string"), "string")
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return None


def _enum_type(values: list[Any]) -> str:
    if not values:
        return "string"
    names = {
        "null" if v is None else "boolean" if isinstance(v, bool) else "integer" if isinstance(v, int)
        else "number" if isinstance(v, float) else "string" if isinstance(v, str) else "array"
        if isinstance(v, list) else "object" if isinstance(v, dict) else None
        for v in values
    }  # fmt: skip
    known = {name for name in names if name is not None}
    return known.pop() if len(known) == 1 else "string"
