"""Eval-set decontamination: does a prompt hold an item of a benchmark the drafter will be judged on?

Text is normalized to words (NFKC, case folded, everything that is not a letter or digit a separator, so markdown,
punctuation and whitespace do not count) and compared by hashed word n-grams, as GPT-3's contamination study did
(13-grams). An item is found in a prompt when at least `threshold` of the item's distinct n-grams are in it: exact,
reformatted and embedded copies all score 1.0 however long the prompt around them, while a prompt that shares one
common phrase with an item, or speaks of its topic in other words, scores near 0. An item shorter than n words has no
n-gram: it is found only whole, its words in order. Items shorter than `min_item_words` are too generic to judge by
and are left out (counted).

Pure: the index is built once per prepare from the suites (regen.stages.prepare.eval_suites) and holds only their
n-grams, so memory depends on the suites, never on the dataset. Hashes are Python's, salted per process: an index
is built and used in one process.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, get_args

from regen.config.datasets import MessageRole
from regen.reasons import Reason
from regen.stages.prepare.normalize import Conversation, Rejection

WORD = re.compile(r"[^\W_]+")  # letters and digits: `_`, markdown and punctuation separate words
# Every text a prompt renders is read: an eval item pasted into a tool result, a tool's description or an earlier
# assistant turn reaches the model as surely as one in a user turn. The roles are configurable (`roles`).
ALL_ROLES: tuple[str, ...] = get_args(MessageRole)
NOT_TEXT = frozenset({"role", "type", "id", "tool_call_id"})  # a message's keys that hold markup, not text


def words(text: str) -> tuple[str, ...]:
    if text.isascii():  # most prompts: NFKC changes nothing, and casefold is lower
        return tuple(WORD.findall(text.lower()))
    return tuple(WORD.findall(unicodedata.normalize("NFKC", text).casefold()))


def _gram_hashes(tokens: tuple[str, ...], n: int) -> list[int]:
    return [hash(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def prompt_text(
    messages: Iterable[dict[str, Any]], tools: Iterable[dict[str, Any]] = (), roles: Iterable[str] = ALL_ROLES
) -> str:
    """What a prompt shows the model, as decontamination reads it: every text of its messages of `roles` (content,
    content parts, reasoning, tool calls' names and arguments) and of its tool declarations (names, descriptions,
    parameters)."""
    wanted = set(roles)
    texts = [text for message in messages if message.get("role") in wanted for text in _texts(message)]
    texts += [text for tool in tools for text in _texts(tool)]
    return "\n".join(texts)


def _texts(value: Any) -> list[str]:
    """Every string in a message or a declaration, in order, but the values of markup keys (NOT_TEXT)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for key, item in value.items() if key not in NOT_TEXT for text in _texts(item)]
    if isinstance(value, list):
        return [text for item in value for text in _texts(item)]
    return []


@dataclass(frozen=True)
class Overlap:
    """An eval item found in a prompt: `found` of the item's `of` distinct n-grams, or (`whole`) a short item."""

    suite: str
    item: str
    found: int
    of: int
    whole: bool = False

    @property
    def fraction(self) -> float:
        return self.found / self.of

    def rejection(self, ngram: int) -> EvalOverlap:
        detail = (
            f"eval item {self.item!r} of suite {self.suite!r}: {self.fraction:.0%} of it in the prompt "
            f"({self.found} of its {self.of} {ngram}-word n-grams)"
            if not self.whole
            else f"eval item {self.item!r} of suite {self.suite!r}: in the prompt whole (shorter than {ngram} words)"
        )
        return EvalOverlap(Reason.EVAL_OVERLAP, detail, self.suite, self.item)


@dataclass(frozen=True)
class EvalOverlap(Rejection):
    """A prompt rejected for an eval item in it: which suite, which item (the dataset report counts suites)."""

    suite: str = ""
    item: str = ""


