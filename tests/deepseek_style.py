# ruff: noqa: RUF002, RUF003  (DeepSeek's token strings are fullwidth by design)
"""A DeepSeek-style model declared only as config, as a user adding one would: a tokenizer directory with DeepSeek's
own special tokens (added to the mini vocabulary), a chat template file in DeepSeek-V3.1's shape, and a `sections`
grammar whose call id is the function name (`call_id_format: "{name}"`), as DeepSeek's template writes calls:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{JSON}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

The token strings are those of SGLang 0.5.23's deepseekv31 detector (function_call/deepseekv31_detector.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
SECTION_BEGIN, SECTION_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, SEPARATOR, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
OUTPUT_BEGIN, OUTPUT_END = "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"
SPECIAL = (BOS, EOS, USER, ASSISTANT, SECTION_BEGIN, SECTION_END, CALL_BEGIN, SEPARATOR, CALL_END)
SPECIAL += (OUTPUT_BEGIN, OUTPUT_END)
MARKERS = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, SEPARATOR, CALL_END)

# DeepSeek-V3.1's layout: tools in the system prompt, a past call as the section above, a tool result between its
# output tokens, and the generation prompt `<｜Assistant｜><think>` (thinking) or `<｜Assistant｜></think>`.
TEMPLATE = (
    BOS + "{% if tools %}## Tools\n{{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] }}"
    "{% elif m['role'] == 'user' %}" + USER + "{{ m['content'] }}"
    "{% elif m['role'] == 'assistant' %}" + ASSISTANT + "</think>{{ m['content'] or '' }}"
    "{% if m.get('tool_calls') %}"
    + SECTION_BEGIN
    + "{% for c in m['tool_calls'] %}"
    + CALL_BEGIN
    + "{{ c['function']['name'] }}"
    + SEPARATOR
    + "{{ c['function']['arguments'] }}"
    + CALL_END
    + "{% endfor %}"
    + SECTION_END
    + "{% endif %}"
    + EOS
    + "{% elif m['role'] == 'tool' %}"
    + OUTPUT_BEGIN
    + "{{ m['content'] }}"
    + OUTPUT_END
    + "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}" + ASSISTANT + "{% if thinking %}<think>{% else %}</think>{% endif %}{% endif %}"
)


def write_tokenizer(directory: Path) -> Path:
    """The mini vocabulary with DeepSeek's special tokens added (each one id), as a plain tokenizer directory."""
    from tokenizers import AddedToken, Tokenizer

    from regen.tokenizers.kimi_mini import ensure_mini_tokenizer

    source = ensure_mini_tokenizer()
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tokenizer.save(str(directory / "tokenizer.json"))
    config = json.loads((source / "tokenizer_config.json").read_text())
    config.pop("added_tokens_decoder", None)
    config.update({"bos_token": BOS, "eos_token": EOS, "chat_template": TEMPLATE})
    (directory / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
    return directory


def deepseek_profile(folder: Path, served_name: str, parser: bool = False) -> dict[str, Any]:
    """The profile's declaration, its tokenizer and template written into `folder` (paths relative to it).
    `parser`: name SGLang's parsers (deepseekv31, deepseek-v3), else the declared grammar is the reading."""
    write_tokenizer(folder / "tokenizer")
    (folder / "template.jinja").write_text(TEMPLATE, encoding="utf-8")
    declared: dict[str, Any] = {
        "tokenizer": "tokenizer",
        "chat_template": "template.jinja",
        "chat_template_kwargs": {"thinking": True},
        "generation_suffix": ASSISTANT + "<think>",
        "reasoning_start": "<think>",
        "reasoning_end": "</think>",
        "eos_tokens": [EOS],
        "role_tokens": [BOS, USER, ASSISTANT],
        "tool_calls": {
            "format": "sections",
            "section_begin": SECTION_BEGIN,
            "section_end": SECTION_END,
            "call_begin": CALL_BEGIN,
            "argument_begin": SEPARATOR,
            "call_end": CALL_END,
            "call_id_format": "{name}",
        },
        "max_prompt_tokens": 8192,
        "served_model_names": [served_name],
    }
    if parser:
        declared.update(tool_call_parser="deepseekv31", reasoning_parser="deepseek-v3")
    return declared
