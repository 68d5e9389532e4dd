"""A profile's tokenizer and chat template at work: conversations rendered into prompt ids exactly as SGLang's chat
endpoint renders them (regen.chat_request shapes the request first), the profile's token roles resolved to ids and
checked, ids decoded, and the fingerprint every manifest records.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from regen.chat_request import TEMPLATE_INPUTS, content_format, served_messages, served_tools
from regen.decoding import ByteTableDecoder
from regen.profiles import Profile
from regen.tokenizers.loading import load_tokenizer, tokenizer_files_digest
from regen.tokenizers.vocab import entry_bytes
from regen.tool_calls import ToolCallIds


@dataclass(frozen=True)
class TokenRoles:
    """A profile's token roles resolved to ids for one tokenizer: everything validation judges an output by."""

    generation_suffix: tuple[int, ...]
    eos_ids: frozenset[int]
    vocab_size: int
    reasoning_start: int | None = None
    reasoning_end: int | None = None
    role_ids: frozenset[int] = frozenset()
    tool_calls: ToolCallIds | None = None

    @property
    def opening_phase(self) -> str:
        """Where an answer to a prompt ending in the generation suffix starts (see `phase_after`)."""
        return self.phase_after(self.generation_suffix)

    def phase_after(self, tail: Any) -> str:
        """Where an answer starts after these last prompt ids, from the last reasoning token among them: "reasoning"
        when the prompt opened it (Kimi's `<think>`, Qwen3.6's `<think>\n`), "off" when it opened and closed it
        (thinking turned off), "answer" when there is none (the model may open reasoning itself), and "off" for a
        model that does not reason."""
        if self.reasoning_start is None:
            return "off"
        ids = [int(i) for i in tail]
        opened = max((i for i, t in enumerate(ids) if t == self.reasoning_start), default=-1)
        closed = max((i for i, t in enumerate(ids) if t == self.reasoning_end), default=-1)
        if closed > opened:
            return "off"
        return "reasoning" if opened >= 0 else "answer"

    def as_record(self) -> dict[str, Any]:
        calls = self.tool_calls
        return {
            "generation_suffix_ids": list(self.generation_suffix),
            "eos_ids": sorted(self.eos_ids),
            "vocab_size": self.vocab_size,
            "reasoning_start_id": self.reasoning_start,
            "reasoning_end_id": self.reasoning_end,
            "role_ids": sorted(self.role_ids),
            "tool_call_ids": calls.as_record() if calls else None,
            "tool_call_id_pattern": calls.call_id.pattern if calls and calls.call_id else None,
        }


