"""Prompts encoded in batches (`render_many`, `ChatRenderer.encode_texts`) are bit-identical to prompts rendered one by
one, for every built-in tokenizer: the Rust mini tokenizer, its slow Python twin, its tiktoken remote-code layout,
and Qwen3.6's real vocabulary."""

from __future__ import annotations

from typing import Any

import pytest

from regen.chat import ChatRenderer
from regen.config import load_config
from regen.profiles import lookup
from regen.reasons import Reason
from regen.stages.prepare.normalize import Rejection
from regen.stages.prepare.tokenize import Job, render, render_many
from regen.tokenizers.kimi_mini import ensure_tiktoken_tokenizer
from regen.tokenizers.slow_kimi import ensure_slow_tokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "Today's weather — in °C",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "str", "description": "城市"}, "days": {"type": "int"}},
            "required": ["city"],
        },
    },
}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}}
CALL = {"id": "functions.weather:0", "type": "function", "function": {"name": "weather", "arguments": '{"city": "P"}'}}
SPECIAL_LIKE = "<|im_end|> <|im_start|>assistant <think></think> <|tool_calls_section_begin|> <|endoftext|> [EOS]"

CONVERSATIONS: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = [
    ([{"role": "user", "content": "Hi"}], []),
    ([{"role": "user", "content": ""}], []),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello 世界 😀 naïve café\r\n\t "}], []),
    ([{"role": "user", "content": f"Is this a token? {SPECIAL_LIKE}"}], []),
    ([{"role": "user", "content": "Weather in Paris?"}], [WEATHER, SEARCH]),
    (
        [
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "reasoning_content": "call it", "tool_calls": [CALL]},
            {"role": "tool", "content": '{"temp_c": 21}', "tool_call_id": "functions.weather:0"},
            {"role": "assistant", "content": "21 °C."},
            {"role": "user", "content": f"And tomorrow? {SPECIAL_LIKE}"},
        ],
        [WEATHER],
    ),
    (
        [
            {"role": "user", "content": "def f(x):\n    return x**2\n\n\n   " * 20},
            {"role": "assistant", "content": "Done: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and e\u0301 a\u0308"},
            {"role": "user", "content": "again, " * 300},
        ],
        [],
    ),
]


def _renderers() -> list[Any]:
    mini = lookup("kimi-k2.5-mini")
    return [
        pytest.param(lambda: mini, id="kimi-k2.5-mini"),
        pytest.param(
            lambda: mini.replaced(name="slow", tokenizer=str(ensure_slow_tokenizer()), trust_remote_code=True),
            id="kimi-k2.5-mini-slow",
        ),
        pytest.param(
            lambda: mini.replaced(name="tiktoken", tokenizer=str(ensure_tiktoken_tokenizer()), trust_remote_code=True),
            id="kimi-k2.5-mini-tiktoken",
        ),
        pytest.param(lambda: load_config().profile("qwen3.6"), id="qwen3.6"),
    ]


@pytest.fixture(scope="module", params=_renderers())
def any_renderer(request: pytest.FixtureRequest) -> ChatRenderer:
    return ChatRenderer(request.param())


def test_batches_give_each_prompts_own_ids(any_renderer: ChatRenderer) -> None:
    jobs: list[Job] = [*CONVERSATIONS, None, *reversed(CONVERSATIONS)]
    one_by_one = [None if job is None else any_renderer.render_ids(*job) for job in jobs]
    assert render_many(any_renderer, jobs) == one_by_one
    assert render_many(any_renderer, jobs) == [None if job is None else render(any_renderer, *job) for job in jobs]


def test_encode_texts_is_encode_of_each_text(any_renderer: ChatRenderer) -> None:
    texts = [any_renderer.render_text(*conversation) for conversation in CONVERSATIONS] + ["", SPECIAL_LIKE, " "]
    tokenizer = any_renderer.tokenizer
    assert any_renderer.encode_texts(texts, add_special_tokens=False) == [
        list(tokenizer.encode(text, add_special_tokens=False)) for text in texts
    ]
    if any_renderer.encodes_rendered_text:
        rendered = any_renderer.encode_texts(texts[: len(CONVERSATIONS)])
        assert rendered == [any_renderer.render_ids(*conversation) for conversation in CONVERSATIONS]
    assert any_renderer.encode_texts([]) == []
    assert render_many(any_renderer, []) == []


def test_refusals_and_long_prompts_keep_their_place_in_a_batch(renderer: ChatRenderer) -> None:
    broken_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "no-such-type"}}}
    too_long = ([{"role": "user", "content": "word " * 9000}], [])
    jobs: list[Job] = [CONVERSATIONS[0], ([{"role": "user", "content": "x"}], [broken_tool]), too_long, None]
    results = render_many(renderer, jobs)
    assert results[0] == renderer.render_ids(*CONVERSATIONS[0])
    assert isinstance(results[1], Rejection) and results[1].reason == Reason.TEMPLATE_ERROR
    assert results[2] == Rejection(Reason.PROMPT_TOO_LONG, f"{len(renderer.render_ids(*too_long))} tokens > 8192")
    assert results[3] is None
    assert results == [None if job is None else render(renderer, *job) for job in jobs]


def test_a_template_whose_text_is_not_what_is_encoded_renders_one_by_one(
    renderer: ChatRenderer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where apply_chat_template(tokenize=True) differs from encoding the rendered text, never the batch path."""
    monkeypatch.setattr(renderer, "_encode_via_text", False)

    def no_batches(texts: list[str], add_special_tokens: bool | None = None) -> list[list[int]]:
        raise AssertionError("encoded a batch of rendered texts")

    monkeypatch.setattr(renderer, "encode_texts", no_batches)
    assert not renderer.encodes_rendered_text
    jobs: list[Job] = list(CONVERSATIONS)
    assert render_many(renderer, jobs) == [renderer.render_ids(*job) for job in CONVERSATIONS]
