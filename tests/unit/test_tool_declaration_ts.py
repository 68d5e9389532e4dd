"""The TypeScript tool declaration is byte-identical to Kimi-K2.5's, and fails where Kimi's fails.

Goldens, by source:
- SMG: lightseekorg/smg `crates/tokenizer/tests/fixtures/kimi_k25/schemas/<case>.json` (input) and
  `.../expected/<case>.txt` (output) @ ed0f623ffb1c5a7ce3b8bd7a3d41a0292990a82f, written by that folder's
  `regenerate.py` with `tool_declaration_ts.py` from the Kimi-K2.5 Hugging Face snapshot.
- REAL: the output, on the input written here, of Kimi-K2.5's encoder as vendored in
  thinking-machines-lab/tinker-cookbook `tinker_cookbook/renderers/kimi_k2_5_tool_declaration_ts.py`
  @ f46503488a5f83bcd19b2eeb22a1cf431761be4e (byte-identical to the SMG goldens above), for what the SMG fixtures
  leave out: constraints, defaults, array item comments, `additionalProperties`, `$ref: "#"`, described interfaces,
  skipped tool types, and the schemas it refuses.
"""

from __future__ import annotations

from typing import Any

import pytest

from regen.tokenizers.tool_declaration_ts import kimi_template_inputs, sort_keys_deep, tools_to_typescript
from tests.messages import function_tool

HEAD = "# Tools\n\n## functions\nnamespace functions {\n"


