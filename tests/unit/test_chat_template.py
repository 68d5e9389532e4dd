"""The mini tokenizer renders exactly the text Kimi-K2.5's real tokenizer renders: strings and ids.

Every expected string below is what Kimi-K2.5's own chat template renders for that conversation: the template as
vendored in lightseekorg/smg `crates/tokenizer/tests/fixtures/kimi_k25/chat_template.jinja`
@ ed0f623ffb1c5a7ce3b8bd7a3d41a0292990a82f, through transformers' `apply_chat_template`, with the kwargs Kimi's
`tokenization_kimi.py` adds (tools key-sorted, `tools_ts_str` from Kimi's `tool_declaration_ts.py` as vendored in
thinking-machines-lab/tinker-cookbook `tinker_cookbook/renderers/kimi_k2_5_tool_declaration_ts.py`
@ f46503488a5f83bcd19b2eeb22a1cf431761be4e, `thinking` True unless given). Beside each case: the template rule it pins.
"""

from __future__ import annotations

from typing import Any

import pytest

from regen.chat import ChatRenderer
from regen.profiles import lookup
from regen.tokenizers.kimi_mini import ensure_tiktoken_tokenizer
from regen.tokenizers.slow_kimi import ensure_slow_tokenizer
from tests.messages import assistant, call, function_tool, result

WEATHER_TOOL = function_tool(
    "get_weather",
    "Get weather",
    {"city": {"type": "string", "description": "City name"}, "unit": {"enum": ["c", "f"]}},
    ["city"],
)
# The real declaration of WEATHER_TOOL (KIMI_K25.md's example; the encoder's rules in test_tool_declaration_ts.py).
WEATHER_DECLARATION = (
    "<|im_system|>tool_declare<|im_middle|># Tools\n\n## functions\nnamespace functions {\n// Get weather\n"
    'type get_weather = (_: {\n  // City name\n  city: string,\n  unit?: "c" | "f"\n}) => any;\n}\n<|im_end|>'
)
GEN = "<|im_assistant|>assistant<|im_middle|><think>"  # generation prompt, thinking on (default)
GEN_NO_THINK = "<|im_assistant|>assistant<|im_middle|><think></think>"  # generation prompt, thinking=False


def section(*calls: tuple[int, str]) -> str:
    inner = "".join(
        f"<|tool_call_begin|>functions.get_weather:{i}<|tool_call_argument_begin|>{args}<|tool_call_end|>"
        for i, args in calls
    )
    return f"<|tool_calls_section_begin|>{inner}<|tool_calls_section_end|>"