@dataclass(frozen=True)
class _Short:
    length: int
    whole: int  # the hash of all the item's words
    item: int


class OverlapIndex:
    """The suites' items by their n-grams: `add` each item, then `check` prompts."""

    def __init__(
        self, ngram: int = 13, threshold: float = 0.5, min_item_words: int = 4, roles: Iterable[str] = ALL_ROLES
    ) -> None:
        self.ngram, self.threshold, self.min_item_words = ngram, threshold, min_item_words
        self.roles = tuple(roles)  # the messages read (prompt_text)
        self.items: list[tuple[str, str]] = []  # (suite, item id)
        self._sizes: list[int] = []  # distinct n-grams per item
        self._grams: dict[int, int] = {}  # n-gram -> the first item holding it
        self._shared: dict[int, tuple[int, ...]] = {}  # n-gram -> every item holding it, when more than one
        self._heads: dict[int, list[_Short]] = {}  # a short item's first min_item_words words -> the item

    def add(self, suite: str, item_id: str, text: str) -> bool:
        """The item indexed; False (left out) when it has fewer than `min_item_words` words."""
        tokens = words(text)
        if len(tokens) < self.min_item_words:
            return False
        number = len(self.items)
        self.items.append((suite, item_id))
        if len(tokens) < self.ngram:
            head = hash(tokens[: self.min_item_words])
            self._heads.setdefault(head, []).append(_Short(len(tokens), hash(tokens), number))
            self._sizes.append(1)
            return True
        grams = set(_gram_hashes(tokens, self.ngram))
        self._sizes.append(len(grams))
        for gram in grams:
            first = self._grams.setdefault(gram, number)
            if first != number:
                self._shared[gram] = (*self._shared.get(gram, (first,)), number)
        return True

    def check(self, text: str) -> Overlap | None:
        """The item most present in the text, if any is present past the threshold (or whole, a short item)."""
        tokens = words(text)
        return self._long(tokens) or self._short(tokens)

    def _long(self, tokens: tuple[str, ...]) -> Overlap | None:
        grams = self._grams
        hits = {gram for gram in _gram_hashes(tokens, self.ngram) if gram in grams}
        if not hits:
            return None
        counts: Counter[int] = Counter()
        for gram in hits:
            counts.update(self._shared.get(gram, (grams[gram],)))
        item, found = max(counts.items(), key=lambda pair: (pair[1] / self._sizes[pair[0]], -pair[0]))
        if found / self._sizes[item] < self.threshold:
            return None
        return Overlap(*self.items[item], found=found, of=self._sizes[item])

    def _short(self, tokens: tuple[str, ...]) -> Overlap | None:
        if not self._heads:
            return None
        heads, k = self._heads, self.min_item_words
        for start in (i for i, head in enumerate(_gram_hashes(tokens, k)) if head in heads):
            for short in heads[hash(tokens[start : start + k])]:
                if hash(tokens[start : start + short.length]) == short.whole:
                    return Overlap(*self.items[short.item], found=1, of=1, whole=True)
        return None


def sent_later(prompt: Conversation) -> list[dict[str, Any]]:
    """An on-policy conversation's later messages that its later prompts send: all but the recorded answers, which
    the model's own answers replace."""
    return [m for m in prompt.later if m.get("role") != "assistant"]


def check_prompts(index: OverlapIndex, prompts: list[Conversation]) -> list[EvalOverlap | None]:
    """Each prompt of a row checked: its turns and, on-policy, the later turns it will send. A row's prompts are
    prefixes of its last, so when the last is clean (the common case), so is every other, unchecked."""
    texts = [prompt_text([*p.messages, *sent_later(p)], p.tools, index.roles) for p in prompts]
    last = index.check(texts[-1]) if texts else None
    if last is None:
        return [None] * len(prompts)
    found = [index.check(text) for text in texts[:-1]] + [last]
    return [overlap.rejection(index.ngram) if overlap is not None else None for overlap in found]
