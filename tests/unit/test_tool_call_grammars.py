"""Tool-call grammars as data: tagged XML (Qwen3.6, SGLang's qwen3_coder) and tagged JSON (Qwen3 2504, qwen25) are
judged on the Qwen3.6 vocabulary the way Kimi's sections are on the mini one (test_validate.py): every valid call
kept, each defect for its own reason.

What the detectors accept is read from sglang `srt/function_call/qwen3_coder_detector.py` (a function runs to
`</function>` or the end, a parameter to `</parameter>`, the next `<parameter=` or `</function>`, one newline around
a value stripped) and `qwen25_detector.py` (`json.loads` of the text between the tags, `name` and `arguments`).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regen.chat import ChatRenderer
from regen.config import load_config
from regen.judge import FLAG_NO_REASONING_END, OK, Judgement, judge
from regen.on_policy import read_message
from regen.profiles import Profile, TaggedCalls
from regen.records import RawAnswer, text_digest
from regen.simulator.defects import BY_NAME, DEFECTS, DefectModel
from regen.simulator.model import ModelBehaviour, SimulatedModel
from regen.tool_calls import BadCall, read_section_call_id, read_tagged, write_tagged
from tests import deepseek_style as ds
from tests.deepseek_style import deepseek_profile

TOOLS = frozenset({"get_weather"})
XML_CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
JSON_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def xml() -> ChatRenderer:
    return ChatRenderer(load_config().profile("qwen3.6"))


@pytest.fixture(scope="module")
def tagged_json(xml: ChatRenderer) -> ChatRenderer:
    """Qwen3 (2504)'s grammar on the same vocabulary: the profile differs only in its `tool_calls`."""
    grammar = TaggedCalls(format="tagged_json", call_begin="<tool_call>", call_end="</tool_call>")
    return ChatRenderer(xml.profile.replaced(tool_calls=grammar, tool_call_parser=None))


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory: pytest.TempPathFactory) -> ChatRenderer:
    """A DeepSeek-style profile declared only as config (its own special tokens, `{name}` ids, no parser named)."""
    folder = tmp_path_factory.mktemp("deepseek")
    declared = deepseek_profile(folder, "my-deepseek")
    return ChatRenderer(
        Profile.model_validate({**declared, "name": "my-deepseek"}).with_paths(lambda p: str(folder / p))
    )


def ds_verdict(renderer: ChatRenderer, text: str) -> tuple[str, tuple[str, ...], int]:
    prompt = renderer.render_ids([{"role": "user", "content": "Weather in Paris?"}], [TOOL])
    output = renderer.tokenizer.encode(text + ds.EOS, add_special_tokens=False)
    meta = {"finish_reason": {"type": "stop", "matched": output[-1]}, "prompt_tokens": len(prompt)}
    record = RawAnswer("s1", output, {**meta, "completion_tokens": len(output)}, *text_digest(renderer.decode(output)))
    judgement = judge(prompt, record, renderer.roles, TOOLS, renderer.decode)
    return judgement.verdict, judgement.flags, judgement.tool_calls


def ds_call(name: str, arguments: str = '{"city": "Paris"}') -> str:
    return f"{ds.CALL_BEGIN}{name}{ds.SEPARATOR}{arguments}{ds.CALL_END}"


@pytest.mark.parametrize(
    "text,expected",
    [
        pytest.param(f"Need it.</think>{ds.SECTION_BEGIN}{ds_call('get_weather')}{ds.SECTION_END}", (OK, 1), id="one"),
        pytest.param(
            f"Two.</think>{ds.SECTION_BEGIN}{ds_call('get_weather')}{ds_call('get_weather', '{}')}{ds.SECTION_END}",
            (OK, 2),
            id="parallel",
        ),
        pytest.param(
            f"x</think>{ds.SECTION_BEGIN}{ds_call('')}{ds.SECTION_END}", ("tool_call_bad_id", 0), id="no-name"
        ),
        pytest.param(
            f"x</think>{ds.SECTION_BEGIN}{ds_call('get_weather:0')}{ds.SECTION_END}",
            ("tool_call_undeclared", 0),
            id="kimi-id-is-a-name-here",
        ),
        pytest.param(
            f"x</think>{ds.SECTION_BEGIN}{ds_call('get_weather', '[1]')}{ds.SECTION_END}",
            ("tool_call_bad_arguments", 0),
            id="arguments-not-an-object",
        ),
    ],
)
def test_a_config_only_profile_reads_call_ids_by_its_own_call_id_format(
    deepseek: ChatRenderer, text: str, expected: tuple[str, int]
) -> None:
    """No parser named: `call_id_format: "{name}"` decides ids, so the function name alone is a valid id (issue 35:
    kimi_k2's `functions.NAME:INDEX` rule was applied to every sections profile and rejected each one)."""
    found, _, calls = ds_verdict(deepseek, text)
    assert (found, calls) == expected


