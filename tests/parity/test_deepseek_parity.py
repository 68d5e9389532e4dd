"""DeepSeek answers: a profile naming `tool_call_parser: deepseekv31` and `reasoning_parser: deepseek-v3`, with
DeepSeek's own token strings (tests/deepseek_style.py), is read as SGLang 0.5.23's chat endpoint reads it (its
deepseek-v3 reasoning parser and deepseekv31 detector, run by tests/parity/sglang_oracle.py), and validation keeps an
answer exactly when SGLang's reading of it loses nothing (as test_answer_parity.py holds Kimi's)."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import orjson
from hypothesis import example, given

from regen.chat import ChatRenderer
from regen.judge import judge_output
from regen.on_policy import assistant_message, read_message
from tests.deepseek_style import CALL_BEGIN, MARKERS, SECTION_BEGIN, SECTION_END
from tests.parity.deepseek_answers import deepseek_answer
from tests.parity.oracle import CASES, DIFFERENTIAL, Oracle
from tests.parity.test_answer_parity import READING, as_sglang_returns

# Found by the property test: `<tool_call>` written as text ends deepseek-v3's reasoning, so the section after it is
# in the answer, which SGLang reads.
TEXT_ENDS_REASONING = {
    "messages": [{"role": "user", "content": "the"}],
    "tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {}}}}],
    "text": f"\n<tool_call>{SECTION_BEGIN}{SECTION_END}",
}
RANDOM_ID = re.compile(r"call_[0-9a-f]{24}")  # serving_chat `_process_tool_call_id` for every parser but kimi_k2


def loses_something(text: str, sglang: dict[str, Any]) -> bool:
    """SGLang's message drops a call the answer wrote, holds arguments the next request cannot carry, or leaves call
    markup in the text a client sees."""
    calls = sglang["tool_calls"]
    if text.count(CALL_BEGIN) != len(calls):
        return True
    for call in calls:
        try:
            if not isinstance(orjson.loads(call["function"]["arguments"]), dict):
                return True
        except orjson.JSONDecodeError:
            return True
    seen = (sglang["content"] or "") + (sglang["reasoning_content"] or "")
    return any(marker in seen for marker in MARKERS)


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

        tail = list(roles.generation_suffix)
        names = frozenset(t["function"]["name"] for t in tools) or None
        verdict = judge_output(
            output_ids, roles, names, lambda ids: renderer.decode(ids, False), roles.phase_after(tail), lambda: tools
        )
        lost = loses_something(case["text"], sglang)
        if verdict.split == "train":
            assert not lost, f"kept ({verdict.flags}), but SGLang's reading loses something: {sglang}"
            again = assistant_message(
                output_ids, tail, roles, renderer.profile, renderer.decode, case["messages"], tools
            )
            assert isinstance(again, dict) and as_sglang_returns(again) == ours
            seen["kept, flagged" if verdict.flags else "kept"] += 1
        elif verdict.verdict in READING:
            assert lost, f"rejected ({verdict.verdict}: {verdict.detail}), but SGLang reads every call: {sglang}"
            seen["rejected for what SGLang loses"] += 1
        else:
            seen[f"rejected: {verdict.verdict}"] += 1
        seen["with calls" if sglang["tool_calls"] else "without calls"] += 1

    check()
    print(f"answer parity, deepseek: {dict(sorted(seen.items()))}")
    assert seen["with calls"] + seen["without calls"] >= CASES
    assert seen["kept"] and seen["rejected for what SGLang loses"] and seen["with calls"]
