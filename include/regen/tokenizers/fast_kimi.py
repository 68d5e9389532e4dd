"""The mini tokenizer's class: a fast tokenizer that prepares a chat the way Kimi-K2.5's own tokenizer class does.

Kimi-K2.5's `tokenization_kimi.py` (remote code in the model's repository) overrides `apply_chat_template`: it sorts
the keys of `tools` at every depth, passes their TypeScript declaration to the template as `tools_ts_str` (omitted
when encoding fails) and always passes `thinking`, True unless the caller says otherwise. A template cannot do this
itself (Jinja has no TypeScript encoder), so a tokenizer built from a `tokenizer.json` and that template alone would
declare tools as JSON where Kimi declares TypeScript.

Why a class of its own, loaded by `regen.chat` for `builtin:kimi-k2.5-mini`, rather than remote code: the code is
the project's, imported like any module, type-checked and linted, with no `trust_remote_code` (which the profile
check forbids for builtin tokenizers) and no copy executed from a cache directory. The slow twin (slow_kimi.py)
exists to be loaded the way Kimi's is, through `auto_map`, so it carries the same override, through the same helper.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerFast

from regen.tokenizers.tool_declaration_ts import kimi_template_inputs


class KimiMiniTokenizerFast(PreTrainedTokenizerFast):
    def apply_chat_template(self, conversation: Any, tools: Any = None, **kwargs: Any) -> Any:  # type: ignore[override]
        tools, declaration = kimi_template_inputs(tools)
        kwargs.setdefault("thinking", True)
        return super().apply_chat_template(conversation, tools=tools, **{**kwargs, **declaration})


def load_mini_tokenizer(directory: Path | None = None) -> KimiMiniTokenizerFast:
    """The mini tokenizer from its (cached) build directory."""
    if directory is None:
        from regen.tokenizers.kimi_mini import ensure_mini_tokenizer

        directory = ensure_mini_tokenizer()
    return KimiMiniTokenizerFast.from_pretrained(str(directory))
