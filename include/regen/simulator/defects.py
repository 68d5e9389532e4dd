"""Output defects the simulator plants: at most one per answer, each a corruption that validation must catch.

Declared once, in DEFECTS: the CLI's `--defect-<kind>-rate` flags, the model that plants them, `/sim/stats`, the
`--record` file and the tests all read it. Each kind names the Reason the pipeline reports for it, so a test can check
that exactly the planted answers were dropped, each for its own reason.

A defect is drawn from its own random stream, seeded from the prompt and seed like the answer itself: the same prompt
and seed always carry the same defect (a retried request does not shake it off), and an answer with no defect is the
same answer as with defects turned off.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from regen.chat import TokenRoles
from regen.profiles import FORMATS
from regen.reasons import Reason

OUT_OF_VOCAB_ID = 2**31 + 1  # past any vocabulary, and past int32: a reader that narrows ids wraps it negative


@dataclass(frozen=True)
class DefectKind:
    name: str
    reason: Reason  # what the pipeline reports for an answer carrying it
    help: str
    answer: Literal["any", "prose", "tool_call"] = "any"  # the answer shape it needs, forced when drawn
    tools: bool | None = None  # True: only prompts that declare tools; False: only prompts that declare none
    thinking: bool = False  # only prompts that open reasoning
    needs: tuple[str, ...] = ()  # TokenRoles fields the profile must resolve
    in_response: bool = False  # planted by the server in meta_info/text, not by the model in the ids
    formats: tuple[str, ...] = FORMATS  # tool-call grammars it can be written in (tool kinds only)

    @property
    def flag(self) -> str:
        return f"--defect-{self.name.replace('_', '-')}-rate"


def _tool_kind(
    name: str, reason: Reason, help: str, tools: bool = True, formats: tuple[str, ...] = FORMATS
) -> DefectKind:
    """A defect of a tool call: the answer is forced to be one, in the profile's tool-call grammar."""
    return DefectKind(name, reason, help, answer="tool_call", tools=tools, needs=("tool_calls",), formats=formats)


DEFECTS: tuple[DefectKind, ...] = (
    DefectKind(
        "reasoning_start_in_output",
        Reason.REASONING_START_IN_OUTPUT,
        "a reasoning-start token inside the reasoning (or the answer when reasoning is off)",
        answer="prose",
        needs=("reasoning_start",),
    ),
    DefectKind(
        "runaway_turn",
        Reason.ROLE_TOKEN_IN_OUTPUT,
        "the answer runs into a user turn (turn markers and prose) before its EOS",
        needs=("role_ids",),
    ),
    DefectKind(
        "eos_in_middle", Reason.EOS_NOT_AT_END, "an EOS id inside the output, another at its end", answer="prose"
    ),
    DefectKind(
        "no_eos_at_end",
        Reason.NO_EOS_AT_END,
        "finish_reason stop on an EOS that output_ids lacks",
        in_response=True,
    ),
    DefectKind(
        "reasoning_end_repeated",
        Reason.REASONING_END_REPEATED,
        "a second reasoning-end token, in the answer",
        answer="prose",
        thinking=True,
        needs=("reasoning_end",),
    ),
    DefectKind(
        "reasoning_end_missing",
        Reason.REASONING_END_MISSING,
        "a prose answer whose reasoning never ends",
        answer="prose",
        thinking=True,
        needs=("reasoning_end",),
    ),
    _tool_kind(
        "tool_section_unclosed", Reason.TOOL_CALL_UNBALANCED, "a tool call with no end token, its section unclosed"
    ),
    _tool_kind(
        "tool_call_bad_id", Reason.TOOL_CALL_BAD_ID, "a call id outside the profile's id format", formats=("sections",)
    ),
    _tool_kind(
        "tool_call_malformed",
        Reason.TOOL_CALL_MALFORMED,
        "a tagged call that names no function",
        formats=("tagged_json", "tagged_xml"),
    ),
    _tool_kind(
        "tool_call_bad_arguments",
        Reason.TOOL_CALL_BAD_ARGUMENTS,
        "call arguments that are not a JSON object (tagged XML: a parameter given twice)",
    ),
    _tool_kind("tool_call_undeclared", Reason.TOOL_CALL_UNDECLARED, "a call to a function never declared"),
    _tool_kind(
        "tool_call_without_tools",
        Reason.TOOL_CALL_WITHOUT_TOOLS,
        "a well-formed call in answer to a prompt that declares no tools",
        tools=False,
    ),
    DefectKind("id_out_of_vocab", Reason.ID_OUT_OF_VOCAB, f"an output id of {OUT_OF_VOCAB_ID}", answer="prose"),
    DefectKind(
        "count_mismatch", Reason.COUNT_MISMATCH, "completion_tokens off by one from len(output_ids)", in_response=True
    ),
    DefectKind(
        "prompt_tokens_mismatch",
        Reason.PROMPT_TOKENS_MISMATCH,
        "prompt_tokens off by one, or missing",
        in_response=True,
    ),
    DefectKind("text_mismatch", Reason.TEXT_MISMATCH, "text with one word changed", in_response=True),
)
DEFECT_KINDS: tuple[str, ...] = tuple(kind.name for kind in DEFECTS)
BY_NAME: dict[str, DefectKind] = {kind.name: kind for kind in DEFECTS}


