"""A target model, declared as data: its tokenizer, its chat template and the roles of its tokens, by string.

`Profile` is the one declaration of a profile: the built-in ones (`builtin_profiles.yaml`, beside this module) and a
deployment's (`profiles:` in its config) are read by the same model, and `lookup` is the one way to a profile by name.
Nothing about a particular model is written in code: a second target model is a config entry, and a built-in
tokenizer one entry of the registry in regen.tokenizers. Roles are checked against the tokenizer when it loads
(regen.chat.ChatRenderer); the manifest records `as_record()`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

PROFILE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
BUILTIN_FILE = "builtin_profiles.yaml"


class SectionCalls(BaseModel):
    """Calls as special tokens (Kimi's; SGLang's kimi_k2 detector): `section_begin (call_begin ID argument_begin JSON
    call_end)+ section_end`, each ID written by `call_id_format` from {name}, {index} and {id}."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    format: Literal["sections"] = Field(description="the grammar's tag")
    section_begin: str = Field(description="the token opening a section of calls")
    section_end: str = Field(description="the token closing it")
    call_begin: str = Field(description="the token before each call's id")
    argument_begin: str = Field(description="the token between a call's id and its JSON arguments")
    call_end: str = Field(description="the token closing a call")
    call_id_format: str = Field("{id}", description="how a call id is written, from {name}, {index} and {id}")

    def tokens(self) -> dict[str, str]:
        """Role -> token string, for every marker of the grammar (in the order manifests have always recorded)."""
        roles = ("call_begin", "call_end", "section_begin", "section_end", "argument_begin")
        return {role: getattr(self, role) for role in roles}


