"""What every answer-parity test shares: an answer judged as validate judges it, and its verdict held against
SGLang's reading of the same ids (kept only when SGLang's reading loses nothing; rejected for its calls only when it
does)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from regen.chat import ChatRenderer
from regen.judge import Judgement, judge_output
from regen.reasons import Reason

READING = frozenset(  # the tool-call reasons validate gives for what SGLang's reading loses
    {
        Reason.TOOL_CALL_UNBALANCED,
        Reason.TOOL_CALL_BAD_ID,
        Reason.TOOL_CALL_BAD_ARGUMENTS,
        Reason.TOOL_CALL_IN_REASONING,
    }
)


def as_sglang_returns(message: dict[str, Any]) -> dict[str, Any]:
    calls = [{"id": c["id"], "function": c["function"]} for c in message.get("tool_calls") or []]
    return {"content": message["content"], "reasoning_content": message.get("reasoning_content"), "tool_calls": calls}


def verdict_of(output_ids: list[int], renderer: ChatRenderer, tools: list[dict[str, Any]]) -> Judgement:
    """The verdict validate gives an answer to a prompt that ends with the profile's generation suffix."""
    roles = renderer.roles
    names = frozenset(t["function"]["name"] for t in tools) or None
    after_suffix = roles.phase_after(list(roles.generation_suffix))
    return judge_output(output_ids, roles, names, lambda ids: renderer.decode(ids, False), after_suffix, lambda: tools)


def loses_something(
    text: str, sglang: dict[str, Any], call_marker: str, markers: Iterable[str], arguments_shown: bool
) -> bool:
    """SGLang's message drops a call the answer wrote (one `call_marker` a call), holds arguments the next request
    cannot carry, or leaves call markup in the text a client sees (the arguments too, where the model's template
    renders markup in them as marker tokens)."""
    calls = sglang["tool_calls"]
    if text.count(call_marker) != len(calls):
        return True
    for call in calls:
        try:
            if not isinstance(orjson.loads(call["function"]["arguments"]), dict):
                return True
        except orjson.JSONDecodeError:
            return True
    seen = (sglang["content"] or "") + (sglang["reasoning_content"] or "")
    if arguments_shown:
        seen += "".join(call["function"]["arguments"] for call in calls)
    return any(marker in seen for marker in markers)


def tally(
    seen: Counter[str], verdict: Judgement, lost: bool, sglang: dict[str, Any], reads_back: Callable[[], bool]
) -> None:
    """Hold the verdict against SGLang's reading and count it. A kept answer must also read back as the same
    assistant message from its ids alone (`reads_back`), as on-policy history is built."""
    if verdict.split == "train":
        assert not lost, f"kept ({verdict.flags}), but SGLang's reading loses something: {sglang}"
        assert reads_back(), "kept, but its assistant message read from the ids differs"
        seen["kept, flagged" if verdict.flags else "kept"] += 1
    elif verdict.verdict in READING:
        assert lost, f"rejected ({verdict.verdict}: {verdict.detail}), but SGLang reads every call: {sglang}"
        seen["rejected for what SGLang loses"] += 1
    else:
        seen[f"rejected: {verdict.verdict}"] += 1
    seen["with calls" if sglang["tool_calls"] else "without calls"] += 1