def test_a_config_only_profiles_calls_read_back_with_their_own_ids(deepseek: ChatRenderer) -> None:
    text = f"Need it.</think>Checking.{ds.SECTION_BEGIN}{ds_call('get_weather')}{ds.SECTION_END}"
    tools = [TOOL]
    message = read_message(text, True, deepseek.profile, [{"role": "user", "content": "Weather?"}], tools)
    assert message == {
        "role": "assistant",
        "content": "Checking.",
        "reasoning_content": "Need it.",
        "tool_calls": [
            {
                "id": "get_weather",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    }


@pytest.fixture(scope="module")
def deepseek_parsers(tmp_path_factory: pytest.TempPathFactory) -> ChatRenderer:
    """The same profile naming SGLang's parsers: deepseekv31 and deepseek-v3."""
    folder = tmp_path_factory.mktemp("deepseek-parsers")
    declared = deepseek_profile(folder, "my-deepseek", parser=True)
    return ChatRenderer(
        Profile.model_validate({**declared, "name": "my-deepseek"}).with_paths(lambda p: str(folder / p))
    )


SECTION_IN_REASONING = f"Thinking.{ds.SECTION_BEGIN}{ds_call('get_weather')}{ds.SECTION_END}"


def test_deepseek_v3s_reasoning_parser_does_not_end_reasoning_at_a_tool_section(
    deepseek: ChatRenderer, deepseek_parsers: ChatRenderer
) -> None:
    """SGLang's deepseek-v3 reasoning parser is Qwen3's: it ends reasoning without `</think>` only at `<tool_call>`,
    so a DeepSeek section in the reasoning is reasoning, its calls lost (tests/parity/test_deepseek_parity.py proves
    the reading); with no parser named the grammar's section ends it, as before."""
    tools, history = [TOOL], [{"role": "user", "content": "Weather?"}]
    assert ds_verdict(deepseek_parsers, SECTION_IN_REASONING)[0] == "tool_call_in_reasoning"
    message = read_message(SECTION_IN_REASONING, True, deepseek_parsers.profile, history, tools)
    assert message == {"role": "assistant", "content": "", "reasoning_content": SECTION_IN_REASONING}
    message = read_message("Hm\n<tool_call>x", True, deepseek_parsers.profile, history, tools)
    assert message == {"role": "assistant", "content": "<tool_call>x", "reasoning_content": "Hm\n"}
    assert ds_verdict(deepseek, SECTION_IN_REASONING)[:2] == (OK, ("tool_call_without_reasoning_end",))


@pytest.mark.parametrize(
    "arguments,expected",
    [
        ("null", OK),
        ("0", OK),
        (" {}\n", OK),
        ('{"a": NaN}', "tool_call_bad_arguments"),
        ("{} {}", "tool_call_bad_arguments"),
    ],
)
def test_deepseekv31_arguments_are_judged_as_its_detector_returns_them(
    deepseek_parsers: ChatRenderer, arguments: str, expected: str
) -> None:
    """deepseekv31 re-dumps what Python's json reads, a falsy value as {} (a usable call); NaN loads but cannot be
    sent back; text json cannot read drops every call."""
    text = f"x</think>{ds.SECTION_BEGIN}{ds_call('get_weather', arguments)}{ds.SECTION_END}"
    assert ds_verdict(deepseek_parsers, text)[0] == expected


def test_a_named_parser_reads_by_its_own_rule() -> None:
    """kimi_k2's rule where the profile names it; deepseekv31's (the id is the name); the literal format otherwise."""
    kimi = re.compile(r"functions\.(?P<name>.+):\d+")
    assert read_section_call_id(" get_weather:0 ", list, "{}", "kimi_k2", None)[0] == "get_weather"
    assert read_section_call_id("get_weather", list, "{}", "deepseekv31", None) == ("get_weather", ())
    assert read_section_call_id("functions.get_weather:0", list, "{}", None, kimi) == ("get_weather", ())
    with pytest.raises(BadCall):
        read_section_call_id("get_weather:0", list, "{}", None, kimi)


def judged(renderer: ChatRenderer, text: str, tools: frozenset[str] | None = TOOLS, schemas: Any = list) -> Judgement:
    """The judgement of an answer written as text after the profile's prompt (which opens the reasoning); `schemas`:
    the declared tools, by which qwen3_coder types each parameter."""
    prompt = renderer.render_ids([{"role": "user", "content": "Weather in Paris?"}], None)
    output = renderer.tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)
    meta = {"finish_reason": {"type": "stop", "matched": output[-1]}, "prompt_tokens": len(prompt)}
    record = RawAnswer("s1", output, {**meta, "completion_tokens": len(output)}, *text_digest(renderer.decode(output)))
    return judge(prompt, record, renderer.roles, tools, renderer.decode, schemas)


def verdict(renderer: ChatRenderer, text: str, tools: frozenset[str] | None = TOOLS) -> tuple[str, tuple[str, ...]]:
    judgement = judged(renderer, text, tools)
    return judgement.verdict, judgement.flags


@pytest.mark.parametrize(
    "text,expected",
    [
        pytest.param(f"Need it.\n</think>\n\n{XML_CALL}", (OK, ()), id="after-reasoning"),
        pytest.param(f"Need it.\n{XML_CALL}", (OK, (FLAG_NO_REASONING_END,)), id="without-reasoning-end"),
        pytest.param(f"Two.\n</think>\n\n{XML_CALL}\n{XML_CALL}", (OK, ()), id="parallel-calls"),
        pytest.param(
            "Hm.</think><tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
            (OK, ()),
            id="multi-line-value-and-two-parameters",
        ),
        pytest.param(
            "Hm.</think><tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>",
            (OK, ()),
            id="parameter-closed-by-the-function-end",  # the detector reads it: the call is not lost
        ),
        pytest.param(
            "Hm.</think><tool_call>\n<function=get_weather>\n</function>\n</tool_call>", (OK, ()), id="no-parameters"
        ),
    ],
)
def test_xml_calls_the_server_reads_are_kept(xml: ChatRenderer, text: str, expected: tuple[str, Any]) -> None:
    assert verdict(xml, text) == expected


@pytest.mark.parametrize(
    "text,tools,reason",
    [
        pytest.param("Hm.</think><tool_call>\nget_weather(city='Paris')\n</tool_call>", TOOLS, "malformed", id="no-fn"),
        pytest.param(
            "Hm.</think><tool_call>\nSure!\n<function=get_weather>\n</function>\n</tool_call>",
            TOOLS,
            "malformed",
            id="stray-text",
        ),
        pytest.param(
            "Hm.</think><tool_call>\n<function=get_weather\n</function>\n</tool_call>", TOOLS, "malformed", id="name"
        ),
        pytest.param(
            "Hm.</think><tool_call>\n<function=get_weather>\n<parameter=city\nParis\n</parameter>\n</function>\n"
            "</tool_call>",
            TOOLS,
            "bad_arguments",
            id="parameter-name-not-closed",
        ),
        pytest.param(
            "Hm.</think><tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n<parameter=city>\nB\n"
            "</parameter>\n</function>\n</tool_call>",
            TOOLS,
            "bad_arguments",
            id="parameter-given-twice",
        ),
        pytest.param(f"Hm.</think>{XML_CALL.replace('get_weather', 'rm_rf')}", TOOLS, "undeclared", id="undeclared"),
        pytest.param(f"Hm.</think>{XML_CALL}", None, "without_tools", id="no-tools-declared"),
        pytest.param(f"Hm.</think>{XML_CALL.removesuffix('</tool_call>')}", TOOLS, "unbalanced", id="unclosed"),
        pytest.param("Hm.</think>It is sunny.</tool_call>", TOOLS, "unbalanced", id="end-without-begin"),
        pytest.param(f"Hm.</think><tool_call>{XML_CALL}", TOOLS, "unbalanced", id="begin-inside-a-call"),
    ],
)
def test_xml_defects_each_have_their_reason(
    xml: ChatRenderer, text: str, tools: frozenset[str] | None, reason: str
) -> None:
    assert verdict(xml, text, tools)[0] == f"tool_call_{reason}"


TYPED_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"properties": {"city": {"type": "string"}, "days": {"type": "array"}}},
    },
}