@dataclass(frozen=True)
class DefectModel:
    rates: Mapping[str, float] = field(default_factory=dict)  # kind -> probability per answer
    # The server decodes `text` as if with another tokenizer: every answer disagrees with its ids, probes included.
    text_tokenizer_mismatch: bool = False

    def __post_init__(self) -> None:
        unknown = sorted(set(self.rates) - set(DEFECT_KINDS))
        if unknown:
            raise ValueError(f"unknown defect kinds {unknown}; known: {', '.join(DEFECT_KINDS)}")
        rates = list(self.rates.values())
        if any(r < 0 for r in rates) or sum(rates) > 1 + 1e-9:  # a spread --defect-rate 1 sums to 1 +- rounding
            raise ValueError(f"defect rates must be >= 0 and sum to at most 1, got {dict(self.rates)}")

    @classmethod
    def spread(
        cls,
        rates: Mapping[str, float | None],
        total: float,
        text_tokenizer_mismatch: bool,
        roles: TokenRoles | None = None,
    ) -> DefectModel:
        """Kinds given a rate keep it; `total` is shared evenly by the kinds given none (`--defect-rate`) that the
        profile with these roles can carry (all kinds when no roles are given)."""
        plantable = [kind for kind in DEFECTS if roles is None or not _missing(kind, roles)]
        unset = [kind.name for kind in plantable if rates.get(kind.name) is None]
        share = total / len(unset) if unset else 0.0
        merged = {kind: float(rates[kind] or 0.0) for kind in DEFECT_KINDS if rates.get(kind) is not None}
        merged |= {kind: share for kind in unset}
        return cls({kind: rate for kind, rate in merged.items() if rate}, text_tokenizer_mismatch)

    def draw(self, rng: random.Random) -> str | None:
        x = rng.random()  # always one draw, so what follows in the stream does not depend on the rates
        for kind in DEFECT_KINDS:
            rate = self.rates.get(kind, 0.0)
            if x < rate:
                return kind
            x -= rate
        return None

    def missing_roles(self, roles: TokenRoles) -> dict[str, list[str]]:
        """Kinds switched on whose token roles the profile does not resolve: they could never be planted."""
        missing = {name: _missing(BY_NAME[name], roles) for name, rate in self.rates.items() if rate}
        return {name: absent for name, absent in missing.items() if absent}


def _missing(kind: DefectKind, roles: TokenRoles) -> list[str]:
    """What the profile lacks to carry this kind: token roles, or a tool-call grammar it can be written in."""
    absent = [need for need in kind.needs if getattr(roles, need) in (None, frozenset())]
    if roles.tool_calls is not None and roles.tool_calls.format not in kind.formats:
        absent.append(f"a tool-call grammar of format {' or '.join(kind.formats)}")
    return absent


def applies(kind: DefectKind, declares_tools: bool, thinking: bool) -> bool:
    """Whether this prompt can carry the defect alone: a call in answer to a prompt with no tools is a second defect."""
    return (kind.tools is None or kind.tools == declares_tools) and (thinking or not kind.thinking)


def defect_sent(
    defect: str | None, defect_at: int, output_ids: list[int], finish_reason: dict[str, Any], roles: TokenRoles
) -> tuple[list[int], str | None]:
    """The ids the server sends and the defect they carry: none when the length cut fell before it showed."""
    if defect is None or len(output_ids) <= defect_at:
        return output_ids, None
    if defect == "no_eos_at_end":
        if finish_reason["type"] != "stop" or output_ids[-1] not in roles.eos_ids:
            return output_ids, None  # a stop id ended it early: there is no EOS to drop
        return output_ids[:-1], defect  # finish_reason still names the EOS that output_ids lacks
    return output_ids, defect


def plant_in_response(
    kind: str, text: str, meta_info: dict[str, Any], output_len: int, rng: random.Random
) -> tuple[str, dict[str, Any]]:
    """The server-side kinds: counts or text that disagree with the ids actually sent."""
    meta = dict(meta_info)
    if kind == "count_mismatch":
        meta["completion_tokens"] = output_len + (rng.choice((-1, 1)) if output_len else 1)
    elif kind == "prompt_tokens_mismatch":
        change = rng.choice((None, -1, 1))
        if change is None:
            del meta["prompt_tokens"]  # as in an abort answer: a client must not trust it blindly
        else:
            meta["prompt_tokens"] += change
    elif kind == "text_mismatch":
        text = change_one_word(text, rng)
    return text, meta


def change_one_word(text: str, rng: random.Random) -> str:
    """One ASCII word with its case swapped, so the text surely differs; "?" appended when there is no word."""
    words = list(re.finditer(r"[A-Za-z]+", text))
    if not words:
        return text + "?"
    word = rng.choice(words)
    return text[: word.start()] + word.group().swapcase() + text[word.end() :]