class ChatRenderer:
    """Renders conversations into prompt ids exactly as the served model expects them."""

    def __init__(self, profile: Profile) -> None:
        """Loads the tokenizer and checks the profile against it: every role is one token, and the generation suffix
        is what the template appends for add_generation_prompt=True. A ValueError names the profile and the field."""
        self.profile = profile
        self.tokenizer = load_tokenizer(profile.tokenizer, profile.revision, profile.trust_remote_code)
        self.template_kwargs = dict(profile.chat_template_kwargs)
        if profile.chat_template:
            try:  # passed to apply_chat_template, never set on the tokenizer: loaded tokenizers are shared
                self.template_kwargs["chat_template"] = Path(profile.chat_template).read_text(encoding="utf-8")
            except OSError as e:
                raise ValueError(f"profile {profile.name!r}: chat_template: cannot read {e.filename}: {e}") from e
        self.content_format = content_format(self.chat_template)
        self._encode_kwargs, self._encode_via_text = self._encoding_path()
        self.roles = self._resolve_roles()
        self._check_generation_suffix()
        self._decoder: ByteTableDecoder | None = None
        self._decoder_built = False

    @property
    def chat_template(self) -> str | None:
        template = self.template_kwargs.get("chat_template", self.tokenizer.chat_template)
        return template if isinstance(template, str) or template is None else canonical_json(template)

    def token_id(self, token: str, role: str = "token") -> int:
        """A role token must be ONE id: a string the tokenizer splits into pieces cannot mark anything."""
        ids = self.tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1 or ids[0] == self.tokenizer.unk_token_id:
            raise ValueError(
                f"profile {self.profile.name!r}: {role}: {token!r} is not one token of the tokenizer's vocabulary "
                f"(it encodes to {len(ids)} ids: {ids[:8]})"
            )
        return int(ids[0])

    def _resolve_roles(self) -> TokenRoles:
        p = self.profile
        grammar = p.tool_calls
        return TokenRoles(
            generation_suffix=tuple(self.tokenizer.encode(p.generation_suffix, add_special_tokens=False)),
            eos_ids=frozenset(self.token_id(t, "eos_tokens") for t in p.eos_tokens),
            vocab_size=len(self.tokenizer),
            reasoning_start=self.token_id(p.reasoning_start, "reasoning_start") if p.reasoning_start else None,
            reasoning_end=self.token_id(p.reasoning_end, "reasoning_end") if p.reasoning_end else None,
            role_ids=frozenset(self.token_id(t, "role_tokens") for t in p.role_tokens),
            tool_calls=ToolCallIds(
                format=grammar.format,
                **{role: self.token_id(token, f"tool_calls.{role}") for role, token in grammar.tokens().items()},
                call_id=p.call_id_pattern() if grammar.format == "sections" else None,
                parser=p.tool_call_parser,
                ends_reasoning=p.reasoning_tool_start == grammar.tokens().get("section_begin", grammar.call_begin),
                reasoning_ends_at=p.reasoning_tool_start,
            )
            if grammar
            else None,
        )

    def _check_generation_suffix(self) -> None:
        """Validation finds the answer after the suffix, and the simulator answers after it: it must be exactly what
        the template appends for a new assistant turn."""
        probe = [{"role": "user", "content": "Hi"}]
        turn = str(self.tokenizer.apply_chat_template(probe, tokenize=False, **self.template_kwargs))
        prompt = self.render_text(probe, None)
        appended = prompt[len(turn) :] if prompt.startswith(turn) else None
        if appended != self.profile.generation_suffix:
            raise ValueError(
                f"profile {self.profile.name!r}: generation_suffix {self.profile.generation_suffix!r} is not what the "
                f"chat template appends for add_generation_prompt=True: {appended!r}"
            )

    def _encoding_path(self) -> tuple[dict[str, Any], bool]:
        """How SGLang's chat layer turns the rendered text into ids for this tokenizer (serving_chat.py, 0.5.23):
        `encode(text)`, with `add_special_tokens=False` only for a tokenizer that adds special tokens on its own (so
        a slow tokenizer such as Kimi's stays on its own fast path); or, where rendering to text and encoding it back
        differs from encoding the template's output directly, `apply_chat_template(tokenize=True)`."""
        encode_kwargs: dict[str, Any] = {"add_special_tokens": False} if self.tokenizer.encode("") else {}
        probe = [{"role": "user", "content": "x"}]
        template = {k: v for k, v in self.template_kwargs.items() if k == "chat_template"}  # the server's template
        try:
            text = self.tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True, **template)
            via_text = self.tokenizer.encode(text, **encode_kwargs)
            direct = self.tokenizer.apply_chat_template(
                probe, tokenize=True, add_generation_prompt=True, return_dict=False, **template
            )
        except Exception:
            return encode_kwargs, True
        return encode_kwargs, list(via_text) == list(direct)

    def render_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """The ids SGLang's chat endpoint sends the engine for this conversation: the template's text, encoded."""
        if not self._encode_via_text:
            messages, served = self.served(messages, tools)
            ids = self.tokenizer.apply_chat_template(
                messages,
                tools=served,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
                **self.template_kwargs,
            )
            return [int(i) for i in ids]
        return [int(i) for i in self.tokenizer.encode(self.render_text(messages, tools), **self._encode_kwargs)]

    @property
    def encodes_rendered_text(self) -> bool:
        """Whether `encode_texts([render_text(...)])` gives exactly `render_ids(...)`: whether the template's text is
        what SGLang encodes for this tokenizer (see `_encoding_path`), so prompts may be rendered to text one by one
        and encoded in batches."""
        return self._encode_via_text

    def encode_texts(self, texts: list[str], add_special_tokens: bool | None = None) -> list[list[int]]:
        """`tokenizer.encode(text)` of each text, with `render_ids`' arguments unless `add_special_tokens` is given.
        A fast tokenizer encodes them in one batch call, whose per-text path is its encode's (`_encode_plus`): its
        per-call cost (argument checks, converting the result) is paid once per batch instead of once per text. A
        slow one, whose encode may be its own (Kimi's remote code overrides it), encodes them one by one."""
        kwargs = self._encode_kwargs if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        if not texts:  # the batch call refuses an empty list
            return []
        if not getattr(self.tokenizer, "is_fast", False):
            return [[int(i) for i in self.tokenizer.encode(text, **kwargs)] for text in texts]
        encoded = self.tokenizer(texts, return_attention_mask=False, return_token_type_ids=False, **kwargs)
        return list(encoded["input_ids"])

    def render_text(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        messages, served = self.served(messages, tools)
        return str(
            self.tokenizer.apply_chat_template(
                messages, tools=served, add_generation_prompt=True, tokenize=False, **self.template_kwargs
            )
        )

    def served(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """The messages and tools as SGLang hands them to this template (regen.chat_request); a `Refused` is its 400."""
        return served_messages(messages, self.content_format), served_tools(tools)

    @cached_property
    def max_token_bytes(self) -> int | None:
        """The most bytes of text one token can stand for: prepare rejects text too long for `max_prompt_tokens`
        before tokenizing it. Read from the vocabulary: a byte-level entry's characters are its bytes, and any other
        entry's UTF-8 length is at least the text it decodes to (SentencePiece's `▁`, byte fallback's `<0x41>`).
        A Unicode-composing normalizer (NFC, NFKC) shrinks text at most threefold (three Hangul jamo, one syllable).
        None, so no cheap bound, when another normalizer could shrink text without limit (whitespace stripping)."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        normalizer = getattr(backend, "normalizer", None)
        shrink = 1 if normalizer is None else 3 if type(normalizer).__name__ in ("NFC", "NFKC") else None
        if shrink is None:
            return None
        added = set(self.tokenizer.get_added_vocab())
        longest = max(len(entry_bytes(token, token in added)) for token in self.tokenizer.get_vocab())
        return longest * shrink

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """`tokenizer.decode(ids, skip_special_tokens=...)`; for a byte-level vocabulary (Kimi's, Qwen's, GPT-2's)
        through a byte table that is proven to give the same text when it is built (validate decodes every output,
        and transformers' own path costs about ten times more)."""
        decoder = self._byte_table() if not skip_special_tokens else None
        if decoder is not None:
            return decoder.decode(ids)
        return str(self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def decode_in_vocab(self, ids: list[int]) -> str:
        """decode() of ids already known to be inside the vocabulary (validate checks that first): no range check."""
        decoder = self._byte_table()
        return decoder.decode_in_vocab(ids) if decoder is not None else self.decode(ids)

    def _byte_table(self) -> ByteTableDecoder | None:
        if not self._decoder_built:
            self._decoder, self._decoder_built = ByteTableDecoder.build(self.tokenizer), True
        return self._decoder

    @cached_property
    def record(self) -> dict[str, Any]:
        """The profile and its fingerprint, as manifests record them: computed once per renderer (hashing the
        tokenizer files is not free, and prepare needs it both for the inputs digest and the manifest)."""
        return {**self.profile.as_record(), **self.fingerprint()}

    def fingerprint(self) -> dict[str, Any]:
        """Exactly which template and tokenizer render this run's prompts: recorded in every manifest, and compared
        at validate so that a tokenizer or template that moved between stages is caught."""
        import tokenizers
        import transformers

        return {
            "chat_template_sha256": hashlib.sha256((self.chat_template or "").encode("utf-8")).hexdigest(),
            "template_inputs": TEMPLATE_INPUTS,
            "tokenizer_files_sha256": tokenizer_files_digest(self.tokenizer.name_or_path, self.profile.revision),
            "transformers_version": transformers.__version__,
            "tokenizers_version": tokenizers.__version__,
        }


def canonical_json(value: Any) -> str:
    """One spelling per value: sorted keys, no spaces, UTF-8 kept. Used for ids and for stored JSON columns."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
