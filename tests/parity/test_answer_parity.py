"""Answers: what the project reads from an answer is what SGLang 0.5.23's chat endpoint returns for it (its reasoning
parser, kimi_k2 detector and `_process_tool_call_id`, run by tests/parity/sglang_oracle.py), and validation keeps an
answer exactly when SGLang's reading of it loses nothing.

- Reading: for every answer, valid or not, `on_policy.read_message` gives SGLang's message: content, reasoning and
  tool calls (id, function, arguments) equal. On-policy history is built from it.
- Verdicts: an answer `validate` keeps is one whose every call SGLang returns, with arguments a client can send back
  (a JSON object to orjson) and no call markup left in the content or reasoning; an answer it rejects for its tool
  calls is one SGLang loses or garbles. Rejections for other reasons (a runaway turn, reasoning that never ends, a call
  to an undeclared function) are the project's data rules, not SGLang's reading.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st

from regen.chat import ChatRenderer
from regen.on_policy import assistant_message, read_message
from tests.parity.answers import CALL, MARKERS, answer, qwen_answer
from tests.parity.judging import as_sglang_returns, loses_something, tally, verdict_of
from tests.parity.oracle import CASES, DIFFERENTIAL, Oracle


def sglang_message(case: dict[str, Any], output_ids: list[int], oracle: Oracle) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": case["messages"], "chat_template_kwargs": {"thinking": case["thinking"]}}
    if case["tools"]:
        body["tools"] = case["tools"]
    return oracle.ask({"kind": "answer", "request": body, "output_ids": output_ids})


def read_and_judge(
    case: dict[str, Any], output_ids: list[int], renderer: ChatRenderer, oracle: Oracle, seen: Counter[str]
) -> None:
    """One Kimi answer's ids: the project's reading is SGLang's message, and its verdict is held against what
    SGLang's reading loses (judging.tally)."""
    roles, tools, messages = renderer.roles, case["tools"], case["messages"]
    sglang = sglang_message(case, output_ids, oracle)
    text = renderer.decode(output_ids[:-1], not tools)
    ours = read_message(text, case["thinking"], renderer.profile, messages, tools)
    assert as_sglang_returns(ours) == {k: sglang[k] for k in ("content", "reasoning_content", "tool_calls")}
    lost = loses_something(case["text"], sglang, CALL, MARKERS, arguments_shown=True)
    tail = list(roles.generation_suffix)

    def reads_back() -> bool:
        again = assistant_message(output_ids, tail, roles, renderer.profile, renderer.decode, messages, tools)
        return again == ours

    tally(seen, verdict_of(output_ids, renderer, tools), lost, sglang, reads_back)


def test_answers_read_and_judged_as_sglang_reads_them(
    kimi_renderers: dict[bool, ChatRenderer], kimi_oracle: Oracle
) -> None:
    seen: Counter[str] = Counter()

    @DIFFERENTIAL
    @given(answer())
    def check(case: dict[str, Any]) -> None:
        renderer = kimi_renderers[case["thinking"]]
        output_ids = [*renderer.tokenizer.encode(case["text"]), min(renderer.roles.eos_ids)]
        read_and_judge(case, output_ids, renderer, kimi_oracle, seen)

    check()
    print(f"answer parity, kimi: {dict(sorted(seen.items()))}")
    assert seen["with calls"] + seen["without calls"] >= CASES
    assert seen["kept, flagged"] and seen["rejected for what SGLang loses"] and seen["with calls"]


# Call markup a client would see where a call was meant. A `</function>` that opens nothing is not one: SGLang keeps
# it as the text it is, and no call is lost (an answer that wrote `<function=` without a call is counted above).
XML_MARKERS = ("<tool_call>", "</tool_call>", "<function=", "<parameter=")
STRAY_CLOSER = {  # found by the property test: a stray closer in the reasoning, read by SGLang as it is
    "messages": [{"role": "user", "content": "the"}],
    "tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {}}}}],
    "thinking": True,
    "text": "</function>\n</think>\n\n",
}


def xml_loses_something(text: str, sglang: dict[str, Any]) -> bool:
    """A function or parameter the answer wrote that SGLang's message lacks (a parameter given twice keeps one
    value), or call markup left in the text a client sees."""
    calls = sglang["tool_calls"]
    keys = sum(len(orjson.loads(call["function"]["arguments"])) for call in calls)
    if text.count("<function=") != len(calls) or text.count("<parameter=") != keys:
        return True
    seen = (sglang["content"] or "") + (sglang["reasoning_content"] or "")
    return any(marker in seen for marker in XML_MARKERS)