CASES = [
    pytest.param(  # rule: user turn header, no default system prompt
        [{"role": "user", "content": "Hi"}],
        None,
        True,
        "<|im_user|>user<|im_middle|>Hi<|im_end|>" + GEN,
        id="plain",
    ),
    pytest.param(  # rule: system turns under <|im_system|>
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        None,
        True,
        "<|im_system|>system<|im_middle|>Be brief.<|im_end|><|im_user|>user<|im_middle|>Hi<|im_end|>" + GEN,
        id="system",
    ),
    pytest.param(  # rule: history (up to the last answer) shows <think></think>, its reasoning dropped
        [
            {"role": "user", "content": "Q1"},
            assistant("A1", "old thoughts"),
            {"role": "user", "content": "Q2"},
        ],
        None,
        True,
        "<|im_user|>user<|im_middle|>Q1<|im_end|><|im_assistant|>assistant<|im_middle|><think></think>A1<|im_end|>"
        "<|im_user|>user<|im_middle|>Q2<|im_end|>" + GEN,
        id="multi-turn-history-reasoning-dropped",
    ),
    pytest.param(  # rule: assistant turns after the last answer keep <think>{reasoning_content}</think>
        [
            {"role": "user", "content": "Q1"},
            assistant("A1", "old thoughts"),
            {"role": "user", "content": "Weather in Paris?"},
            assistant("", "call it", [call(0, '{"city": "Paris"}')]),
            result(0, "rain"),
            assistant("Checking Oslo too.", "compare", [call(1, '{"city": "Oslo"}')]),
            result(1, "snow"),
        ],
        [WEATHER_TOOL],
        True,
        WEATHER_DECLARATION + "<|im_user|>user<|im_middle|>Q1<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think></think>A1<|im_end|>"
        "<|im_user|>user<|im_middle|>Weather in Paris?<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>call it</think>"
        + section((0, '{"city": "Paris"}'))
        + "<|im_end|><|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:0\nrain<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>compare</think>Checking Oslo too."
        + section((1, '{"city": "Oslo"}'))
        + "<|im_end|><|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:1\nsnow<|im_end|>"
        + GEN,
        id="multi-turn-current-tool-turns-keep-reasoning",
    ),
    pytest.param(  # rules: TypeScript tool_declare first; a tool result's header is its name; "## Return of"
        [
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Weather in Paris?"},
            assistant("", "need the tool", [call(0, '{"city": "Paris"}')]),
            result(0, '{"temp": 21}'),
        ],
        [WEATHER_TOOL],
        True,
        WEATHER_DECLARATION + "<|im_system|>system<|im_middle|>Use tools.<|im_end|>"
        "<|im_user|>user<|im_middle|>Weather in Paris?<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>need the tool</think>"
        + section((0, '{"city": "Paris"}'))
        + '<|im_end|><|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:0\n{"temp": 21}<|im_end|>'
        + GEN,
        id="tools-call-and-named-result",
    ),
    pytest.param(  # rules: calls chained in one section; arguments verbatim, or tojson (", " and ": ") for objects
        [
            {"role": "user", "content": "Paris and Oslo?"},
            assistant("", "two cities", [call(0, '{"city": "Paris"}'), call(1, {"city": "Oslo", "days": 2})]),
            result(0, "21"),
            result(1, "3"),
            assistant("Paris 21, Oslo 3.", "compare"),
            {"role": "user", "content": "Thanks"},
        ],
        [WEATHER_TOOL],
        True,
        WEATHER_DECLARATION + "<|im_user|>user<|im_middle|>Paris and Oslo?<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think></think>"
        + section((0, '{"city": "Paris"}'), (1, '{"city": "Oslo", "days": 2}'))
        + "<|im_end|><|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:0\n21<|im_end|>"
        "<|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:1\n3<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think></think>Paris 21, Oslo 3.<|im_end|>"
        "<|im_user|>user<|im_middle|>Thanks<|im_end|>" + GEN,
        id="parallel-calls-then-answer",
    ),
    pytest.param(  # rule: thinking=False empties <think> in the current turns and in the generation prompt
        [
            {"role": "user", "content": "Weather in Oslo?"},
            assistant("Let me check.", "call the tool", [call(0, '{"city": "Oslo"}')]),
            result(0, "snow"),
        ],
        [WEATHER_TOOL],
        False,
        WEATHER_DECLARATION + "<|im_user|>user<|im_middle|>Weather in Oslo?<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think></think>Let me check."
        + section((0, '{"city": "Oslo"}'))
        + "<|im_end|><|im_system|>get_weather<|im_middle|>## Return of functions.get_weather:0\nsnow<|im_end|>"
        + GEN_NO_THINK,
        id="thinking-off-tool-calling-turn",
    ),
    pytest.param(  # rule: an image part is the media placeholder and a newline; text parts join with nothing
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in "},
                    {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
                    {"type": "text", "text": "this picture?"},
                    {"type": "text", "text": " Be brief."},
                ],
            }
        ],
        None,
        True,
        "<|im_user|>user<|im_middle|>What is in <|media_begin|>image<|media_content|><|media_pad|><|media_end|>\n"
        "this picture? Be brief.<|im_end|>" + GEN,
        id="list-content-image-and-text",
    ),
    pytest.param(  # rule: every header is `name or role`; SGLang drops a user's name (its user model has none)
        [
            {"role": "system", "name": "rules", "content": "Be kind."},
            {"role": "user", "name": "alice", "content": "Hi"},
            {"role": "assistant", "name": "helper", "content": "Hello, alice."},
            {"role": "user", "name": "alice", "content": "Bye"},
        ],
        None,
        True,
        "<|im_system|>rules<|im_middle|>Be kind.<|im_end|><|im_user|>user<|im_middle|>Hi<|im_end|>"
        "<|im_assistant|>helper<|im_middle|><think></think>Hello, alice.<|im_end|>"
        "<|im_user|>user<|im_middle|>Bye<|im_end|>" + GEN,
        id="named-turns",
    ),
    pytest.param(  # rule: a schema the encoder refuses -> compact JSON of the key-sorted tools, each tool as
        # SGLang's chat endpoint dumps its `Tool` model (absent description null, strict only when given,
        # defer_loading null)
        [{"role": "user", "content": "Hi"}],
        [
            {
                "type": "function",
                "function": {
                    "parameters": {
                        "required": ["q"],
                        "type": "object",
                        "properties": {"q": {"description": "free-form, no type"}},
                    },
                    "name": "search",
                },
            }
        ],
        True,
        '<|im_system|>tool_declare<|im_middle|>[{"defer_loading":null,"function":{"description":null,"name":"search",'
        '"parameters":{"properties":{"q":{"description":"free-form, no type"}},"required":["q"],"type":"object"}},'
        '"type":"function"}]<|im_end|>'
        "<|im_user|>user<|im_middle|>Hi<|im_end|>" + GEN,
        id="tools-json-fallback-key-sorted",
    ),
]


def renderer_with(base: ChatRenderer, thinking: bool, **changes: Any) -> ChatRenderer:
    if thinking and not changes:
        return base
    suffix = GEN if thinking else GEN_NO_THINK
    name = base.profile.name + ("" if thinking else "-instant") + ("-slow" if changes else "")
    return ChatRenderer(
        base.profile.replaced(
            name=name, chat_template_kwargs={"thinking": thinking}, generation_suffix=suffix, **changes
        )
    )