def tool(function: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": function}


def params(properties: dict[str, Any], required: list[str], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, **extra}


SMG = [
    pytest.param(
        [function_tool("echo", "Echo a string back to the caller.", {"text": {"type": "string"}}, ["text"])],
        HEAD + "// Echo a string back to the caller.\ntype echo = (_: {\n  text: string\n}) => any;\n}\n",
        id="smg-01_simple_string",
    ),
    pytest.param(
        [
            function_tool(
                "delay",
                "Sleep for some milliseconds.",
                {"ms": {"type": "integer", "minimum": 0}, "reason": {"type": "string"}},
                ["ms"],
            )
        ],
        HEAD
        + "// Sleep for some milliseconds.\ntype delay = (_: {\n  // minimum: 0\n  ms: number,\n  reason?: string\n"
        "}) => any;\n}\n",
        id="smg-02_optional_number",
    ),
    pytest.param(
        [
            function_tool(
                "create_user",
                "Create a new user record.",
                {"user": params({"name": {"type": "string"}, "age": {"type": "integer"}}, ["name"])},
                ["user"],
            )
        ],
        HEAD
        + "// Create a new user record.\ntype create_user = (_: {\n  user: {\n    name: string,\n    age?: number\n"
        "  }\n}) => any;\n}\n",
        id="smg-03_nested_object",
    ),
    pytest.param(
        [function_tool("tag_items", "Apply tags.", {"tags": {"type": "array", "items": {"type": "string"}}}, ["tags"])],
        HEAD + "// Apply tags.\ntype tag_items = (_: {\n  tags: Array<string>\n}) => any;\n}\n",
        id="smg-04_array_of_strings",
    ),
    pytest.param(
        [
            tool({"name": "ping", "parameters": {"type": "object", "properties": {}}}),
            tool({"name": "pong", "parameters": {"type": "object", "properties": {}}}),
        ],
        HEAD + "type ping = (_: {}) => any;\ntype pong = (_: {}) => any;\n}\n",
        id="smg-05_two_tools",
    ),
    pytest.param(
        [
            tool(
                {
                    "name": "set_status",
                    "parameters": params({"status": {"enum": ["active", "paused", "done"]}}, ["status"]),
                }
            )
        ],
        HEAD + 'type set_status = (_: {\n  status: "active" | "paused" | "done"\n}) => any;\n}\n',
        id="smg-06_enum",
    ),
    pytest.param(
        [
            tool(
                {
                    "name": "set_value",
                    "parameters": params({"v": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}, ["v"]),
                }
            )
        ],
        HEAD + "type set_value = (_: {\n  v: string | number\n}) => any;\n}\n",
        id="smg-07_anyof",
    ),
    pytest.param(
        [tool({"name": "store", "parameters": params({"x": {"type": ["string", "null"]}}, ["x"])})],
        HEAD + "type store = (_: {\n  x: string | null\n}) => any;\n}\n",
        id="smg-08_type_list",
    ),
    pytest.param(
        [
            tool(
                {
                    "name": "create_node",
                    "parameters": {
                        "type": "object",
                        "$defs": {"Node": params({"id": {"type": "string"}, "label": {"type": "string"}}, ["id"])},
                        "properties": {"node": {"$ref": "#/$defs/Node"}},
                        "required": ["node"],
                    },
                }
            )
        ],
        HEAD + "interface Node {\n  id: string,\n  label?: string\n}\n"
        "type create_node = (_: {\n  node: Node\n}) => any;\n}\n",
        id="smg-09_ref_local",
    ),
    pytest.param(
        [
            function_tool(
                "annotate",
                "Annotate the input.\nSupports multiple\nlines.",
                {"text": {"type": "string", "description": "The text\nto annotate."}},
                ["text"],
            )
        ],
        HEAD + "// Annotate the input.\n// Supports multiple\n// lines.\ntype annotate = (_: {\n  // The text\n"
        "  // to annotate.\n  text: string\n}) => any;\n}\n",
        id="smg-11_multiline_description",
    ),
    pytest.param(
        [function_tool("translate", "翻译 text into 中文.", {"text": {"type": "string"}}, ["text"])],
        HEAD + "// 翻译 text into 中文.\ntype translate = (_: {\n  text: string\n}) => any;\n}\n",
        id="smg-12_unicode",
    ),
    pytest.param(
        [tool({"name": "noop", "parameters": {"type": "object", "properties": {}}})],
        HEAD + "type noop = (_: {}) => any;\n}\n",
        id="smg-13_empty_params",
    ),
    pytest.param(
        [tool({"name": "weird", "parameters": params({"x": {"type": "uuid"}}, ["x"])})],
        HEAD + "type weird = (_: {\n  x: uuid\n}) => any;\n}\n",
        id="smg-14_unknown_type",
    ),
]

REAL = [
    pytest.param(
        [
            function_tool(
                "search",
                "Search the catalogue.\n\nReturns at most `limit` hits.",
                {
                    "query": {
                        "type": "string",
                        "description": "Words to look for",
                        "minLength": 1,
                        "maxLength": 200,
                        "pattern": "^[^<>]*$",
                    },
                    "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
                    "exact": {"type": "boolean", "default": False},
                    "sort": {"type": "string", "enum": ["relevance", "date"], "default": "relevance"},
                    "ratio": {"type": "number", "default": 0.5},
                },
                ["query"],
            )
        ],
        HEAD + "// Search the catalogue.\n\n// Returns at most `limit` hits.\ntype search = (_: {\n"
        "  // Words to look for\n  // maxLength: 200, minLength: 1, pattern: ^[^<>]*$\n  query: string,\n"
        "  // Default: False\n  exact?: boolean,\n  // maximum: 50, minimum: 1\n  // Default: 10\n  limit?: number,\n"
        '  // Default: 0.5\n  ratio?: number,\n  // Default: "relevance"\n  sort?: "relevance" | "date"\n'
        "}) => any;\n}\n",
        id="real-constraints-and-defaults",
    ),
    pytest.param(
        [
            tool(
                {
                    "name": "tag",
                    "parameters": params(
                        {
                            "tags": {
                                "type": "array",
                                "description": "Tags to set",
                                "minItems": 1,
                                "items": {"type": "string", "description": "One tag", "maxLength": 20},
                            },
                            "points": {
                                "type": "array",
                                "items": params({"x": {"type": "number"}, "y": {"type": "number"}}, ["x", "y"]),
                            },
                            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                            "strict": {
                                "type": "object",
                                "properties": {"a": {"type": "integer"}},
                                "additionalProperties": False,
                            },
                            "anything": {"type": "array"},
                        },
                        ["tags"],
                    ),
                }
            )
        ],
        HEAD
        + "type tag = (_: {\n  // Tags to set\n  // minItems: 1\n  tags: Array<\n    // One tag\n    // maxLength: 20\n"
        "    string\n  >,\n  anything?: Array<any>,\n  labels?: {\n    [k: string]: string\n  },\n  points?: Array<{\n"
        "    x: number,\n    y: number\n  }>,\n  strict?: {\n    a?: number,\n    [k: string]: never\n  }\n"
        "}) => any;\n}\n",
        id="real-arrays-and-additional-properties",
    ),
    pytest.param(
        [
            tool(
                {
                    "name": "make_tree",
                    "description": "Build a tree.",
                    "parameters": params(
                        {
                            "name": {"type": "string"},
                            "children": {"type": "array", "items": {"$ref": "#"}},
                            "leaf": {"$ref": "#/$defs/Leaf", "description": "The leaf"},
                        },
                        ["name"],
                        **{
                            "$defs": {
                                "Leaf": {
                                    "type": "object",
                                    "description": "A leaf\nwith a value",
                                    "properties": {"value": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
                                }
                            }
                        },
                    ),
                }
            )
        ],
        HEAD
        + "interface parameters {\n  name: string,\n  children?: Array<parameters>,\n  // The leaf\n  leaf?: Leaf\n}\n"
        "// A leaf\n// with a value\ninterface Leaf {\n  value?: string | null\n}\n// Build a tree.\n"
        "type make_tree = (_: parameters) => any;\n}\n",
        id="real-root-ref-and-described-interface",
    ),
    pytest.param(
        [{"type": "_plugin", "_plugin": {"name": "x"}}, tool({"name": "now", "description": "The time."})],
        HEAD + "// The time.\ntype now = (_: {}) => any;\n}\n",
        id="real-other-tool-types-skipped-no-parameters",
    ),
    pytest.param([{"type": "_plugin", "_plugin": {"name": "x"}}], "", id="real-no-function-tool"),
]


@pytest.mark.parametrize("tools,expected", SMG + REAL)
def test_declaration_is_byte_identical_to_kimis(tools: list[dict[str, Any]], expected: str) -> None:
    assert tools_to_typescript(tools) == expected


@pytest.mark.parametrize(
    "parameters,error",
    [  # REAL: each raises in Kimi's encoder too (ValueError, ValueError, ValueError, KeyError, ValueError)
        pytest.param(params({"n": {"type": "string", "enum": [1, 2]}}, []), ValueError, id="enum-value-not-its-type"),
        pytest.param(params({"n": {"$ref": "#/$defs/Missing"}}, []), ValueError, id="ref-to-unknown-definition"),
        pytest.param(
            params({"n": {"$ref": "#/definitions/N"}}, [], definitions={"N": {"type": "string"}}),
            ValueError,
            id="ref-to-draft-07-definitions",
        ),
        pytest.param(params({"n": {"type": ["string", "date"]}}, []), KeyError, id="unknown-type-in-a-type-list"),
        pytest.param(params({"n": {"description": "no type"}}, []), ValueError, id="property-without-a-type"),
    ],
)
def test_schemas_kimis_encoder_refuses_are_refused(parameters: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        tools_to_typescript([tool({"name": "f", "parameters": parameters})])


def test_tools_are_key_sorted_at_every_depth_and_lists_keep_their_order() -> None:
    tools = [
        {"type": "function", "function": {"name": "b", "parameters": {"type": "object", "properties": {}}}},
        {"function": {"parameters": {"required": ["y", "x"]}, "name": "a"}, "type": "function"},
    ]
    assert sort_keys_deep(tools) == tools
    assert [list(t) for t in sort_keys_deep(tools)] == [["function", "type"], ["function", "type"]]
    assert list(sort_keys_deep(tools)[1]["function"]) == ["name", "parameters"]
    assert sort_keys_deep(tools)[1]["function"]["parameters"]["required"] == ["y", "x"]


def test_template_inputs_declare_typescript_or_nothing_when_the_encoder_refuses() -> None:
    good = [tool({"parameters": {"type": "object"}, "name": "f"})]
    assert kimi_template_inputs(good) == (
        [{"function": {"name": "f", "parameters": {"type": "object"}}, "type": "function"}],
        {"tools_ts_str": HEAD + "type f = (_: {}) => any;\n}\n"},
    )
    refused = [tool({"name": "f", "parameters": params({"n": {"description": "no type"}}, [])})]
    assert kimi_template_inputs(refused)[1] == {}
    assert kimi_template_inputs(None) == (None, {})
    assert kimi_template_inputs([]) == ([], {})
