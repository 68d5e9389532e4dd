"""A conversation as SGLang's `/v1/chat/completions` hands it to the chat template, so that a prompt rendered here is
the prompt production renders for the same request.

Production traffic reaches the target through that endpoint, and it reshapes every request first. Read from sglang
0.5.23 (`srt/entrypoints/openai/serving_chat.py`, `protocol.py`, `srt/function_call/utils.py`,
`srt/parser/jinja_template_utils.py`) and proven equal to it by the differential tests in `tests/parity/`, which run
SGLang's own code:

- Tools: each tool's `parameters` has its non-standard type names rewritten to JSON Schema (`int` -> `integer`,
  `varchar(255)` -> `string`, `dict[str, int]` -> `object`, ...), and must then be a valid JSON Schema (2020-12), or
  the request is refused. The tool reaches the template as the `Tool` model's dump: `type`, `function` (its keys in
  the order given, then `description` and `parameters` when missing, as null; `strict` only when given),
  `defer_loading`.
- Messages: each is its role's model dumped, keys whose value is null dropped. A user message keeps only `role` and
  `content` (a `name` is dropped); every other role keeps `name`, `tool_call_id`, `reasoning_content` and
  `tool_calls`, and `developer` stays `developer`. Null content is "".
- Content parts: kept as `{"type": "text", "text": ...}` parts for a template that reads parts (the "openai" content
  format, as SGLang detects it from the template), joined with " " for one that does not ("string"). A tool message
  of text parts only is then joined with " " in either case.
- Tool calls: `arguments` given as JSON text are parsed with orjson into an object (not an object: refused); each
  call is the `ToolCall` dump (`id`, `index`, `type`, `function`).

A `Refused` is what the server answers with HTTP 400 for the same request.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from typing import Any, Literal

ContentFormat = Literal["openai", "string"]
# Manifests record it, and a change makes a nightly run regenerate (the same dataset renders other prompts).
TEMPLATE_INPUTS = "sglang-0.5.23-chat/3"

JSON_SCHEMA_TYPES = frozenset({"null", "boolean", "object", "array", "number", "string", "integer"})
# Database and ORM type names that tool schemas exported from such tooling use, and the JSON Schema type SGLang
# renders instead (function_call/utils.py `_JSON_SCHEMA_TYPE_ALIASES`).
TYPE_ALIASES = {
    **dict.fromkeys(
        "str text varchar char enum uuid date datetime time timestamp binary blob bytea bytes varbinary".split(),
        "string",
    ),
    "bool": "boolean",
    **dict.fromkeys(("bigint", "smallint", "tinyint"), "integer"),
    **dict.fromkeys(("double", "decimal", "real", "numeric"), "number"),
    **dict.fromkeys(("arr", "tuple", "set"), "array"),
    "map": "object",
}
# Type names matched by prefix (`int32`, `float64`, `list[str]`), where the prefix is the whole name or is followed by
# one of these characters, so that `internal` or `list_price` stay what they are.
TYPE_PREFIXES = (
    (("int", "uint", "long", "short", "unsigned"), "integer"),
    (("num", "float"), "number"),
    (("list",), "array"),
    (("dict",), "object"),
)
PREFIX_ENDS = frozenset("0123456789[<( \t")
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SCHEMA_ONES = (
    "items",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
)
TEXT_PARTS = ("text", "input_text")
MEDIA_PARTS = {"image_url": "image", "input_image": "image", "video_url": "video", "audio_url": "audio"}
GENERIC_KEYS = ("role", "content", "tool_call_id", "name", "reasoning_content", "tool_calls")
TOOL_FUNCTION_KEYS = ("description", "name", "parameters")


class Refused(ValueError):
    """The request SGLang answers with a 400, and its reason."""


def standard_type(name: Any) -> Any:
    """One `type` value as SGLang rewrites it; a name it does not know stays as it is, for the validator to judge."""
    if not isinstance(name, str) or name in JSON_SCHEMA_TYPES:
        return name
    base = name.split("(", 1)[0].strip().lower()
    if base in JSON_SCHEMA_TYPES:
        return base
    if base in TYPE_ALIASES:
        return TYPE_ALIASES[base]
    for prefixes, standard in TYPE_PREFIXES:
        if any(
            base == p or (base.startswith(p) and len(base) > len(p) and base[len(p)] in PREFIX_ENDS) for p in prefixes
        ):
            return standard
    return name


def standardise_types(schema: Any) -> None:
    """Rewrite every `type` in a schema tree in place, as SGLang does before validating and rendering it."""
    if isinstance(schema, list):
        for item in schema:
            standardise_types(item)
        return
    if not isinstance(schema, dict):
        return
    kind = schema.get("type")
    if isinstance(kind, str):
        schema["type"] = standard_type(kind)
    elif isinstance(kind, list):
        schema["type"] = list(dict.fromkeys(standard_type(k) for k in kind))
    for key in SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for value in schema[key].values():
                standardise_types(value)
    for key in SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            for value in schema[key]:
                standardise_types(value)
    for key in SCHEMA_ONES:
        if key in schema:
            standardise_types(schema[key])


def served_parameters(parameters: Any, index: int) -> Any:
    """A tool's parameters as the template sees them, checked as SGLang checks them (on a copy: data stays as given).

    Memoised by the parameters' JSON text: a dataset repeats the same few tool lists on thousands of rows, and
    jsonschema's meta-schema check costs about a millisecond each time (and the deep copy more than reading JSON
    back). Parameters are JSON data (read from rows or stored columns), so their JSON text is all of what they are."""
    if parameters is None:
        return None
    try:
        given = json.dumps(parameters, ensure_ascii=False)  # key order kept: the template prints keys in this order
    except (TypeError, ValueError, RecursionError):  # not JSON data (built in code): checked as it is, uncached
        standard, problem = _standard_and_problem(parameters)
    else:
        served, problem = _served_json(given)
        standard = json.loads(served) if problem is None else None
    if problem == TOO_DEEP:
        raise Refused(f"Tool {index} function 'parameters' schema is too deeply nested or contains a cycle.")
    if problem is not None:
        raise Refused(f"Tool {index} function has invalid 'parameters' schema: {problem}")
    return standard


TOO_DEEP = "too deep"


@lru_cache(maxsize=1024)
def _served_json(given: str) -> tuple[str, str | None]:
    standard, problem = _standard_and_problem(json.loads(given))
    return json.dumps(standard, ensure_ascii=False), problem


def _standard_and_problem(parameters: Any) -> tuple[Any, str | None]:
    """The parameters with SGLang's type names, and why SGLang refuses them as a JSON Schema (jsonschema's message,
    or TOO_DEEP), None when it does not."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        parameters = standard_parameters(parameters)
        Draft202012Validator.check_schema(parameters)
    except SchemaError as e:
        return parameters, str(e.message)
    except RecursionError:
        return None, TOO_DEEP
    return parameters, None


