"""The per-process memos of tool schemas (the jsonschema check, Kimi's TypeScript declaration) answer exactly what
the uncached work answers, every time, and hand out values a caller may change without changing the next answer."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from regen.chat_request import Refused, served_parameters, standard_parameters
from regen.tokenizers.tool_declaration_ts import kimi_template_inputs, sort_keys_deep, tools_to_typescript
from regen.tokenizers.vocab import entry_bytes

PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "varchar(255)", "description": "城市"}, "days": {"type": "int", "minimum": 1}},
    "required": ["city"],
}


def test_served_parameters_are_the_standard_copy_every_time() -> None:
    given = copy.deepcopy(PARAMETERS)
    first = served_parameters(given, 0)
    assert first == standard_parameters(PARAMETERS)
    assert list(first["properties"]) == ["city", "days"]  # key order as given: the template prints it
    first["properties"]["city"]["type"] = "changed by a caller"
    assert served_parameters(given, 0) == standard_parameters(PARAMETERS)
    assert given == PARAMETERS  # the data stays as given


@pytest.mark.parametrize(
    "parameters",
    [
        pytest.param({"type": "object", "properties": {"a": {"type": 5}}}, id="not-a-type"),
        pytest.param({"type": "object", "required": "a"}, id="required-not-a-list"),
    ],
)
def test_an_invalid_schema_is_refused_each_time_with_its_index(parameters: dict[str, Any]) -> None:
    messages = []
    for index in (0, 3):
        with pytest.raises(Refused) as refused:
            served_parameters(parameters, index)
        messages.append(str(refused.value))
    assert messages[0].startswith("Tool 0 function has invalid 'parameters' schema: ")
    assert messages[1] == messages[0].replace("Tool 0", "Tool 3")


def test_parameters_too_deep_to_write_as_json_are_refused() -> None:
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(5000):
        deep = {"type": "object", "properties": {"x": deep}}
    with pytest.raises(Refused, match="too deeply nested"):
        served_parameters(deep, 1)


def test_the_typescript_declaration_is_the_encoders_each_time() -> None:
    tools = [{"type": "function", "function": {"name": "weather", "parameters": PARAMETERS}}]
    expected = {"tools_ts_str": tools_to_typescript(sort_keys_deep(tools))}
    assert kimi_template_inputs(tools) == (sort_keys_deep(tools), expected)
    assert kimi_template_inputs(copy.deepcopy(tools)) == (sort_keys_deep(tools), expected)
    refused = [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"x": {}}}}}]
    refused[0]["function"]["parameters"]["properties"]["x"] = {"description": "neither type nor enum"}
    for _ in range(2):
        assert kimi_template_inputs(refused) == (sort_keys_deep(refused), {})


@pytest.mark.parametrize(
    ("token", "added", "expected"),
    [
        pytest.param("Ġhello", False, b" hello", id="byte-level"),
        pytest.param("ĊĠĉ", False, b"\n \t", id="control-bytes"),
        pytest.param("Ã©", False, "é".encode(), id="utf-8-bytes"),
        pytest.param("a b", False, b"a b", id="space-outside-the-alphabet"),
        pytest.param("日本", False, "日本".encode(), id="outside-the-alphabet"),
        pytest.param("Ġ", True, "Ġ".encode(), id="added-token"),
        pytest.param("", False, b"", id="empty"),
    ],
)
def test_entry_bytes(token: str, added: bool, expected: bytes) -> None:
    assert entry_bytes(token, added) == expected
