"""Datasets of every shape a real one has (DATASETS.md, "what goes wrong in the wild"), drawn by Hypothesis: system
prompts, assistant greetings that open a conversation, conversations that wait for the assistant, rows with no user
turn, exact duplicates, conversations that open alike, empty and long turns, unicode whitespace, tools in any order.
Every row's text names its dataset, so two datasets never share a sample."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

TURN_MODES = ("final", "every_assistant_turn", "on_policy")
OPENINGS = ((), ("system",), ("greeting",), ("system", "greeting"))
FUNCTIONS = ("get_weather", "convert_currency", "search_flights")
# Reference answers: short, empty, long, and two lengths a token apart (a length fit on them is near-collinear)
ANSWERS = ("Sure.", "", "An answer. " * 40, "word " * 200, "word " * 199)
NEAR_CONSTANT = ("word " * 200, "word " * 200, "word " * 200, "word " * 199, "Sure.")
# Capped: most references at one length (a dataset cut at its generator's max_new_tokens), one a token short, a few
# short ones (which a longest-first order leaves for last): the length fit sees one x and must not extrapolate wild.
CAPPED = ("word " * 200,) * 8 + ("word " * 199, "Sure.")
FILLERS = ("", " ", "\u3000", "\u00a0tab\tand\nnewline", "longer " * 300)  # empty, unicode space, long
KINDS = ("new", "new", "new", "new", "duplicate", "opens_alike", "no_user")
# Capped long: a dataset a thinking model answered whole, cut at its max_new_tokens (16,384), each reference counted
# in the target's tokens at the cap or a few tokens short ("x" is one token of the profile's tokenizer), a few short
# ones; one exchange a row, most rows new and answered. Longest first, a shard sends the capped ones first, and the
# length fit of its first answers (after 16, 32, 64) sees log(reference) spread by 1e-4 with the short ones pending:
# least squares put a slope of thousands on that spread and overflowed a float predicting them (OverflowError in the
# worker, its shard failed). A shard of 96 asked one or a few at a time does that again on the task's retry.
CAP = 16_384
CAPPED_LONG = (*("x" * (CAP - k) for k in range(6) for _ in range(2)), "Sure.")
# A style: its reference answers, its user turns' fillers, how many rows, exchanges a row, what kind each row is and
# whether a row waits for the assistant.
SHORT = {"fillers": FILLERS, "rows": (8, 40), "exchanges": (1, 4), "kinds": KINDS, "waits": st.booleans()}
STYLES = (
    {**SHORT, "answers": ANSWERS},
    {**SHORT, "answers": NEAR_CONSTANT},
    {**SHORT, "answers": CAPPED},
    {
        "answers": CAPPED_LONG,
        "fillers": FILLERS,
        "rows": (64, 112),
        "exchanges": (1, 1),
        "kinds": ("new",) * 9 + KINDS[-3:],
        "waits": st.sampled_from((True, *[False] * 7)),
    },
)


def function(name: str) -> dict[str, Any]:
    parameters = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    return {"type": "function", "function": {"name": name, "description": f"{name} for q", "parameters": parameters}}


@st.composite
def conversation(draw: st.DrawFn, label: str, style: dict[str, Any]) -> dict[str, Any]:
    """One row: an opening, one to four exchanges (the last maybe waiting for the answer), maybe tools. `style`: its
    dataset's opening (or None: each row its own), reference answers, fillers, exchanges and how often a row waits."""
    messages: list[dict[str, Any]] = []
    opening = style["opening"] if style["opening"] is not None else draw(st.sampled_from(OPENINGS))
    for part in opening:
        text = "Be brief." if part == "system" else "Hello! How can I help?"
        messages.append({"role": "system" if part == "system" else "assistant", "content": text})
    for turn in range(draw(st.integers(*style["exchanges"]))):
        words = draw(st.text(st.characters(codec="utf-8", categories=("L", "N", "Zs")), max_size=8))
        question = f"{label} turn {turn}: {words}"
        messages.append({"role": "user", "content": question + draw(st.sampled_from(style["fillers"]))})
        messages.append({"role": "assistant", "content": draw(st.sampled_from(style["answers"]))})
    if draw(style["waits"]):
        messages.pop()  # waits for the assistant: the row ends on a user turn
    tools = [function(name) for name in draw(st.permutations(FUNCTIONS))[: draw(st.integers(0, 2))]]
    return {"messages": messages, "tools": tools} if tools else {"messages": messages}


@st.composite
def dataset_rows(draw: st.DrawFn, name: str) -> list[dict[str, Any]]:
    """8 to 40 rows (64 to 112 of capped long answers), with duplicates, rows that open alike and rows with no user
    turn among them. Rows of a real dataset look alike: most datasets drawn here give every row one opening (one
    system prompt, one greeting), and some give near-constant or capped reference answers (a length fit on them is
    near-collinear)."""
    style = {"opening": draw(st.sampled_from((None, *OPENINGS))), **draw(st.sampled_from(STYLES))}
    rows: list[dict[str, Any]] = []
    for i in range(draw(st.integers(*style["rows"]))):
        kind = draw(st.sampled_from(style["kinds"]))
        if kind == "duplicate" and rows:
            rows.append(draw(st.sampled_from(rows)))
        elif kind == "opens_alike" and rows:
            earlier = draw(st.sampled_from(rows))
            user = next((j for j, m in enumerate(earlier["messages"]) if m["role"] == "user"), None)
            if user is None:
                continue
            rest = [{"role": "assistant", "content": f"{name} a different answer {i}"}]
            rows.append({**earlier, "messages": [*earlier["messages"][: user + 1], *rest]})
        elif kind == "no_user":
            rows.append({"messages": [{"role": "system", "content": f"{name} nothing to answer {i}"}]})
        else:
            rows.append(draw(conversation(f"{name} row {i}", style)))
    return rows


@st.composite
def dataset(draw: st.DrawFn, name: str) -> dict[str, Any]:
    """A dataset entry of the config (with its rows under `rows`, written to a file by the test)."""
    entry: dict[str, Any] = {"format": "openai_messages", "turns": draw(st.sampled_from(TURN_MODES))}
    if draw(st.integers(0, 3)) == 0:
        entry["temperatures"] = [0.3, 1.0]
    return {**entry, "rows": draw(dataset_rows(name))}
