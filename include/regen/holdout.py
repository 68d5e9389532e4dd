"""Which prompts are held out for validation: a pure function of the source prompt, never of the run.

A prompt's side is decided by a digest of its opening, the messages before the first assistant turn that answers a
user (an assistant greeting that opens a conversation is part of its opening) and its tools: what every row cut from
one source conversation shares (each of its `every_assistant_turn` prompts, each turn of an
on-policy conversation) and every sample of one prompt at every temperature. No run, version, shard or sample
enters it, so the same prompts are held out in every version and every nightly, and a prompt validated on is never
trained on later. The digest is read as a number in [0, 1): a prompt is held out when it falls below the share, so
raising the share only moves prompts from train to validation, never back.

Two conversations that open alike fall on one side together (a stricter split than by row, never a leak).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import msgspec

from regen.chat import canonical_json
from regen.samples import sample_of

if TYPE_CHECKING:
    from regen.records import ShardPrompts

SIDES = ("train", "validation")


def opening(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages before the first assistant turn after a user turn: what every prompt cut from one conversation
    starts with (prepare cuts prompts only after a user turn). Assistant turns before any user's, a greeting, belong
    to it: cut there, every conversation that opens with one would share one key (the whole dataset on one side)."""
    asked = False
    for position, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant" and asked:
            return messages[:position]
        asked = asked or role == "user"
    return messages


def source_key(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """The source prompt's digest (hex): its opening and its tools, canonically spelt."""
    content = {"opening": opening(messages), "tools": tools or []}
    return hashlib.sha256(canonical_json(content).encode("utf-8")).hexdigest()


def held_out(key: str, share: float) -> bool:
    """Whether a source prompt goes to validation at `share`: its digest's first 64 bits, read as a fraction of
    2^64, below the share."""
    return int(key[:16], 16) < share * 2**64


def side_of(prompts: ShardPrompts, sample_id: str, share: float) -> str:
    """`train` or `validation` for a sample of a shard's prompts: by the source key prepare recorded, or for prompts
    prepared before it did, from the messages and tools (read with them)."""
    if share <= 0:
        return "train"
    key = prompts.source_key(sample_id)
    if key is None:
        tools = prompts.tools_json(sample_id)
        key = source_key(_decode(prompts.messages_json(sample_id)), _decode(tools) if tools else None)
    return SIDES[held_out(key, share)]


class Sides:
    """Each answer's side in a shard, from its sample's source prompt: decided once per sample (an on-policy
    conversation's turns and a prompt's samples share it)."""

    def __init__(self, prompts: ShardPrompts, share: float) -> None:
        self.prompts, self.share, self.known = prompts, share, dict[str, str]()

    def __call__(self, answer_id: str) -> str:
        sample = sample_of(answer_id)
        if sample not in self.known:
            self.known[sample] = side_of(self.prompts, sample, self.share)
        return self.known[sample]


_decode = msgspec.json.Decoder().decode  # several times json.loads' speed on a long conversation
