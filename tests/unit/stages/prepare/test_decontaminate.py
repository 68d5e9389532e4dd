"""Decontamination's core: which prompts hold an eval item, by hashed word n-grams over normalized text."""

from __future__ import annotations

from typing import Any

import pytest

from regen.reasons import Reason
from regen.stages.prepare.decontaminate import OverlapIndex, check_prompts, prompt_text, words
from regen.stages.prepare.normalize import Conversation

GSM8K = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?"
)
HUMANEVAL = (
    'def has_close_elements(numbers: List[float], threshold: float) -> bool:\n    """ Check if in given list of '
    "numbers, are any two numbers closer to each other than\n    given threshold.\n    >>> has_close_elements([1.0, "
    '2.0, 3.0], 0.5)\n    False\n    """\n'
)
ALPACA_SHORT = "Give three tips for staying healthy."  # 6 words: shorter than an n-gram, matched whole


@pytest.fixture(scope="module")
def index() -> OverlapIndex:
    index = OverlapIndex(ngram=13, threshold=0.5, min_item_words=4)
    assert index.add("gsm8k", "train/0", GSM8K)
    assert index.add("humaneval", "HumanEval/0", HUMANEVAL)
    assert index.add("alpaca", "#1", ALPACA_SHORT)
    assert not index.add("alpaca", "#2", "Hello there.")  # under min_item_words: too generic, left out
    return index


def test_words_ignore_case_whitespace_punctuation_and_markdown() -> None:
    assert words("**How many** clips,\n\n  did _Natalia_ `sell`?") == ("how", "many", "clips", "did", "natalia", "sell")
    assert words("ＡＢＣ has_close") == ("abc", "has", "close")  # NFKC: full-width letters are letters


@pytest.mark.parametrize(
    ("prompt", "suite", "item"),
    [
        pytest.param(GSM8K, "gsm8k", "train/0", id="exact"),
        pytest.param(GSM8K.upper(), "gsm8k", "train/0", id="upper-case"),
        pytest.param("  ".join(GSM8K.split()).replace(". ", ".\n\n"), "gsm8k", "train/0", id="whitespace"),
        pytest.param("## Problem\n\n**" + GSM8K.replace("48", "`48`") + "**", "gsm8k", "train/0", id="markdown"),
        pytest.param(GSM8K.replace(",", "").replace("?", " ?"), "gsm8k", "train/0", id="punctuation"),
        pytest.param(
            "I'm revising for an exam and my teacher gave us this one, could you walk me through it step by step "
            f"and explain your reasoning at every stage? {GSM8K} Please also give a short summary at the end.",
            "gsm8k",
            "train/0",
            id="embedded",
        ),
        pytest.param(f"Complete this function:\n```python\n{HUMANEVAL}```", "humaneval", "HumanEval/0", id="code"),
        pytest.param(HUMANEVAL.replace("    ", "\t"), "humaneval", "HumanEval/0", id="tabs"),
        pytest.param("GIVE three tips for *staying* healthy!", "alpaca", "#1", id="short-whole"),
        pytest.param("Please give three tips for staying healthy at work.", "alpaca", "#1", id="short-embedded"),
    ],
)
def test_copies_are_found(index: OverlapIndex, prompt: str, suite: str, item: str) -> None:
    overlap = index.check(prompt)
    assert overlap is not None and (overlap.suite, overlap.item) == (suite, item)


def test_an_exact_copy_is_found_whole(index: OverlapIndex) -> None:
    overlap = index.check(GSM8K)
    assert overlap is not None and overlap.found == overlap.of == len(words(GSM8K)) - 12
    rejection = overlap.rejection(13)
    assert rejection.reason == Reason.EVAL_OVERLAP and (rejection.suite, rejection.item) == ("gsm8k", "train/0")
    assert "'train/0'" in rejection.detail and "'gsm8k'" in rejection.detail and "100%" in rejection.detail


@pytest.mark.parametrize(
    "prompt",
    [
        pytest.param(
            "My friend sold clips to 48 of her friends in April, and then she sold half as many clips in May. I "
            "wonder what her margins were, and whether selling hair accessories at school is even allowed.",
            id="one-shared-sentence",  # 7 of the item's 19 n-grams: under half
        ),
        pytest.param(
            "A girl sells 48 hair clips in the spring and half that number a month later: what is the total?",
            id="same-problem-other-words",
        ),
        pytest.param(
            "Write a Python function that checks whether any two numbers in a list are closer than a threshold.",
            id="same-task-other-words",
        ),
        pytest.param("Give three tips for staying", id="short-item-cut"),
        pytest.param("Give me three tips for staying healthy.", id="short-item-another-word"),
        pytest.param("Hello there. How are you?", id="left-out-item"),
        pytest.param("", id="empty"),
    ],
)
def test_near_misses_are_kept(index: OverlapIndex, prompt: str) -> None:
    assert index.check(prompt) is None