@pytest.mark.parametrize("messages,tools,thinking,expected", CASES)
def test_rendered_prompt_is_what_kimi_renders(
    renderer: ChatRenderer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    thinking: bool,
    expected: str,
) -> None:
    chat = renderer_with(renderer, thinking)
    assert chat.render_text(messages, tools) == expected
    ids = chat.render_ids(messages, tools)
    assert ids == chat.tokenizer.encode(expected, add_special_tokens=False)
    assert ids[-len(chat.roles.generation_suffix) :] == list(chat.roles.generation_suffix)
    assert ids[-2:] == ([163606, 163607] if not thinking else [163601, 163606])


# Tokenizers loaded as Kimi-K2.5's is, through auto_map and trust_remote_code: the slow twin (a Python BPE), and the
# mini vocabulary in Kimi's own layout (tiktoken.model and a TikTokenTokenizer module with the structure of Kimi's,
# which needs the transformers-4 import that regen.chat restores): the production loading path.
REMOTE_LAYOUTS = [
    pytest.param(ensure_slow_tokenizer, "SlowKimiMiniTokenizer", id="slow-twin"),
    pytest.param(ensure_tiktoken_tokenizer, "TikTokenTokenizer", id="kimi-tiktoken-layout"),
]


@pytest.mark.parametrize("build,class_name", REMOTE_LAYOUTS)
@pytest.mark.parametrize("messages,tools,thinking,expected", CASES)
def test_remote_code_tokenizers_render_the_same_ids(
    renderer: ChatRenderer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    thinking: bool,
    expected: str,
    build: Any,
    class_name: str,
) -> None:
    remote = renderer_with(renderer, thinking, tokenizer=str(build()), trust_remote_code=True)
    assert type(remote.tokenizer).__name__ == class_name and not remote.tokenizer.is_fast
    assert remote.render_text(messages, tools) == expected
    assert remote.render_ids(messages, tools) == renderer_with(renderer, thinking).render_ids(messages, tools)
    assert remote.roles == renderer_with(renderer, thinking).roles


def test_plain_prompt_ids_are_literal(renderer: ChatRenderer) -> None:
    ids = renderer.render_ids([{"role": "user", "content": "Hi"}], None)
    user, assistant = (renderer.tokenizer.encode(w, add_special_tokens=False) for w in ("user", "assistant"))
    hi = renderer.tokenizer.encode("Hi", add_special_tokens=False)
    assert ids == [163587, *user, 163601, *hi, 163586, 163588, *assistant, 163601, 163606]


def test_thinking_defaults_to_on_as_in_kimis_tokenizer_class(renderer: ChatRenderer) -> None:
    """Kimi's `apply_chat_template` passes `thinking=True` unless told otherwise; so does the mini tokenizer's."""
    tokenizer = renderer.tokenizer
    messages = [{"role": "user", "content": "Hi"}]
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False).endswith(GEN)
    no_think = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, thinking=False)
    assert no_think.endswith(GEN_NO_THINK)


def test_token_roles_resolve_to_kimi_ids(renderer: ChatRenderer) -> None:
    roles = renderer.roles
    assert (roles.reasoning_start, roles.reasoning_end) == (163606, 163607)
    assert roles.eos_ids == {163586, 163585}
    assert roles.tool_calls is not None and roles.tool_calls.section_begin == 163595
    assert roles.generation_suffix[0] == 163588 and roles.generation_suffix[-1] == 163606


def test_unknown_profile_says_which_exist() -> None:
    with pytest.raises(ValueError, match=r"unknown profile .kimi-k3.; known: kimi-k2\.5, kimi-k2\.5-mini"):
        lookup("kimi-k3")


def test_tool_call_arguments_are_printed_as_sglang_parses_them(renderer: ChatRenderer) -> None:
    """SGLang's chat endpoint parses `arguments` text with orjson before templating (serving_chat.py,
    normalize_assistant_tool_call_arguments), and Kimi's template prints the object with `tojson`: a dataset's compact
    or indented JSON is re-spaced, and an integer past 64 bits is a float by then. The dataset's text never reaches the
    prompt."""
    history = [{"role": "user", "content": "Go"}]
    for arguments, printed in [
        ('{"city":"Paris","days":2}', '{"city": "Paris", "days": 2}'),
        ('{\n  "city": "Paris"\n}', '{"city": "Paris"}'),
        ('{"n": 123456789012345678901234567890}', '{"n": 1.2345678901234568e+29}'),
        ({"city": "Zürich"}, '{"city": "Zürich"}'),
    ]:
        messages = [*history, {"role": "assistant", "content": "", "tool_calls": [call(0, arguments)]}]
        text = renderer.render_text([*messages, result(0, "ok")], None)
        assert f"<|tool_call_argument_begin|>{printed}<|tool_call_end|>" in text, arguments
