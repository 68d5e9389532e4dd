"""Kimi-K2.5's tool declaration: OpenAI tool schemas as a TypeScript namespace, and what Kimi's tokenizer class does
to `tools` before its chat template runs.

Sources (facts only; the code is this project's own): the `tool_declaration_ts.py` and `tokenization_kimi.py` of the
moonshotai/Kimi-K2.5 Hugging Face repository, read as vendored in thinking-machines-lab/tinker-cookbook
`tinker_cookbook/renderers/kimi_k2_5_tool_declaration_ts.py` @ f46503488a5f83bcd19b2eeb22a1cf431761be4e, whose
outputs equal lightseekorg/smg's fixtures generated from the HF files
(`crates/tokenizer/tests/fixtures/kimi_k25/expected/` @ ed0f623ffb1c5a7ce3b8bd7a3d41a0292990a82f; the unit tests hold
this encoder to them byte for byte).

The rules, as the real encoder applies them:
- `# Tools\\n\\n## functions\\nnamespace functions {\\n` + one block per function, joined by newlines, + `\\n}\\n`;
  tools whose `type` is not `function` are skipped; nothing left -> "" (the template then declares JSON).
- A function block: `interface` blocks for `$defs` (and for the root when a property refers to `#`), the function's
  description as `// ` lines, then `type NAME = (_: PARAMS) => any;`.
- An object: required properties sorted by name, then optional ones sorted by name, each after its comment lines
  (description, then a sorted `// key: value` constraints line, then `// Default: ...`), joined by `,\\n`, two spaces
  of indent per level; `additionalProperties` adds `[k: string]: any|never|TYPE`; no properties -> `{}`.
- integer -> number, arrays `Array<T>`, enums `"a" | 1`, `anyOf` and type lists joined by ` | `, `{}` -> any.
- Failure is part of the behaviour: Kimi's tokenizer declares the tools as JSON whenever the encoder raises, so this
  one raises on exactly the schemas the real one does (a property with neither `type` nor `enum`/`anyOf`/`$ref`, an
  unknown `$ref`, an enum value of the wrong type, an unknown type in a type list, ...).

Standard library only: the slow twin's tokenizer directory holds a copy of this file beside its tokenization module,
as Kimi's holds `tool_declaration_ts.py` beside `tokenization_kimi.py`, and transformers imports it from there.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

log = logging.getLogger(__name__)

INDENT = "  "
HEADER = "# Tools\n\n## functions\nnamespace functions {\n"
FOOTER = "\n}\n"
ROOT_INTERFACE = "parameters"  # what a `$ref: "#"` (the parameters object itself) is called
CONSTRAINT_KEYS = {
    "string": ("maxLength", "minLength", "pattern"),
    "number": ("maximum", "minimum"),
    "integer": ("maximum", "minimum"),
}
ARRAY_CONSTRAINT_KEYS = ("minItems", "maxItems")
TYPE_LIST_NAMES = {
    "string": "string",
    "number": "number",
    "integer": "number",
    "boolean": "boolean",
    "null": "null",
    "object": "{}",
    "array": "Array<any>",
}
ENUM_VALUE_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "number": (int, float),
    "integer": int,
    "boolean": bool,
}


def sort_keys_deep(value: Any) -> Any:
    """Every mapping's keys sorted, at every depth; list order kept. Kimi's tokenizer does this to `tools` before
    anything reads them, so both the TypeScript and the JSON declarations list keys in sorted order."""
    if isinstance(value, dict):
        return {key: sort_keys_deep(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [sort_keys_deep(item) for item in value]
    return value


def kimi_template_inputs(tools: Any) -> tuple[Any, dict[str, str]]:
    """What Kimi's `apply_chat_template` hands its template: the key-sorted tools, and `tools_ts_str` unless encoding
    them fails. The real class catches any exception there and lets the template fall back to JSON, so this does too."""
    tools = sort_keys_deep(tools)
    if not tools:
        return tools, {}
    try:  # keys already sorted at every depth: this is the canonical JSON
        canonical = json.dumps(tools, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):  # not JSON data (tools built in code): encoded as they are
        declaration = _declaration(tools)
    else:
        declaration = _cached_declaration(canonical)
    return tools, {} if declaration is None else {"tools_ts_str": declaration}


@lru_cache(maxsize=256)
def _cached_declaration(canonical: str) -> str | None:
    """The declaration of one canonical tools list, once per process: a dataset repeats the same few tool lists on
    thousands of rows, and every row's prompt declares them."""
    return _declaration(json.loads(canonical))


def _declaration(tools: Any) -> str | None:
    try:
        return tools_to_typescript(tools)
    except Exception as e:  # any failure means "declare as JSON", exactly as in the real tokenizer
        log.warning("tools declared as JSON: the TypeScript encoder refused them (%r)", e)
        return None


def tools_to_typescript(tools: Any) -> str:
    """The `tools_ts_str` Kimi-K2.5's tokenizer passes to its template ("" when no function tool is declared)."""
    if not tools:
        return ""
    blocks = []
    for tool in tools:
        _require_object(tool, "a tool")
        function = tool.get("function", {}) if tool.get("type") == "function" else None
        if function:
            blocks.append(_function_block(function))
    return HEADER + "\n".join(blocks) + FOOTER if blocks else ""