def test_qwen_answers_read_as_sglang_reads_them(qwen_renderers: dict[bool, ChatRenderer], qwen_oracle: Oracle) -> None:
    """Qwen3.6 through the qwen3 reasoning parser and the qwen3_coder detector: the reading is SGLang's for every
    answer (values typed by the declared schema as the detector types them), and what validation keeps loses
    nothing. Validation is stricter than the detector for this grammar (stray text in a call, a parameter given
    twice, an unclosed call are rejected, where the detector reads what it can): the test holds it to no more."""
    seen: Counter[str] = Counter()

    @DIFFERENTIAL
    @given(qwen_answer())
    @example(STRAY_CLOSER)
    def check(case: dict[str, Any]) -> None:
        renderer = qwen_renderers[case["thinking"]]
        roles, tools = renderer.roles, case["tools"]
        output_ids = [*renderer.tokenizer.encode(case["text"], add_special_tokens=False), min(roles.eos_ids)]
        body: dict[str, Any] = {
            "messages": case["messages"],
            "chat_template_kwargs": renderer.profile.chat_template_kwargs,
        }
        if tools:
            body["tools"] = tools
        sglang = qwen_oracle.ask({"kind": "answer", "request": body, "output_ids": output_ids})
        text = renderer.decode(output_ids[:-1], not tools)
        ours = read_message(text, case["thinking"], renderer.profile, case["messages"], tools)
        theirs = {k: sglang[k] for k in ("content", "reasoning_content", "tool_calls")}
        mine = as_sglang_returns(ours)
        # SGLang gives qwen3_coder calls random ids (call_<hex>); the template does not print them.
        assert {**mine, "tool_calls": [c["function"] for c in mine["tool_calls"]]} == {
            **theirs,
            "tool_calls": [c["function"] for c in theirs["tool_calls"]],
        }
        verdict = verdict_of(output_ids, renderer, tools)
        if verdict.split == "train":
            assert not xml_loses_something(case["text"], sglang), f"kept, but SGLang's reading loses: {sglang}"
            seen["kept"] += 1
        else:
            seen[f"rejected: {verdict.verdict}"] += 1
        seen["with calls" if sglang["tool_calls"] else "without calls"] += 1

    check()
    print(f"answer parity, qwen: {dict(sorted(seen.items()))}")
    assert seen["with calls"] + seen["without calls"] >= CASES and seen["kept"] and seen["with calls"]


SPELT_CASES = 600  # the same drawn answers as above, the first 600: the suite's time is bounded (docs/benchmarks.md)


def spelt(text: str, markers: tuple[str, ...], encode: Any) -> list[int]:
    """`text`'s ids with every marker spelt in ordinary tokens (as a model may write it: its last character apart, so
    the tokenizer never matches the marker's special token); decoded, the same text."""
    ids: list[int] = []
    rest = text
    while rest:
        at = min(((rest.find(m), m) for m in markers if m in rest), default=(-1, ""))
        if at[0] < 0:
            return ids + encode(rest)
        position, marker = at
        ids += encode(rest[:position]) if position else []
        ids += encode(marker[:-1]) + encode(marker[-1:])
        rest = rest[position + len(marker) :]
    return ids


def test_answers_with_markers_spelt_in_ordinary_tokens_read_and_judged_as_sglang_reads_them(
    kimi_renderers: dict[bool, ChatRenderer], kimi_oracle: Oracle
) -> None:
    """SGLang reads a decoded answer's text, so a marker the model spelt with ordinary tokens is a marker to it: the
    project's reading and verdict must agree with that, not with the ids' specialness."""
    seen: Counter[str] = Counter()

    @settings(DIFFERENTIAL, max_examples=SPELT_CASES)
    @given(answer(), st.booleans())
    def check(case: dict[str, Any], reasoning_too: bool) -> None:
        renderer = kimi_renderers[case["thinking"]]
        markers = (*MARKERS, "</think>", "<think>") if reasoning_too else MARKERS
        output_ids = [*spelt(case["text"], markers, renderer.tokenizer.encode), min(renderer.roles.eos_ids)]
        assert renderer.decode(output_ids[:-1], False) == case["text"]
        read_and_judge(case, output_ids, renderer, kimi_oracle, seen)

    check()
    print(f"answer parity, kimi, markers spelt: {dict(sorted(seen.items()))}")
    assert seen["with calls"] + seen["without calls"] >= SPELT_CASES
    assert seen["kept"] and seen["with calls"] and seen["rejected: markup_as_text"]