def standard_parameters(parameters: Any) -> Any:
    """A copy of a tool's parameters with SGLang's type names, unchecked."""
    parameters = copy.deepcopy(parameters)
    standardise_types(parameters)
    return parameters


def standard_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools as SGLang's tool-call detectors hold them (type names made standard), for reading an answer: the
    schemas were checked when the prompt was prepared, so they are not checked again on every answer."""
    return [
        {**tool, "function": {**function, "parameters": standard_parameters(function.get("parameters"))}}
        for tool in tools
        for function in [tool.get("function") or {}]
    ]


def served_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    return [_served_tool(tool, i) for i, tool in enumerate(tools)]


def _served_tool(tool: dict[str, Any], index: int) -> dict[str, Any]:
    function = dict(tool.get("function") or {})
    defer = tool.get("defer_loading")
    if defer is not None and function.get("defer_loading") is None:
        function["defer_loading"] = defer
    dumped = {key: function.get(key) for key in TOOL_FUNCTION_KEYS}
    dumped["parameters"] = served_parameters(function.get("parameters"), index)
    for key in ("strict", "defer_loading"):
        if function.get(key) is not None:
            dumped[key] = function[key]
    given = [key for key in function if key in dumped]
    ordered = {key: dumped[key] for key in [*given, *(k for k in dumped if k not in given)]}
    return {"type": tool.get("type", "function"), "function": ordered, "defer_loading": defer}


def served_messages(messages: list[dict[str, Any]], content_format: ContentFormat) -> list[dict[str, Any]]:
    return [_served_message(message, content_format) for message in messages]


def _served_message(message: dict[str, Any], content_format: ContentFormat) -> dict[str, Any]:
    role = message["role"]
    keys = ("role", "content") if role == "user" else GENERIC_KEYS
    served = {key: message[key] for key in keys if message.get(key) is not None}
    content = message.get("content")
    served["content"] = "" if content is None else _served_content(role, content, content_format)
    if served.get("tool_calls"):
        served["tool_calls"] = [_served_call(call) for call in served["tool_calls"]]
    return served


def _served_content(role: str, content: Any, content_format: ContentFormat) -> Any:
    if not isinstance(content, list):
        return content
    texts = [part["text"] for part in content if part.get("type") in TEXT_PARTS]
    if content_format == "string":
        return " ".join(texts)
    parts = [_served_part(part) for part in content if part.get("type") in (*TEXT_PARTS, *MEDIA_PARTS)]
    if role == "tool" and all(part["type"] == "text" for part in parts):  # normalize_tool_content
        return " ".join(part["text"] for part in parts)
    return parts


def _served_part(part: dict[str, Any]) -> dict[str, Any]:
    """A media part becomes its bare type (the media itself goes to the model's processor, not the template)."""
    kind = part["type"]
    return {"type": "text", "text": part["text"]} if kind in TEXT_PARTS else {"type": MEDIA_PARTS[kind]}


def _served_call(call: dict[str, Any]) -> dict[str, Any]:
    import orjson

    function = call["function"]
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            raise Refused("Assistant tool call function.arguments must be valid JSON.") from None
        if not isinstance(arguments, dict):
            raise Refused("Assistant tool call function.arguments must be a JSON object.")
    return {
        "id": call.get("id"),
        "index": call.get("index"),
        "type": call.get("type", "function"),
        "function": {"name": function.get("name"), "arguments": arguments},
    }


@lru_cache(maxsize=8)
def content_format(template: str | None) -> ContentFormat:
    """How SGLang hands content parts to this template (`detect_jinja_template_content_format`): as parts, when the
    template loops over a message's content or names a media type anywhere; else as one string."""
    if template is None:
        return "string"
    if any(word in template for word in ("image", "audio", "video", "vision")):
        return "openai"
    from jinja2 import nodes
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:  # parsed in the environment transformers renders it in (its extensions, its filters)
        tree = _compile_jinja_template(template).environment.parse(template)
    except Exception:
        return "string"
    for loop in tree.find_all(nodes.For):
        if any(_reads_content(loop.iter, name) for name in ("message", "msg", "m")):
            return "openai"
    return "string"


def _reads_content(node: Any, name: str) -> bool:
    """`name.content` or `name['content']`, through any filters, tests or slices (`_is_var_or_elems_access`)."""
    from jinja2 import nodes

    if isinstance(node, (nodes.Filter, nodes.Test)):
        return node.node is not None and _reads_content(node.node, name)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _reads_content(node.node, name)
    if isinstance(node, nodes.Getitem):
        key = node.arg.value if isinstance(node.arg, nodes.Const) else None
    elif isinstance(node, nodes.Getattr):
        key = node.attr
    else:
        return False
    return key == "content" and isinstance(node.node, nodes.Name) and node.node.ctx == "load" and node.node.name == name
