"""Checks of on-policy conversations shared by the unit and end-to-end tests, written apart from regen.on_policy: what
an answer must leave in every later prompt of its conversation is found here from the answer's decoded text, by the
rules of Kimi-K2.5's template (shared docs KIMI_K25.md), not by the pipeline's own reading of it."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
THINK_END = "</think>"
OFF_POLICY = "off-policy"  # in every answer the sample datasets recorded (tools/make_samples.py)


def contains(haystack: list[int], needle: list[int]) -> bool:
    """`needle` appears in `haystack` as a contiguous run of ids."""
    return f",{','.join(map(str, needle))}," in f",{','.join(map(str, haystack))},"


def left_in_history(output_ids: list[int], tokenizer: Any) -> list[list[int]]:
    """The ids an answer must leave in every later prompt: its answer text (after `</think>`, before any tool-call
    section) and its tool-call section, each encoded from the text the model wrote. Its reasoning is left out: the
    template drops it from history, and shows it only while the turn's tool calls are being answered."""
    text = tokenizer.decode(output_ids[:-1], skip_special_tokens=False)  # the EOS ends the turn
    answer = text.split(THINK_END, 1)[1] if THINK_END in text else text[text.find(SECTION_BEGIN) :]
    content, _, calls = answer.partition(SECTION_BEGIN)
    parts = [content] if content else []
    if calls:
        parts.append(SECTION_BEGIN + calls.split(SECTION_END, 1)[0] + SECTION_END)
    return [list(tokenizer.encode(part, add_special_tokens=False)) for part in parts]


def by_conversation(answer_ids: list[str]) -> dict[str, dict[int, str]]:
    """conversation sample id -> turn number -> answer id."""
    turns: dict[str, dict[int, str]] = defaultdict(dict)
    for answer_id in answer_ids:
        sample, _, turn = answer_id.rpartition("/turn-")
        turns[sample][int(turn)] = answer_id
    return turns


def check_histories(sent: dict[str, dict[str, Any]], tokenizer: Any) -> int:
    """For every turn k > 1 of every conversation: the prompt the server received contains what each regenerated
    answer of turns < k left in history, and nothing the dataset recorded for them. `sent`: answer id -> the
    server's record of its request (input_ids, output_ids). Returns how many (turn, earlier turn) pairs it checked."""
    checked = 0
    for turns in by_conversation(list(sent)).values():
        for k, answer_id in turns.items():
            prompt = sent[answer_id]["input_ids"]
            assert OFF_POLICY not in tokenizer.decode(prompt), f"{answer_id}: the dataset's own answer in its prompt"
            for j in range(1, k):
                assert j in turns, f"{answer_id} was generated, but turn {j} of its conversation never was"
                for part in left_in_history(sent[turns[j]]["output_ids"], tokenizer):
                    assert contains(prompt, part), f"{answer_id}: turn {j}'s answer is not in its prompt"
                checked += 1
    return checked
