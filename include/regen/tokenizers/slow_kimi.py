"""A slow (pure-Python) tokenizer with kimi-k2.5-mini's vocabulary, merges, special tokens and chat template.

Kimi-K2.5's real tokenizer is a Python `PreTrainedTokenizer` loaded with `trust_remote_code`, with no fast version;
the mini tokenizer is a Rust one. This stand-in is loaded the same way as Kimi's (a directory whose
`tokenizer_config.json` names this file in `auto_map`), so benchmarks of prepare measure a tokenizer whose cost is
Python's, in the same process layout. It produces the same ids as the mini tokenizer (a unit test checks).

The directory mirrors Kimi's layout: this file is copied in as `tokenization_kimi_mini.py` beside a copy of
`tool_declaration_ts.py` (as Kimi's `tokenization_kimi.py` sits beside its `tool_declaration_ts.py`), and transformers
imports both from there. Like Kimi's class, `apply_chat_template` sorts the tools' keys, passes their TypeScript
declaration as `tools_ts_str` and always passes `thinking` (fast_kimi.py says why the mini tokenizer does the same).
The class needs only the standard library, `regex`, `transformers` and its sibling module; the builder imports the
project lazily.
"""

from __future__ import annotations

import json
import os
import shutil
from itertools import pairwise
from pathlib import Path
from typing import Any

import regex
from transformers.tokenization_python import PythonBackend
from transformers.tokenization_utils_base import AddedToken

from .tool_declaration_ts import kimi_template_inputs

REMOTE_MODULE = "tokenization_kimi_mini"  # this file's name in the tokenizer directory
VOCAB_FILES_NAMES = {"vocab_file": "vocab.json", "merges_file": "merges.txt"}
CACHE_LIMIT = 100_000  # BPE results per piece kept in memory, like GPT-2's slow tokenizer (but bounded)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: every byte as a printable character (what `pre_tokenizers.ByteLevel` uses)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + extra)
            extra += 1
    return chars


class SlowKimiMiniTokenizer(PythonBackend):
    vocab_files_names = VOCAB_FILES_NAMES

    def __init__(self, vocab_file: str, merges_file: str, split_pattern: str = "", **kwargs: Any) -> None:
        with open(vocab_file, encoding="utf-8") as f:
            self.encoder: dict[str, int] = json.load(f)
        self.decoder = {i: token for token, i in self.encoder.items()}
        with open(merges_file, encoding="utf-8") as f:
            pairs = [tuple(line.rstrip("\n").split(" ")) for line in f if line.strip() and not line.startswith("#")]
        self.bpe_ranks = {pair: rank for rank, pair in enumerate(pairs)}
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {c: b for b, c in self.byte_encoder.items()}
        self.split_pattern = split_pattern
        self._splitter = regex.compile(split_pattern, flags=regex.V1)
        self._cache: dict[str, list[str]] = {}
        super().__init__(split_pattern=split_pattern, **kwargs)

    @property
    def vocab_size(self) -> int:
        return len(self.encoder)

    def get_vocab(self) -> dict[str, int]:
        return {**self.encoder, **self._added_tokens_encoder}

    def _pieces(self, text: str) -> list[str]:
        """The pre-tokenizer's `Split(..., behavior="isolated")`: every match, and every gap between matches."""
        pieces, end = [], 0
        for match in self._splitter.finditer(text):
            if match.start() > end:
                pieces.append(text[end : match.start()])
            pieces.append(match.group())
            end = match.end()
        if end < len(text):
            pieces.append(text[end:])
        return pieces

    def _bpe(self, piece: str) -> list[str]:
        cached = self._cache.get(piece)
        if cached is not None:
            return cached
        word, unmergeable = list(piece), len(self.bpe_ranks)
        while len(word) > 1:
            rank, i = min((self.bpe_ranks.get(pair, unmergeable), i) for i, pair in enumerate(pairwise(word)))
            if rank == unmergeable:
                break
            word[i : i + 2] = [word[i] + word[i + 1]]
        if len(self._cache) >= CACHE_LIMIT:
            self._cache.clear()
        self._cache[piece] = word
        return word

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        tokens: list[str] = []
        for piece in self._pieces(text):
            tokens.extend(self._bpe("".join(self.byte_encoder[b] for b in piece.encode("utf-8"))))
        return tokens

    def _convert_token_to_id(self, token: str) -> int:
        return self.encoder.get(token, self.encoder.get(str(self.unk_token), 0))

    def _convert_id_to_token(self, index: int) -> str:
        return self.decoder.get(index, str(self.unk_token))

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        data = bytearray(self.byte_decoder[c] for token in tokens for c in token if c in self.byte_decoder)
        return data.decode("utf-8", errors="replace")

    def apply_chat_template(self, conversation: Any, tools: Any = None, **kwargs: Any) -> Any:  # type: ignore[override]
        tools, declaration = kimi_template_inputs(tools)
        kwargs.setdefault("thinking", True)
        return super().apply_chat_template(conversation, tools=tools, **{**kwargs, **declaration})

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, ...]:
        prefix = f"{filename_prefix}-" if filename_prefix else ""
        vocab = os.path.join(save_directory, prefix + VOCAB_FILES_NAMES["vocab_file"])
        merges = os.path.join(save_directory, prefix + VOCAB_FILES_NAMES["merges_file"])
        with open(vocab, "w", encoding="utf-8") as f:
            json.dump(self.encoder, f, ensure_ascii=False)
        with open(merges, "w", encoding="utf-8") as f:
            f.writelines(f"{a} {b}\n" for a, b in sorted(self.bpe_ranks, key=self.bpe_ranks.__getitem__))
        return vocab, merges