def _require_object(value: Any, what: str) -> None:
    if not isinstance(value, dict):
        raise TypeError(f"{what} must be a JSON object, got {type(value).__name__}")


@dataclass
class _Definitions:
    """The `$defs` met so far in one function's parameters, in first-met order (the order interfaces print in)."""

    schemas: dict[str, Any] = field(default_factory=dict)
    root_referenced: bool = False

    def register(self, defs: Any) -> None:
        if defs:
            for name, schema in defs.items():
                self.schemas[name] = schema

    def type_name(self, ref: Any) -> str:
        """The name a `$ref` prints as; it must point at the root or at a definition registered before it."""
        if ref == "#":
            self.root_referenced = True
            return ROOT_INTERFACE
        if not ref.startswith("#/$defs/"):
            raise ValueError(f"unsupported $ref {ref!r}")
        name = ref.split("/")[-1]
        if name not in self.schemas:
            raise ValueError(f"$ref to an undeclared definition {ref!r}")
        # As in the real encoder, a definition carrying a truthy `$self_ref` reads as the root.
        return ROOT_INTERFACE if self.schemas[name].get("$self_ref", False) else name


@dataclass
class _Type:
    """One parsed schema. `kind` picks the rendering; `label` holds what the indentation-free kinds print: a scalar's
    type as the schema gives it (anything, in a malformed schema), a type list's text, a `$ref`'s name."""

    kind: str  # scalar | object | array | enum | any_of | ref | type_list
    description: Any = ""
    constraints: dict[str, Any] = field(default_factory=dict)
    label: Any = ""
    values: Any = None  # enum values
    fields: list[_Field] = field(default_factory=list)
    extra: Any = None  # additionalProperties: None, True, False, a _Type, or anything else (refused when printed)
    members: list[_Type] = field(default_factory=list)  # anyOf members, or the one array item type


@dataclass
class _Field:
    name: Any
    value_type: _Type
    optional: bool
    default: Any