def test_the_threshold_is_the_share_of_the_items_ngrams() -> None:
    half = " ".join(words(GSM8K)[:24])  # 12 of the item's 19 n-grams
    strict, lenient = OverlapIndex(threshold=0.9), OverlapIndex(threshold=0.5)
    for index in (strict, lenient):
        index.add("gsm8k", "0", GSM8K)
    assert strict.check(half) is None
    overlap = lenient.check(half)
    assert overlap is not None and (overlap.found, overlap.of) == (12, 19)


def test_an_ngram_two_items_share_counts_for_both() -> None:
    index = OverlapIndex()
    index.add("a", "1", GSM8K)
    index.add("b", "2", GSM8K + " Answer in words.")
    overlap = index.check(GSM8K)
    assert overlap is not None and (overlap.suite, overlap.fraction) == ("a", 1.0)


def test_every_text_a_prompt_shows_is_checked_and_the_roles_are_configurable() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]},
        {"role": "assistant", "content": "Earlier answer.", "tool_calls": [_call('{"q": "call args"}')]},
        {"role": "tool", "content": "Tool result.", "tool_call_id": "call_0"},
        {"role": "developer", "content": "Mind the units."},
    ]
    tools = [{"type": "function", "function": {"name": "lookup", "description": "Finds a fact."}}]
    assert prompt_text(messages, tools) == (
        'Be brief.\npart one\npart two\nEarlier answer.\nlookup\n{"q": "call args"}\nTool result.\nMind the units.'
        "\nlookup\nFinds a fact."
    )
    assert prompt_text(messages, roles=["system", "user"]) == "Be brief.\npart one\npart two"


def _call(arguments: str) -> dict[str, object]:
    return {"id": "call_0", "type": "function", "function": {"name": "lookup", "arguments": arguments}}


@pytest.mark.parametrize(
    "where",
    [
        pytest.param(lambda item: ([{"role": "tool", "content": item, "tool_call_id": "c"}], []), id="tool-result"),
        pytest.param(
            lambda item: ([], [{"type": "function", "function": {"description": item}}]), id="tool-description"
        ),
        pytest.param(lambda item: ([{"role": "assistant", "content": item}], []), id="earlier-assistant-turn"),
        pytest.param(lambda item: ([{"role": "assistant", "tool_calls": [_call(item)]}], []), id="call-arguments"),
    ],
)
def test_an_item_pasted_anywhere_the_prompt_shows_is_found(index: OverlapIndex, where: Any) -> None:
    extra, tools = where(GSM8K)
    messages = [{"role": "user", "content": "Please help."}, *extra, {"role": "user", "content": "Thanks."}]
    [found] = check_prompts(index, [Conversation(messages, tools)])
    assert found is not None and found.suite == "gsm8k"


def test_an_on_policy_rows_recorded_answers_are_not_what_it_sends(index: OverlapIndex) -> None:
    """Its later recorded answers are replaced by the model's own: only its later user turns and tool results count."""
    first = [{"role": "user", "content": "Hi, can you help with maths?"}]
    later = [{"role": "assistant", "content": GSM8K}, {"role": "user", "content": "Thanks."}]
    assert check_prompts(index, [Conversation(first, [], later=later)]) == [None]


def test_only_the_prompts_of_a_row_that_hold_the_item_are_rejected(index: OverlapIndex) -> None:
    first = [{"role": "user", "content": "Hi, can you help with maths?"}]
    second = [*first, {"role": "assistant", "content": "Sure."}, {"role": "user", "content": GSM8K}]
    overlaps = check_prompts(index, [Conversation(first, []), Conversation(second, [])])
    assert overlaps[0] is None and overlaps[1] is not None and overlaps[1].item == "train/0"
    later = [{"role": "assistant", "content": "Sure."}, {"role": "user", "content": GSM8K}]
    (on_policy,) = check_prompts(index, [Conversation(first, [], later=later)])  # its later turns are sent too
    assert on_policy is not None and on_policy.suite == "gsm8k"
    assert check_prompts(index, [Conversation(first, [])]) == [None]
