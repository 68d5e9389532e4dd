"""Property tests: whatever a row holds, normalization never raises, and prepare accounts for every row."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from regen.chat import ChatRenderer
from regen.config import DatasetConfig
from regen.layout import DatasetLocation
from regen.profiles import lookup
from regen.reasons import Reason
from regen.stages.prepare.formats import CONVERTERS, SHAREGPT_ROLES, normalize_row
from regen.stages.prepare.normalize import Conversation, Rejection
from regen.stages.prepare.prepare import PrepareSettings, run_prepare
from regen.storage import LocalStorage

KIMI_IDS = "functions.{name}:{index}"
REASONS = {reason.value for reason in Reason if reason.stage == "prepare"}

# Text includes lone surrogates, which JSON escapes (`\ud800`) produce and UTF-8 cannot hold.
text = st.text(st.characters(exclude_categories=()), max_size=12) | st.sampled_from(
    ["", " ", "USER: x", "ASSISTANT: y <|endoftext|>", "<functioncall>", "{", "[]", '{"a": 1}']
)
words = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12).filter(str.strip)
scalars = st.none() | st.booleans() | st.integers() | st.floats() | text
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3), max_leaves=12
)


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Rows that are usually well formed, so that both outcomes are explored, with faults mixed in."""
    return st.one_of(good, good, good, bad)


arguments = mostly(st.sampled_from(['{"q": 1}', "{}"]) | st.dictionaries(words, words, max_size=2), json_values)
tool_calls = st.lists(
    st.fixed_dictionaries(
        {"function": st.fixed_dictionaries({"name": mostly(st.just("lookup"), text), "arguments": arguments})},
        optional={"id": words, "type": st.just("function")},
    ),
    min_size=1,
    max_size=2,
)
roles = mostly(st.sampled_from(["system", "user", "assistant", "tool", "developer"]), st.just("wizard") | json_values)
contents = mostly(words, json_values | st.just([{"type": "text", "text": "part"}]) | text)
messages = st.lists(
    mostly(
        st.fixed_dictionaries(
            {"role": roles, "content": contents},
            optional={"tool_calls": mostly(tool_calls, json_values), "tool_call_id": words, "reasoning_content": text},
        ),
        json_values,
    ),
    min_size=1,
    max_size=6,
)
tool_list = st.lists(
    st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries({"name": words})}),
    max_size=2,
)
tools = mostly(tool_list | tool_list.map(json.dumps), json_values)
speakers = mostly(st.sampled_from(sorted(SHAREGPT_ROLES)), text)
sharegpt_turns = st.lists(st.fixed_dictionaries({"from": speakers, "value": mostly(words, arguments)}), max_size=6)
glaive_markers = st.sampled_from(["USER: ", "ASSISTANT: ", "FUNCTION RESPONSE: ", "ASSISTANT: <functioncall> "])
glaive_call = st.sampled_from(['{"name": "lookup", "arguments": \'{"q": 1}\'}', '{"name": "lookup"}', "{"])
glaive_chat = st.lists(st.tuples(glaive_markers, mostly(words, glaive_call | text)), max_size=6).map(
    lambda turns: "\n\n".join(marker + body for marker, body in turns)
)
glaive_system = mostly(
    st.just('SYSTEM: You can use - {"name": "lookup", "parameters": {}}'), text | st.just("SYSTEM: x - {")
)
rows_by_format = {
    "openai_messages": st.fixed_dictionaries(
        {"messages": mostly(messages, json_values)}, optional={"tools": tools, "id": scalars}
    ),
    "sharegpt": st.fixed_dictionaries(
        {"conversations": mostly(sharegpt_turns, json_values)}, optional={"tools": tools}
    ),
    "glaive": st.fixed_dictionaries({"chat": mostly(glaive_chat, json_values)}, optional={"system": glaive_system}),
    "alpaca": st.fixed_dictionaries(
        {"instruction": mostly(words, json_values)}, optional={"input": mostly(words, json_values)}
    ),
    "input_output": st.fixed_dictionaries(
        {"input": mostly(words, json_values)}, optional={"output": json_values, "domain": scalars}
    ),
    "prompt": st.fixed_dictionaries({"prompt": mostly(words, messages | json_values)}, optional={"system": text}),
}
rows = st.one_of(json_values, *rows_by_format.values())
formats = st.sampled_from(["auto", *CONVERTERS])
# Mostly a row with its own format (named, or detected); sometimes anything read as any format.
rows_and_formats = mostly(
    st.one_of(*(st.tuples(r, st.sampled_from([name, "auto"])) for name, r in rows_by_format.items())),
    st.tuples(rows, formats),
)
turn_modes = st.sampled_from(["final", "every_assistant_turn"])


def check_prompt(prompt: Conversation) -> None:
    assert any(m["role"] == "user" for m in prompt.messages)
    assert prompt.messages[-1]["role"] != "assistant"
    # Text, or text parts kept as parts (SGLang hands a template that reads parts the parts: regen.chat_request).
    assert all(isinstance(m["content"], str) or all(p["type"] == "text" for p in m["content"]) for m in prompt.messages)
    assert len(prompt.sample_id) == 20
    json.dumps([prompt.messages, prompt.tools], ensure_ascii=False).encode("utf-8")


@settings(max_examples=400, deadline=None)
@given(row_and_format=rows_and_formats, turns=turn_modes)
def test_normalization_never_raises_and_gives_prompts_or_a_known_reason(
    row_and_format: tuple[Any, str], turns: Any
) -> None:
    row, source_format = row_and_format
    result = normalize_row(row, source_format, KIMI_IDS, turns)
    if isinstance(result, Rejection):
        assert result.reason in REASONS and isinstance(result.detail, str) and result.detail
    else:
        assert result and (turns == "every_assistant_turn" or len(result) == 1)
        for prompt in result:
            check_prompt(prompt)


RENDERER = ChatRenderer(lookup("kimi-k2.5-mini"))
lines = st.lists(rows.map(lambda r: json.dumps(r).encode()) | st.binary(max_size=20), max_size=12)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=lines, turns=turn_modes)
def test_prepare_accounts_for_every_row(data: list[bytes], turns: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "rows.jsonl"
        data = [line.replace(b"\n", b" ").replace(b"\r", b" ") for line in data]
        source.write_bytes(b"".join(line + b"\n" for line in data))
        storage = LocalStorage(Path(tmp) / "root")
        location = DatasetLocation(storage.root_uri, "kimi-k2.5-mini", "prop", "v1")
        config = DatasetConfig(paths=[str(source)], turns=turns)
        prepared = run_prepare(
            config, location, storage, RENDERER, PrepareSettings(shard_size=5, limit=None, workers=1)
        )
        stats = prepared.stats
        rows_read = json.loads(storage.get_bytes(location.prepared))["rows_read"]
        assert rows_read == len(data)  # every line, a blank one included
        assert stats.total == stats.kept + stats.dropped >= rows_read
        assert turns == "every_assistant_turn" or stats.total == rows_read
        assert set(stats.dropped_by_reason) <= REASONS
        kept = [r for s in prepared.shards for r in pq.read_table(storage.uri(s.prompts_key)).to_pylist()]
        assert len(kept) == stats.kept == len({r["id"] for r in kept})
        rejected = storage.list_keys(location.prepare_rejections)
        rejected_lines = storage.get_bytes(rejected[0]).splitlines() if rejected else []
        assert len(rejected_lines) == stats.dropped