def _write_directory(target: Path) -> None:
    from regen.tokenizers.kimi_mini import (
        NON_SPECIAL,
        SPLIT_PATTERN,
        TOKENIZER_SETTINGS,
        chat_template,
        copy_tool_declaration,
        ensure_mini_tokenizer,
    )

    fast = json.loads((ensure_mini_tokenizer() / "tokenizer.json").read_text(encoding="utf-8"))
    (target / "vocab.json").write_text(json.dumps(fast["model"]["vocab"], ensure_ascii=False), encoding="utf-8")
    merges = [m if isinstance(m, str) else " ".join(m) for m in fast["model"]["merges"]]
    (target / "merges.txt").write_text("".join(f"{m}\n" for m in merges), encoding="utf-8")
    added = {
        t["id"]: AddedToken(t["content"], special=t["content"] not in NON_SPECIAL, normalized=False)
        for t in fast["added_tokens"]
    }
    tokenizer = SlowKimiMiniTokenizer(
        str(target / "vocab.json"),
        str(target / "merges.txt"),
        split_pattern=SPLIT_PATTERN,
        added_tokens_decoder=added,
        **TOKENIZER_SETTINGS,
    )
    tokenizer.chat_template = chat_template()
    tokenizer.save_pretrained(str(target))
    config_path = target / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["auto_map"] = {"AutoTokenizer": [f"{REMOTE_MODULE}.{SlowKimiMiniTokenizer.__name__}", None]}
    config_path.write_text(json.dumps(config, indent=1, ensure_ascii=False), encoding="utf-8")
    shutil.copyfile(__file__, target / f"{REMOTE_MODULE}.py")
    copy_tool_declaration(target)


def ensure_slow_tokenizer() -> Path:
    """A directory that `AutoTokenizer.from_pretrained(path, trust_remote_code=True)` loads as the slow tokenizer;
    built once into the asset cache, beside the mini tokenizer it is derived from."""
    import hashlib

    from regen.tokenizers.kimi_mini import build_once, cache_root, ensure_mini_tokenizer

    digest = hashlib.sha256(Path(__file__).read_bytes() + ensure_mini_tokenizer().name.encode()).hexdigest()[:12]
    return build_once(cache_root() / f"kimi-k2.5-mini-slow-{digest}", "tokenizer_config.json", _write_directory)
