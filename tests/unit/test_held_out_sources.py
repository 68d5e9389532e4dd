"""The held-out split's key against every conversation shape prepare keeps: every prompt cut from one source shares
it, in every turn mode, and sources that differ in what their user asks first do not (docs/data.md, the held-out
split). Generated conversations, not the shapes the code's author thought of."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from regen import holdout
from regen.holdout import held_out, source_key
from regen.stages.prepare.normalize import Conversation, Rejection, select_prompts

TURN_MODES = ("final", "every_assistant_turn", "on_policy")

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
message = st.builds(
    lambda role, content: {"role": role, "content": content},
    st.sampled_from(["system", "user", "assistant", "tool"]),
    text,
)


def keys(messages: list[dict[str, Any]], tools: list[dict[str, Any]], turns: str) -> set[str]:
    prompts = select_prompts(Conversation(messages, tools), turns)  # type: ignore[arg-type]
    return set() if isinstance(prompts, Rejection) else {source_key(p.messages, p.tools) for p in prompts}


@settings(max_examples=300, deadline=None)
@given(st.lists(message, min_size=1, max_size=10), st.lists(st.fixed_dictionaries({"name": text}), max_size=2))
def test_every_prompt_cut_from_one_conversation_has_its_key_in_every_turn_mode(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> None:
    by_mode = [keys(messages, tools, turns) for turns in TURN_MODES]
    found = set().union(*by_mode)
    assert len(found) <= 1, messages  # one source, one side: every cut, every mode
    assert all(k == found for k in by_mode if k), messages


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(["system", "assistant"]), max_size=3),
    st.lists(text, min_size=2, max_size=2, unique=True),
    st.sampled_from(TURN_MODES),
)
def test_sources_that_ask_different_first_questions_have_different_keys(
    before: list[str], questions: list[str], turns: str
) -> None:
    """Whatever opens the conversation (a system prompt, an assistant's greeting, both), the first question is in
    the key: a greeting-first dataset must not collapse onto one key."""
    opening = [{"role": role, "content": f"{role} opens"} for role in before]
    one, other = (
        keys([*opening, {"role": "user", "content": q}, {"role": "assistant", "content": "answer"}], [], turns)
        for q in questions
    )
    assert one and other and one != other


def test_a_dataset_of_greeting_first_conversations_is_split_near_its_share() -> None:
    """The reproduction: 1,000 distinct sources opening with an assistant greeting once had one key between them,
    so at 0.02 all were train and at any share from 0.095 all were validation."""
    greeting = {"role": "assistant", "content": "Hello! How can I help?"}
    system = {"role": "system", "content": "You are helpful."}
    for opening in ([greeting], [system, greeting]):
        for turns in TURN_MODES:
            conversations = [
                [*opening, {"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": "ok"}]
                for i in range(1000)
            ]
            found = [k for c in conversations for k in keys(c, [], turns)]
            assert len(set(found)) == 1000, (opening, turns)
            held = sum(held_out(k, 0.3) for k in found)
            assert 230 < held < 370, (opening, turns, held)  # binomial(1000, 0.3): 300 +- 5 sd


def test_the_opening_keeps_every_message_before_the_first_answer_to_a_user() -> None:
    two_asks = [
        {"role": "user", "content": "a"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "x"},
    ]
    assert holdout.opening(two_asks) == two_asks[:2]
    tool_first = [{"role": "user", "content": "a"}, {"role": "tool", "content": "{}"}, {"role": "assistant"}]
    assert holdout.opening(tool_first) == tool_first[:2]


def test_a_digest_at_exactly_the_share_is_train() -> None:
    """Held out below the share, read as a fraction of 2^64: a key of exactly 2^63 is not below 0.5."""
    assert held_out("8" + "0" * 63, 0.5) is False
    assert held_out("7" + "f" * 63, 0.5) is True
    assert held_out("0" * 64, 0.0) is False