def test_an_xml_value_its_schema_types_as_no_json_loses_every_call(xml: ChatRenderer) -> None:
    """qwen3_coder reads an array parameter as JSON, else as a Python literal: a set, which no JSON holds, fails the
    detector as a whole (SGLang returns the text as content); the same value as a JSON list is a call."""
    call = (
        "Hm.</think><tool_call>\n<function=get_weather>\n<parameter=days>\n{v}\n</parameter>\n</function>\n</tool_call>"
    )
    assert judged(xml, call.format(v="[1, 2]"), schemas=lambda: [TYPED_TOOL]).verdict == OK
    judgement = judged(xml, call.format(v="{1, 2}"), schemas=lambda: [TYPED_TOOL])
    assert judgement.verdict == "tool_call_bad_arguments" and "not JSON" in judgement.detail


def test_tagged_json_arguments_holding_xml_text_are_not_read_as_xml(tagged_json: ChatRenderer) -> None:
    """qwen25's detector reads JSON alone: XML in a string argument is text, whatever qwen3_coder would make of it."""
    xml_text = "<function=get_weather><parameter=days>{1, 2}</parameter></function>"
    call = f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{xml_text}"}}}}\n</tool_call>'
    assert judged(tagged_json, f"Hm.</think>{call}", schemas=lambda: [TYPED_TOOL]).verdict == OK


