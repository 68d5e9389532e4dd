"""decode() as a table lookup for byte-level BPE vocabularies (Kimi's, Qwen's, GPT-2's): validate decodes every
output, and transformers' own path costs about ten times more."""

from __future__ import annotations

import operator
import random
from typing import Any

from regen.tokenizers.vocab import entry_bytes


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

        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None or not isinstance(backend.decoder, decoders.ByteLevel):
            return None
        if getattr(tokenizer, "clean_up_tokenization_spaces", False):
            return None
        added = {i: t.content for i, t in tokenizer.added_tokens_decoder.items()}
        size = len(tokenizer)
        tokens = [""] * size  # one get_vocab call, not one id_to_token call per id (160k for Kimi)
        for token, token_id in backend.get_vocab(with_added_tokens=False).items():
            if 0 <= token_id < size:
                tokens[token_id] = token
        table = [
            entry_bytes(added[token_id], True) if token_id in added else entry_bytes(token)
            for token_id, token in enumerate(tokens)
        ]
        decoder = cls(table, backend)
        return decoder if decoder._agrees_with(backend, len(table)) else None

    def _agrees_with(self, backend: Any, vocab_size: int) -> bool:
        rng = random.Random(0)
        samples = [list(range(start, min(start + 512, vocab_size))) for start in range(0, vocab_size, 512)]
        samples += [[rng.randrange(vocab_size) for _ in range(rng.randint(1, 64))] for _ in range(300)]
        return all(self.decode(ids) == backend.decode(ids, skip_special_tokens=False) for ids in samples)
