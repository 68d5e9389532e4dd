"""Prompts: what `prepare` makes of a conversation is what SGLang 0.5.23's `/v1/chat/completions` tokenizes for the
same request, id for id, or both refuse it. SGLang's side is its own code (tests/parity/sglang_oracle.py)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import example, given, settings

from regen.chat import ChatRenderer
from regen.chat_request import Refused
from regen.stages.prepare.formats import normalize_row
from regen.stages.prepare.normalize import Conversation, Rejection
from regen.stages.prepare.tokenize import render
from tests.parity.conversations import LONG_TEXT, conversation
from tests.parity.oracle import CASES, DIFFERENTIAL, Oracle

KIMI_IDS = "functions.{name}:{index}"
# Cases hypothesis found once, kept so that every run tries them.
FOUND_IN_CI = {
    "messages": [
        {"role": "user", "content": "the"},
        {"role": "assistant", "content": "</think>", "reasoning_content": ""},
        {"role": "user", "content": "the"},
    ],
    "tools": [],
    "thinking": False,
    "refused": None,
}


def project_prompt(case: dict[str, Any], renderer: ChatRenderer) -> list[int] | str:
    """The ids prepare stores for the request's conversation (normalize, the final prompt, render), or why it
    refuses it."""
    row = {"messages": case["messages"], "tools": case["tools"]}
    prompts = normalize_row(row, "openai_messages", KIMI_IDS, "final")
    if isinstance(prompts, Rejection):
        return f"{prompts.reason}: {prompts.detail}"
    [prompt] = prompts
    assert isinstance(prompt, Conversation)
    try:
        ids = render(renderer, prompt.messages, prompt.tools)
    except Refused as e:
        return f"refused: {e}"
    return ids if isinstance(ids, list) else f"{ids.reason}: {ids.detail}"


def sglang_prompt(case: dict[str, Any], renderer: ChatRenderer, oracle: Oracle) -> list[int] | str:
    """What SGLang tokenizes for the request a client sends, with the profile's chat_template_kwargs."""
    body: dict[str, Any] = {"messages": case["messages"], "chat_template_kwargs": renderer.profile.chat_template_kwargs}
    if case["tools"]:
        body["tools"] = case["tools"]
    answer = oracle.ask({"kind": "prompt", "request": body})
    return answer["ids"] if "ids" in answer else f"refused: {answer['refused']}"


def agree(case: dict[str, Any], renderers: dict[bool, ChatRenderer], oracle: Oracle) -> str:
    """The kind of agreement: equal ids, or both refusing; anything else fails with both sides shown."""
    renderer = renderers[case["thinking"]]
    ours, theirs = project_prompt(case, renderer), sglang_prompt(case, renderer, oracle)
    if isinstance(ours, list) and isinstance(theirs, list):
        assert ours == theirs, (
            f"ids differ at {next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b)}"
        )
        return "equal"
    both = not isinstance(ours, list) and not isinstance(theirs, list)
    assert both, f"prepare: {ours!s:.300}; SGLang: {theirs!s:.300}"
    return "both refuse"


@pytest.mark.parametrize("model", ["kimi", "qwen"])
def test_prepared_prompts_are_sglangs_own(model: str, request: pytest.FixtureRequest) -> None:
    """Kimi-K2.5 (remote-code tokenizer, kimi_k2) and Qwen3.6 (a fast tokenizer and a template file given to the
    server as --chat-template, qwen3_coder). For Kimi every refusal is one the request was drawn to get; Qwen3.6's
    template refuses more shapes itself (roles it does not know), which both sides must refuse alike."""
    renderers, oracle = request.getfixturevalue(f"{model}_renderers"), request.getfixturevalue(f"{model}_oracle")
    seen: Counter[str] = Counter()

    @DIFFERENTIAL
    @given(conversation())
    @example(FOUND_IN_CI).via("an empty reasoning_content was dropped, and Qwen3.6 read reasoning out of the content")
    def check(case: dict[str, Any]) -> None:
        kind = agree(case, renderers, oracle)
        if model == "kimi":
            assert (kind == "both refuse") == (case["refused"] is not None), (kind, case["refused"])
        seen[kind] += 1
        seen["with tools" if case["tools"] else "without tools"] += 1

    check()
    print(f"prompt parity, {model}: {dict(seen)}")
    assert seen["equal"] + seen["both refuse"] >= CASES and seen["both refuse"] > 0 and seen["equal"] > CASES // 2


def test_long_prompts_follow_kimis_encode_as_sglang_calls_it(
    kimi_renderers: dict[bool, ChatRenderer], kimi_oracle: Oracle
) -> None:
    """Kimi's `encode` cuts runs of over 25,000 characters (special-token text counts): SGLang encodes the rendered
    text that way, and so must prepare, where the template's own tokenization would not."""

    @settings(max_examples=40, deadline=None, derandomize=True, database=None)
    @given(LONG_TEXT)
    def check(text: str) -> None:
        case = {"messages": [{"role": "user", "content": text}], "tools": [], "thinking": True, "refused": None}
        assert agree(case, kimi_renderers, kimi_oracle) == "equal"

    check()