def test_a_call_end_with_no_call_open_is_out_of_order_where_it_stands(xml: ChatRenderer) -> None:
    judgement = judged(xml, "Hm.</think>It is sunny.</tool_call>")
    end = xml.tokenizer.encode("Hm.</think>It is sunny.", add_special_tokens=False)
    assert (judgement.verdict, judgement.detail) == ("tool_call_unbalanced", f"call_end out of order at {len(end)}")


def test_deepseek_v3s_reasoning_ends_at_the_tool_call_text_before_a_section(deepseek_parsers: ChatRenderer) -> None:
    """The reasoning parser ends reasoning at `<tool_call>` written as text: a section after it is in the answer."""
    text = f"Hm\n<tool_call>{ds.SECTION_BEGIN}{ds_call('get_weather')}{ds.SECTION_END}"
    assert ds_verdict(deepseek_parsers, text) == (OK, (FLAG_NO_REASONING_END,), 1)


@pytest.mark.parametrize(
    "text,expected",
    [
        pytest.param(f"Need it.</think>\n\n{JSON_CALL}", OK, id="valid"),
        pytest.param(f"Need it.\n{JSON_CALL}\n{JSON_CALL}", OK, id="parallel-without-reasoning-end"),
        pytest.param('Hm.</think><tool_call>\n{"name": "get_weather", \n</tool_call>', "bad_arguments", id="json"),
        pytest.param('Hm.</think><tool_call>\n{"arguments": {}}\n</tool_call>', "malformed", id="no-name"),
        pytest.param(
            'Hm.</think><tool_call>\n{"name": "get_weather", "arguments": [1]}\n</tool_call>',
            "bad_arguments",
            id="arguments-not-an-object",
        ),
        pytest.param(f"Hm.</think>{JSON_CALL.replace('get_weather', 'rm_rf')}", "undeclared", id="undeclared"),
        pytest.param(f"Hm.</think>{JSON_CALL.removesuffix('</tool_call>')}", "unbalanced", id="unclosed"),
    ],
)
def test_tagged_json_calls_are_judged_by_their_own_grammar(tagged_json: ChatRenderer, text: str, expected: str) -> None:
    assert verdict(tagged_json, text)[0] == (expected if expected == OK else f"tool_call_{expected}")


def test_a_tagged_grammar_needs_no_section_tokens(xml: ChatRenderer) -> None:
    calls = xml.roles.tool_calls
    assert calls is not None and (calls.format, calls.call_begin, calls.call_end) == ("tagged_xml", 248058, 248059)
    assert calls.section_begin is None and calls.call_id is None
    assert xml.roles.as_record()["tool_call_ids"] == {"format": "tagged_xml", "call_begin": 248058, "call_end": 248059}


