"""DeepSeek answers: a profile naming `tool_call_parser: deepseekv31` and `reasoning_parser: deepseek-v3`, with
DeepSeek's own token strings (tests/deepseek_style.py), is read as SGLang 0.5.23's chat endpoint reads it (its
deepseek-v3 reasoning parser and deepseekv31 detector, run by tests/parity/sglang_oracle.py), and validation keeps an
answer exactly when SGLang's reading of it loses nothing (as test_answer_parity.py holds Kimi's)."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from hypothesis import example, given

from regen.chat import ChatRenderer
from regen.on_policy import assistant_message, read_message
from tests.deepseek_style import CALL_BEGIN, MARKERS, SECTION_BEGIN, SECTION_END
from tests.parity.deepseek_answers import deepseek_answer
from tests.parity.judging import as_sglang_returns, loses_something, tally, verdict_of
from tests.parity.oracle import CASES, DIFFERENTIAL, Oracle

# Found by the property test: `<tool_call>` written as text ends deepseek-v3's reasoning, so the section after it is
# in the answer, which SGLang reads.
TEXT_ENDS_REASONING = {
    "messages": [{"role": "user", "content": "the"}],
    "tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {}}}}],
    "text": f"\n<tool_call>{SECTION_BEGIN}{SECTION_END}",
}
RANDOM_ID = re.compile(r"call_[0-9a-f]{24}")  # serving_chat `_process_tool_call_id` for every parser but kimi_k2


def without_ids(message: dict[str, Any]) -> dict[str, Any]:
    return {**message, "tool_calls": [c["function"] for c in message["tool_calls"]]}


def test_deepseek_answers_read_and_judged_as_sglang_reads_them(
    deepseek_renderer: ChatRenderer, deepseek_oracle: Oracle
) -> None:
    seen: Counter[str] = Counter()
    renderer = deepseek_renderer
    roles = renderer.roles

    @DIFFERENTIAL
    @given(deepseek_answer())
    @example(TEXT_ENDS_REASONING)
    def check(case: dict[str, Any]) -> None:
        tools = case["tools"]
        output_ids = [*renderer.tokenizer.encode(case["text"], add_special_tokens=False), min(roles.eos_ids)]
        body: dict[str, Any] = {"messages": case["messages"], "chat_template_kwargs": {"thinking": True}}
        if tools:
            body["tools"] = tools
        sglang = deepseek_oracle.ask({"kind": "answer", "request": body, "output_ids": output_ids})
        theirs = {k: sglang[k] for k in ("content", "reasoning_content", "tool_calls")}
        text = renderer.decode(output_ids[:-1], not tools)
        ours = as_sglang_returns(read_message(text, True, renderer.profile, case["messages"], tools))
        # SGLang gives deepseekv31 calls random ids; the template writes calls by name, never by id.
        assert all(RANDOM_ID.fullmatch(c["id"]) for c in theirs["tool_calls"]), theirs
        assert [c["id"] for c in ours["tool_calls"]] == [c["function"]["name"] for c in ours["tool_calls"]]
        assert without_ids(ours) == without_ids(theirs)

        lost = loses_something(case["text"], sglang, CALL_BEGIN, MARKERS, arguments_shown=False)
        tail = list(roles.generation_suffix)

        def reads_back() -> bool:
            again = assistant_message(
                output_ids, tail, roles, renderer.profile, renderer.decode, case["messages"], tools
            )
            return isinstance(again, dict) and as_sglang_returns(again) == ours

        tally(seen, verdict_of(output_ids, renderer, tools), lost, sglang, reads_back)

    check()
    print(f"answer parity, deepseek: {dict(sorted(seen.items()))}")
    assert seen["with calls"] + seen["without calls"] >= CASES
    assert seen["kept"] and seen["rejected for what SGLang loses"] and seen["with calls"]