class TaggedCalls(BaseModel):
    """Each call between a begin and an end token: `tagged_json` writes `{"name", "arguments"}` (Qwen3 2504; SGLang's
    qwen25 detector), `tagged_xml` writes `<function=NAME>` with `<parameter=KEY>` values (Qwen3.5/3.6, qwen3_coder)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    format: Literal["tagged_json", "tagged_xml"] = Field(description="JSON objects or XML-style parameters")
    call_begin: str = Field(description="the token opening each call")
    call_end: str = Field(description="the token closing it")

    def tokens(self) -> dict[str, str]:
        return self.model_dump(include={"call_begin", "call_end"})


ToolCallGrammar = Annotated[SectionCalls | TaggedCalls, Field(discriminator="format")]
FORMATS = ("sections", "tagged_json", "tagged_xml")
# SGLang's parsers this project reads as SGLang 0.5.23 does, as data (sglang_parsers.yaml, beside this module): the
# grammar format each tool-call parser reads, and the text that ends reasoning without its end token for each
# reasoning parser. A profile that names none is read by its declared grammar, literally.
_PARSERS = yaml.safe_load(resources.files("regen").joinpath("sglang_parsers.yaml").read_text(encoding="utf-8"))
TOOL_CALL_PARSERS: dict[str, str] = _PARSERS["tool_call_parsers"]
REASONING_TOOL_STARTS: dict[str, str] = _PARSERS["reasoning_tool_starts"]


class Profile(BaseModel):
    """A target model. `name` is the key it is declared under."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field("", description="the key it is declared under (set by the lookup)")
    tokenizer: str = Field(description="a hub id (with `revision`), a local directory, or builtin:<name>")
    revision: str | None = Field(None, description="the hub revision to pin: a moved branch never changes prompts")
    trust_remote_code: bool = Field(False, description="for a tokenizer whose tokenizer_config.json names its own code")
    chat_template: str | None = Field(None, description="a Jinja file used instead of the tokenizer's own template")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="passed to apply_chat_template (e.g. {enable_thinking: true})"
    )
    generation_suffix: str = Field(description="what the template appends for add_generation_prompt=True")
    reasoning_start: str | None = Field(
        None, description="the token opening reasoning; null: the model does not reason"
    )
    reasoning_end: str | None = Field(None, description="the token closing it (both or neither)")
    eos_tokens: tuple[str, ...] = Field(min_length=1, description="tokens that end an answer, each one token")
    role_tokens: tuple[str, ...] = Field((), description="turn markers no output may contain")
    tool_calls: ToolCallGrammar | None = Field(
        None, description="the tool-call grammar; format: sections | tagged_json | tagged_xml"
    )
    tool_call_parser: str | None = Field(
        None,
        description="SGLang's --tool-call-parser for this model (kimi_k2, deepseekv31, qwen3_coder): "
        "validation and on-policy reading follow it, and check_server holds the fleet to it; null: the declared "
        "grammar is the reading, literally (call_id_format decides ids)",
    )
    reasoning_parser: str | None = Field(
        None,
        description="SGLang's --reasoning-parser for this model (kimi_k2, qwen3, deepseek-v3, ...), checked "
        "against the fleet's; null: not checked",
    )
    max_prompt_tokens: int = Field(
        131_072, ge=1, description="longer prompts are rejected at prepare (prompt_too_long)"
    )
    served_model_names: tuple[str, ...] = Field((), description="what the fleet's /model_info may report")
    vocab_size: int | None = Field(
        None,
        ge=1,
        description="the model's vocabulary (its config.json vocab_size; check_server holds the fleet to it): the "
        "target vocabulary of the draft mapping (t2d). null: the served model's where the fleet says, else the "
        "tokenizer's ids",
    )
    draft_vocab_size: int = Field(
        32_000, ge=1, description="the drafter's vocabulary: the most frequent answer ids, mapped by vocab/d2t.npy"
    )

    @model_validator(mode="after")
    def _consistent(self) -> Profile:
        if self.name and not PROFILE_NAME.match(self.name):
            raise ValueError(f"profile name {self.name!r}: use lowercase letters, digits, '.', '_' or '-'")
        if (self.reasoning_start is None) != (self.reasoning_end is None):
            raise ValueError("give both reasoning_start and reasoning_end, or neither")
        if self.trust_remote_code and self.tokenizer.startswith("builtin:"):
            raise ValueError("a builtin tokenizer never needs trust_remote_code")
        if self.vocab_size is not None and self.draft_vocab_size > self.vocab_size:
            raise ValueError(f"draft_vocab_size {self.draft_vocab_size} is over the vocab_size {self.vocab_size}")
        self._check_tool_call_parser()
        return self

    def _check_tool_call_parser(self) -> None:
        parser = self.tool_call_parser
        if parser is None:
            return
        if parser not in TOOL_CALL_PARSERS:
            raise ValueError(
                f"tool_call_parser {parser!r}: this project reads {', '.join(sorted(TOOL_CALL_PARSERS))} as SGLang "
                "does; for another model leave it null, and its declared tool_calls grammar is read literally"
            )
        if self.tool_calls is None or self.tool_calls.format != TOOL_CALL_PARSERS[parser]:
            raise ValueError(
                f"tool_call_parser {parser!r} reads tool_calls of format {TOOL_CALL_PARSERS[parser]!r}; "
                f"this profile declares {self.tool_calls.format if self.tool_calls else None!r}"
            )

    @property
    def tokenizer_source(self) -> str:
        """Which tokenizer, for whom: the subject of every message about loading it."""
        revision = f" (revision {self.revision})" if self.revision else ""
        return f"profile {self.name!r}: tokenizer {self.tokenizer!r}{revision}"

    def replaced(self, **changes: Any) -> Profile:
        """A copy with these fields changed, checked like any declaration."""
        return Profile.model_validate({**self.model_dump(), **changes})

    @property
    def tool_call_id_format(self) -> str:
        """How a dataset's tool-call ids are rewritten before rendering: {name}, {index}, {id}."""
        return self.tool_calls.call_id_format if isinstance(self.tool_calls, SectionCalls) else "{id}"

    @property
    def reasoning_tool_start(self) -> str | None:
        """The text that ends reasoning without its end token, as the profile's reasoning parser reads it."""
        if self.reasoning_parser in REASONING_TOOL_STARTS:
            return REASONING_TOOL_STARTS[self.reasoning_parser]
        return (
            None
            if self.tool_calls is None
            else self.tool_calls.tokens().get("section_begin") or self.tool_calls.call_begin
        )

    def call_id_pattern(self) -> re.Pattern[str]:
        """The ids the format produces: `functions.{name}:{index}` -> `functions\\.(?P<name>.+):\\d+`."""
        fields = {"name": "(?P<name>.+)", "index": r"\d+", "id": ".+"}
        parts = re.split(r"\{(name|index|id)\}", self.tool_call_id_format)
        return re.compile("".join(fields[p] if i % 2 else re.escape(p) for i, p in enumerate(parts)), re.DOTALL)

    def with_paths(self, resolve: Callable[[str], str]) -> Profile:
        """Its tokenizer directory and template file resolved (a config's are relative to the config file)."""
        local = not self.tokenizer.startswith("builtin:") and (
            self.tokenizer.startswith((".", "/")) or Path(resolve(self.tokenizer)).is_dir()
        )
        return self.model_copy(
            update={
                "tokenizer": resolve(self.tokenizer) if local else self.tokenizer,
                "chat_template": resolve(self.chat_template) if self.chat_template else None,
            }
        )

    def as_record(self) -> dict[str, Any]:
        """What every manifest records, so a drafter's data says exactly which template produced it."""
        calls = self.tool_calls
        return {
            "name": self.name,
            "tokenizer": self.tokenizer,
            "revision": self.revision,
            "chat_template_file": self.chat_template,
            "chat_template_kwargs": self.chat_template_kwargs,
            "generation_suffix": self.generation_suffix,
            "reasoning_start": self.reasoning_start,
            "reasoning_end": self.reasoning_end,
            "eos_tokens": list(self.eos_tokens),
            "role_tokens": list(self.role_tokens),
            "tool_call_grammar": {"format": calls.format, **calls.tokens()} if calls else None,
            "tool_call_id_format": self.tool_call_id_format,
            "tool_call_parser": self.tool_call_parser,
            "reasoning_parser": self.reasoning_parser,
        }


@cache
def builtin_profiles() -> dict[str, Profile]:
    """The profiles this project ships, read from their declaration as any config's are."""
    text = resources.files("regen").joinpath(BUILTIN_FILE).read_text(encoding="utf-8")
    return {name: Profile.model_validate({**body, "name": name}) for name, body in yaml.safe_load(text).items()}


def lookup(name: str, declared: Mapping[str, Profile] | None = None) -> Profile:
    """A built-in profile, or one a config declares; ValueError naming the ones there are."""
    profiles = {**builtin_profiles(), **(declared or {})}
    if name not in profiles:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(sorted(profiles))}")
    return profiles[name]
