"""A remote-code tokenizer shaped like Kimi-K2.5's `tokenization_kimi.py`, over the mini tokenizer's vocabulary.

Kimi-K2.5 ships no `tokenizer.json`: its repository holds `tiktoken.model` (base64 token bytes and their rank, one
per line), a `tokenizer_config.json` whose `auto_map` names `tokenization_kimi.TikTokenTokenizer`, that module, and
its sibling `tool_declaration_ts.py`. The class is a Python `PreTrainedTokenizer` around a `tiktoken.Encoding`
built from the ranks, Kimi's split pattern and the 256 reserved special slots (named from `added_tokens_decoder`);
it imports what transformers 4 offered (`bytes_to_unicode` from the GPT-2 module, `PreTrainedTokenizer` from
`transformers.tokenization_utils`), and its `apply_chat_template` declares tools in TypeScript and passes
`thinking`.

This module has that structure, written here, so that the production loading path (`trust_remote_code`, tiktoken,
the transformers-4 imports that `regen.chat` restores under transformers 5) is exercised without the hub. It is never
imported from the package: `regen.tokenizers.kimi_mini.ensure_tiktoken_tokenizer` copies it into a directory with Kimi's
layout, which renders the same ids as the mini tokenizer (a unit test checks): its ranks are the mini tokenizer's BPE
ids, which the BPE trainer numbers in merge order, so tiktoken's lowest-rank-first merging makes the same merges.
Standing alone in that directory, it carries its own copy of Kimi's split pattern (`kimi_mini.SPLIT_PATTERN`), as
Kimi's module does; the test's identical ids are what keep the two equal.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode  # type: ignore[attr-defined]
from transformers.tokenization_utils import PreTrainedTokenizer

from .tool_declaration_ts import kimi_template_inputs

VOCAB_FILES_NAMES = {"vocab_file": "tiktoken.model"}
MAX_ENCODE_CHARS = 400_000  # Kimi's: the most characters given to tiktoken at once
MAX_RUN_CHARS = 25_000  # Kimi's: the longest run of whitespace, or of non-whitespace, given to tiktoken at once


def runs_at_most(text: str, limit: int) -> list[str]:
    """The text cut so that no piece holds more than `limit` whitespace characters in a row, or more than `limit`
    other characters in a row; a cut falls where a run reaches the limit."""
    pieces, start, run, spaces = [], 0, 0, text[:1].isspace()
    for i, char in enumerate(text):
        if char.isspace() != spaces:
            run, spaces = 1, not spaces
            continue
        run += 1
        if run > limit:
            pieces.append(text[start:i])
            start, run = i, 1
    pieces.append(text[start:])
    return pieces


class TikTokenTokenizer(PreTrainedTokenizer):
    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names = ["input_ids", "attention_mask"]  # noqa: RUF012 (transformers declares it so)
    num_reserved_special_tokens = 256
    # Kimi's pre-tokenization: Han runs apart, words with their leading punctuation, digits in threes.
    pat_str = "|".join(
        [
            r"[\p{Han}]+",
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
            r"\p{N}{1,3}",
            r" ?[^\s\p{L}\p{N}]+[\r\n]*",
            r"\s*[\r\n]+",
            r"\s+(?!\S)",
            r"\s+",
        ]
    )

    def __init__(
        self,
        vocab_file: str,
        bos_token: str = "[BOS]",
        eos_token: str = "[EOS]",
        unk_token: str | None = None,
        pad_token: str | None = None,
        added_tokens_decoder: dict[int, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        names = {int(i): getattr(t, "content", t) for i, t in (added_tokens_decoder or {}).items()}
        ranks = load_tiktoken_bpe(vocab_file)
        first_special = len(ranks)
        self.special_tokens = {
            names.get(i, f"<|reserved_token_{i - first_special}|>"): i
            for i in range(first_special, first_special + self.num_reserved_special_tokens)
        }
        self.vocab_file = vocab_file
        self.model = tiktoken.Encoding(
            name=Path(vocab_file).name, pat_str=self.pat_str, mergeable_ranks=ranks, special_tokens=self.special_tokens
        )
        self.n_words = self.model.n_vocab
        byte_encoder = bytes_to_unicode()
        self.byte_decoder = {char: byte for byte, char in byte_encoder.items()}
        # Token strings as transformers sees them: byte-level characters for ranks, the text for special tokens.
        self.decoder = {rank: "".join(byte_encoder[b] for b in token) for token, rank in ranks.items()}
        self.decoder.update({i: token for token, i in self.special_tokens.items()})
        self.encoder = {token: i for i, token in self.decoder.items()}
        super().__init__(
            bos_token=bos_token,
            eos_token=eos_token,
            unk_token=unk_token,
            pad_token=pad_token,
            added_tokens_decoder=added_tokens_decoder,
            **kwargs,
        )

    def encode(self, text: Any, *args: Any, **kwargs: Any) -> list[int]:
        """Kimi's two paths: called with any keyword (`add_special_tokens=False` included), transformers' own
        `encode`, which splits at special tokens first; called with the text alone (as SGLang's chat layer calls
        it), tiktoken over the text in pieces: at most MAX_ENCODE_CHARS characters, and no run of more than
        MAX_RUN_CHARS whitespace or non-whitespace characters (special-token text counts as non-whitespace, so a
        long run can cut one in two). The ids then differ from the first path's for long prompts: that is Kimi's."""
        if args or kwargs or not isinstance(text, str):
            return list(super().encode(text, *args, **kwargs))
        ids: list[int] = []
        for start in range(0, len(text), MAX_ENCODE_CHARS):
            for piece in runs_at_most(text[start : start + MAX_ENCODE_CHARS], MAX_RUN_CHARS):
                ids.extend(self.model.encode(piece, allowed_special="all"))
        return ids

    def decode(self, token_ids: Any, **kwargs: Any) -> Any:
        """Kimi's: any keyword goes through transformers' `decode` (a batch gives a list); none, through tiktoken."""
        if kwargs:
            return super().decode(token_ids, **kwargs)
        return str(self.model.decode([token_ids] if isinstance(token_ids, int) else list(token_ids)))

    @property
    def vocab_size(self) -> int:
        return int(self.n_words)

    def get_vocab(self) -> dict[str, int]:
        return dict(self.encoder)

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        return [self.decoder[i] for i in self.model.encode(text, allowed_special="all")]

    def _convert_token_to_id(self, token: str) -> int:
        return self.encoder.get(token, self.encoder.get(str(self.unk_token), 0))

    def _convert_id_to_token(self, index: int) -> str:
        return self.decoder.get(index, str(self.unk_token))

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        data = bytearray()
        for token in tokens:
            if token in self.special_tokens:
                data += token.encode("utf-8")
            else:
                data += bytes(self.byte_decoder[c] for c in token)
        return data.decode("utf-8", errors="replace")

    def apply_chat_template(self, conversation: Any, tools: Any = None, **kwargs: Any) -> Any:
        tools, declaration = kimi_template_inputs(tools)
        kwargs.setdefault("thinking", True)
        return super().apply_chat_template(conversation, tools=tools, **{**kwargs, **declaration})

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, ...]:
        target = Path(save_directory) / f"{filename_prefix + '-' if filename_prefix else ''}tiktoken.model"
        if Path(self.vocab_file).resolve() != target.resolve():
            shutil.copyfile(self.vocab_file, target)
        return (str(target),)