def test_a_call_is_written_exactly_as_the_template_renders_it(xml: ChatRenderer) -> None:
    """What the simulator writes for a call is what Qwen3.6's template renders for the same call in the history: the
    simulated model answers in its own prompt format."""
    arguments = {"city": "Paris", "days": 3, "units": ["c"], "detail": {"hourly": True}}
    history = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": arguments}}],
        },
        {"role": "tool", "content": "sunny"},
    ]
    text = xml.render_text(history, None)
    assert "<tool_call>" + write_tagged("tagged_xml", "get_weather", arguments) + "</tool_call>" in text


names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,20}", fullmatch=True)
values = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30).filter(lambda v: "<" not in v)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(name=names, arguments=st.dictionaries(names, values, max_size=4))
def test_what_is_written_reads_back(name: str, arguments: dict[str, str]) -> None:
    assert read_tagged("tagged_xml", write_tagged("tagged_xml", name, arguments)) == [(name, arguments)]
    assert read_tagged("tagged_json", write_tagged("tagged_json", name, arguments)) == [(name, arguments)]


TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"properties": {"city": {"type": "string"}}}},
}
TOOL_KINDS = [kind.name for kind in DEFECTS if "tool_calls" in kind.needs]


@pytest.mark.parametrize("kind", TOOL_KINDS)
@pytest.mark.parametrize("grammar", ["xml", "tagged_json", "deepseek"])
def test_the_simulator_writes_each_tool_defect_in_the_profiles_grammar(
    request: pytest.FixtureRequest, grammar: str, kind: str
) -> None:
    """Every tool defect the grammar can carry is planted in it and rejected for its own reason; a kind it cannot
    carry (a call id, in a grammar without ids) is refused when the simulator starts, not planted wrongly."""
    renderer: ChatRenderer = request.getfixturevalue(grammar)
    defects = DefectModel({kind: 1.0})
    calls = renderer.roles.tool_calls
    assert calls is not None
    if calls.format not in BY_NAME[kind].formats:
        with pytest.raises(ValueError, match=f"{kind}.*tool-call grammar of format {BY_NAME[kind].formats[0]}"):
            SimulatedModel(renderer.profile, ModelBehaviour(defects=defects))
        return
    model = SimulatedModel(renderer.profile, ModelBehaviour(defects=defects, omit_think_end_rate=0.3))
    tools = [TOOL] if BY_NAME[kind].tools else None
    judged = []
    for i in range(12):
        prompt = renderer.render_ids([{"role": "user", "content": f"Weather, take {i}?"}], tools)
        planted = model.answer(prompt)
        assert planted.defect == kind
        decoded = renderer.decode(planted.ids)
        meta = {"finish_reason": {"type": "stop", "matched": planted.ids[-1]}, "prompt_tokens": len(prompt)}
        record = RawAnswer("s", planted.ids, {**meta, "completion_tokens": len(planted.ids)}, *text_digest(decoded))
        declared = frozenset({"get_weather"}) if tools else None
        judged.append(judge(prompt, record, renderer.roles, declared, renderer.decode).verdict)
    assert set(judged) == {BY_NAME[kind].reason.value}, judged


@pytest.mark.parametrize("grammar", ["xml", "tagged_json", "deepseek"])
def test_the_simulators_clean_tool_calls_pass_validation(request: pytest.FixtureRequest, grammar: str) -> None:
    renderer: ChatRenderer = request.getfixturevalue(grammar)
    model = SimulatedModel(renderer.profile, ModelBehaviour(tool_call_rate=1.0, omit_think_end_rate=0.5))
    flags = []
    for i in range(16):
        prompt = renderer.render_ids([{"role": "user", "content": f"Weather, take {i}?"}], [TOOL])
        ids = model.answer(prompt).ids
        meta = {"finish_reason": {"type": "stop", "matched": ids[-1]}, "prompt_tokens": len(prompt)}
        record = RawAnswer("s", ids, {**meta, "completion_tokens": len(ids)}, *text_digest(renderer.decode(ids)))
        judgement = judge(prompt, record, renderer.roles, frozenset({"get_weather"}), renderer.decode)
        assert (judgement.verdict, judgement.tool_calls) == (OK, 1), renderer.decode(ids)
        flags += judgement.flags
    assert FLAG_NO_REASONING_END in flags  # the quirk is written in tagged grammars too, and kept