def _constraints(schema: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {key: value for key, value in schema.items() if key in keys}


def _parse(schema: Any, defs: _Definitions) -> _Type:
    """A property's schema as a type. The order of the checks is the real encoder's: `$ref`, `anyOf`, `enum`, then
    `type`; a bare `{}` is `any`; anything else is refused."""
    if isinstance(schema, bool):
        return _Type("scalar", label="any" if schema else "null")
    _require_object(schema, "a JSON schema")
    description = schema.get("description", "")
    if "$ref" in schema:
        return _Type("ref", description, label=defs.type_name(schema["$ref"]))
    if "anyOf" in schema:
        return _Type("any_of", description, members=[_parse(member, defs) for member in schema["anyOf"]])
    if "enum" in schema:
        _check_enum(schema)
        return _Type("enum", description, values=schema["enum"])
    if "type" not in schema:
        if schema == {}:
            return _Type("scalar", label="any")
        raise ValueError(f"schema without a type: {json.dumps(schema, ensure_ascii=False)[:200]}")
    kind = schema["type"]
    if isinstance(kind, list):
        return _Type("type_list", description, label=" | ".join(TYPE_LIST_NAMES[name] for name in kind))
    if kind == "object":
        return _parse_object(schema, defs)
    if kind == "array":
        item = _parse(schema["items"], defs) if schema.get("items") else _Type("scalar", label="any")
        return _Type("array", description, _constraints(schema, ARRAY_CONSTRAINT_KEYS), members=[item])
    keys = CONSTRAINT_KEYS.get(kind, ()) if isinstance(kind, str) else ()
    return _Type("scalar", description, _constraints(schema, keys), label=kind)


def _check_enum(schema: dict[str, Any]) -> None:
    """Enum values must fit a declared type; a type list may only add "null" to one type."""
    if "type" not in schema:
        return
    kind = schema["type"]
    if isinstance(kind, list):
        if len(kind) == 2 and "null" in kind:
            kind = kind[0] if kind[0] != "null" else kind[1]
        elif len(kind) == 1:
            kind = kind[0]
        else:
            raise ValueError(f"enum with type {kind} is not supported")
    expected = ENUM_VALUE_TYPES.get(kind) if isinstance(kind, str) else None
    for value in schema["enum"]:
        if expected is not None and value is not None and not isinstance(value, expected):
            raise ValueError(f"enum value {value!r} is not a {kind}")


def _parse_object(schema: Any, defs: _Definitions) -> _Type:
    """Parsed in the real encoder's order, which decides which `$ref`s resolve: the object's own `$defs` first, then
    `additionalProperties`, then the properties as listed."""
    _require_object(schema, "an object schema")
    parsed = _Type("object", schema.get("description", ""))
    if not schema:
        return parsed
    if "$defs" in schema:
        defs.register(schema["$defs"])
    extra = schema.get("additionalProperties")
    parsed.extra = _parse(extra, defs) if isinstance(extra, dict) else extra
    if "properties" in schema:
        required = set(schema.get("required", []))
        for name, prop in schema["properties"].items():
            prop_type = _parse(prop, defs)
            default = prop.get("default") if isinstance(prop, dict) else None
            parsed.fields.append(_Field(name, prop_type, name not in required, default))
    return parsed


def _comment(text: str, indent: str) -> str:
    """Description lines as `// ` comments; empty lines stay empty."""
    return "\n".join(f"{indent}// {line}" if line else "" for line in text.split("\n"))


def _doc(parsed: _Type, indent: str) -> str:
    """The comment lines above a field (or above an array's item type), each ending in a newline."""
    lines = [_comment(parsed.description, indent)] if parsed.description else []
    if parsed.constraints:
        pairs = sorted(parsed.constraints.items(), key=lambda pair: pair[0])
        lines.append(f"{indent}// " + ", ".join(f"{key}: {value}" for key, value in pairs))
    return "".join(line + "\n" for line in lines)


def _text(parsed: _Type, indent: str) -> str:
    """The type as TypeScript, `indent` being the indentation of the line it starts on."""
    if parsed.kind == "scalar":
        return "number" if parsed.label == "integer" else f"{parsed.label}"
    if parsed.kind == "object":
        return _object_text(parsed, indent)
    if parsed.kind == "array":
        return _array_text(parsed.members[0], indent)
    if parsed.kind == "enum":
        return " | ".join(f'"{value}"' if isinstance(value, str) else str(value) for value in parsed.values)
    if parsed.kind == "any_of":
        return " | ".join(_inline_text(member, indent) for member in parsed.members)
    return str(parsed.label)  # ref, type_list


def _inline_text(parsed: _Type, indent: str) -> str:
    """Where the real encoder concatenates a type's text rather than formatting it, a scalar whose `type` is not a
    string (malformed, e.g. `{"type": 5}`) makes it fail: fail the same way, so the prompt falls back the same way."""
    if parsed.kind == "scalar" and not isinstance(parsed.label, str):
        raise TypeError(f"type {parsed.label!r} is not a type name")
    return _text(parsed, indent)


def _array_text(item: _Type, indent: str) -> str:
    doc = _doc(item, indent + INDENT)
    if not doc:  # the item stays on this line, at this line's indentation
        return f"Array<{_text(item, indent)}>"
    return f"Array<\n{doc}{indent}{INDENT}{_inline_text(item, indent + INDENT)}\n{indent}>"


def _field_text(item: _Field, indent: str) -> str:
    default = ""
    if item.default is not None:
        plain = isinstance(item.default, int | float | bool)
        default = (
            f"{indent}// Default: {repr(item.default) if plain else json.dumps(item.default, ensure_ascii=False)}\n"
        )
    mark = "?" if item.optional else ""
    return f"{_doc(item.value_type, indent)}{default}{indent}{item.name}{mark}: {_text(item.value_type, indent)}"


def _extra_text(extra: Any, indent: str) -> str:
    if extra is True:
        return "any"
    if extra is False:
        return "never"
    if isinstance(extra, _Type):
        return _text(extra, indent)
    raise ValueError(f"additionalProperties must be a boolean or a schema, got {extra!r}")


def _object_text(parsed: _Type, indent: str) -> str:
    inner = indent + INDENT
    required = sorted((f for f in parsed.fields if not f.optional), key=lambda f: f.name)
    optional = sorted((f for f in parsed.fields if f.optional), key=lambda f: f.name)
    lines = [_field_text(item, inner) for item in required + optional]
    if parsed.extra is not None:
        lines.append(f"{inner}[k: string]: {_extra_text(parsed.extra, inner)}")
    return "{\n" + ",\n".join(lines) + f"\n{indent}}}" if lines else "{}"


def _function_block(function: Any) -> str:
    """Interfaces, the description, and the `type` line of one function."""
    _require_object(function, "a function")
    defs = _Definitions()
    root = _parse_object(function.get("parameters") or {}, defs)
    root_is_interface = defs.root_referenced  # decided before the definitions are parsed, as in the real encoder
    interfaces = []
    if root_is_interface:  # its fields in declared order (not sorted), as the real encoder prints them
        body = ",\n".join(_field_text(item, INDENT) for item in root.fields)
        interfaces.append(f"interface {ROOT_INTERFACE} {{\n{body}\n}}" if body else f"interface {ROOT_INTERFACE} {{}}")
    for name, schema in list(defs.schemas.items()):  # definitions registered while parsing these are not printed
        text = _text(_parse(schema, defs), "")
        description = schema.get("description", "")
        head = _comment(description, "") + "\n" if description else ""
        interfaces.append(f"{head}interface {name} {text}")
    signature = ROOT_INTERFACE if root_is_interface else _text(root, "")
    type_line = f"type {function.get('name', 'function')} = (_: {signature}) => any;"
    description = function.get("description")
    parts = ["\n".join(interfaces), (description and _comment(description, "")) or "", type_line]
    return "\n".join(part for part in parts if part)
