"""Model profiles: which tokenizer, which chat-template kwargs, and the roles of tokens, declared by string.

Nothing about a particular model is hard-coded outside its profile: a second target model is a new profile.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any

PROFILE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class ModelProfile:
    name: str
    tokenizer: str  # hub id, local directory, or "builtin:kimi-k2.5-mini"
    revision: str | None = None
    trust_remote_code: bool = False
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # Token roles, by string; resolved to ids against the loaded tokenizer.
    generation_suffix: str = ""  # what every prompt ends with (add_generation_prompt=True)
    reasoning_end: str | None = None  # None: the model does not reason in this profile
    eos_tokens: tuple[str, ...] = ()
    tool_calls_begin: str | None = None
    tool_call_id_format: str = "{id}"  # how tool-call ids are rewritten before rendering
    max_prompt_tokens: int = 131_072
    served_model_names: tuple[str, ...] = ()  # what /model_info may report for this profile

    def __post_init__(self) -> None:
        if not PROFILE_NAME.match(self.name):
            raise ValueError(f"profile name {self.name!r}: use lowercase letters, digits, '.', '_' or '-'")
        if not self.generation_suffix or not self.eos_tokens:
            raise ValueError(f"profile {self.name!r}: generation_suffix and eos_tokens are required")
        if self.trust_remote_code and self.tokenizer.startswith("builtin:"):
            raise ValueError(f"profile {self.name!r}: a builtin tokenizer never needs trust_remote_code")

    def as_record(self) -> dict[str, Any]:
        """What every manifest records, so a drafter's data says exactly which template produced it."""
        return {
            "name": self.name,
            "tokenizer": self.tokenizer,
            "revision": self.revision,
            "chat_template_kwargs": self.chat_template_kwargs,
            "generation_suffix": self.generation_suffix,
            "reasoning_end": self.reasoning_end,
            "eos_tokens": list(self.eos_tokens),
        }


_KIMI_K25_ROLES: dict[str, Any] = {
    "chat_template_kwargs": {"thinking": True},
    "generation_suffix": "<|im_assistant|>assistant<|im_middle|><think>",
    "reasoning_end": "</think>",
    "eos_tokens": ("<|im_end|>", "[EOS]"),
    "tool_calls_begin": "<|tool_calls_section_begin|>",
    "tool_call_id_format": "functions.{name}:{index}",
}

PROFILES: dict[str, ModelProfile] = {
    "kimi-k2.5": ModelProfile(
        name="kimi-k2.5",
        tokenizer="moonshotai/Kimi-K2.5",
        trust_remote_code=True,
        max_prompt_tokens=131_072,
        served_model_names=("moonshotai/Kimi-K2.5", "Kimi-K2.5", "kimi-k2.5"),
        **_KIMI_K25_ROLES,
    ),
    "kimi-k2.5-mini": ModelProfile(
        name="kimi-k2.5-mini",
        tokenizer="builtin:kimi-k2.5-mini",
        max_prompt_tokens=8_192,
        served_model_names=("kimi-k2.5-mini",),
        **_KIMI_K25_ROLES,
    ),
}


def get_profile(name: str) -> ModelProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; known profiles: {', '.join(sorted(PROFILES))}") from None


@dataclass(frozen=True)
class TokenRoles:
    """A profile's token roles resolved to ids for one tokenizer."""

    generation_suffix: tuple[int, ...]
    reasoning_end: int | None
    eos_ids: frozenset[int]
    tool_calls_begin: int | None

    def as_record(self) -> dict[str, Any]:
        return {
            "generation_suffix_ids": list(self.generation_suffix),
            "reasoning_end_id": self.reasoning_end,
            "eos_ids": sorted(self.eos_ids),
            "tool_calls_begin_id": self.tool_calls_begin,
        }


class ChatRenderer:
    """Renders conversations into prompt ids exactly as the served model expects them."""

    def __init__(self, profile: ModelProfile) -> None:
        self.profile = profile
        self.tokenizer = load_tokenizer(profile)
        self.roles = self._resolve_roles()

    def token_id(self, token: str) -> int:
        token_id = self.tokenizer.convert_tokens_to_ids(token)
        if token_id is None or token_id == self.tokenizer.unk_token_id:
            raise ValueError(f"profile {self.profile.name!r}: token {token!r} is not in the tokenizer's vocabulary")
        return int(token_id)

    def _resolve_roles(self) -> TokenRoles:
        p = self.profile
        return TokenRoles(
            generation_suffix=tuple(self.tokenizer.encode(p.generation_suffix, add_special_tokens=False)),
            reasoning_end=self.token_id(p.reasoning_end) if p.reasoning_end else None,
            eos_ids=frozenset(self.token_id(t) for t in p.eos_tokens),
            tool_calls_begin=self.token_id(p.tool_calls_begin) if p.tool_calls_begin else None,
        )

    def render_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        ids = self.tokenizer.apply_chat_template(
            messages,
            tools=tools or None,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
            **self.profile.chat_template_kwargs,
        )
        return [int(i) for i in ids]

    def render_text(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                messages,
                tools=tools or None,
                add_generation_prompt=True,
                tokenize=False,
                **self.profile.chat_template_kwargs,
            )
        )

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))


def load_tokenizer(profile: ModelProfile) -> Any:
    return _load_tokenizer(profile.tokenizer, profile.revision, profile.trust_remote_code)


@cache
def _load_tokenizer(source: str, revision: str | None, trust_remote_code: bool) -> Any:
    from transformers import AutoTokenizer

    if source == "builtin:kimi-k2.5-mini":
        from regen.assets.kimi_mini import ensure_mini_tokenizer

        source = str(ensure_mini_tokenizer())
    elif source.startswith("builtin:"):
        raise ValueError(f"unknown builtin tokenizer {source!r}")
    return AutoTokenizer.from_pretrained(source, revision=revision, trust_remote_code=trust_remote_code)


def canonical_json(value: Any) -> str:
    """One spelling per value: sorted keys, no spaces, UTF-8 kept. Used for ids and for stored JSON columns."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
