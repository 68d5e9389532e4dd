"""Profiles are data in the deployment's config: declared there, checked against their tokenizer when loaded, and every
bad field fails with the profile's name, the field and what is wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from regen.chat import ChatRenderer
from regen.config import ConfigError, RegenConfig, load_config
from regen.tokenizers.kimi_mini import ensure_mini_tokenizer

# A user's own model, as a deployment would declare it: a tokenizer directory (tokenizer.json, tokenizer_config.json)
# and a chat template file of its own. The template is ChatML-shaped over the mini vocabulary's special tokens.
USER_TEMPLATE = (
    "{% for m in messages %}<|im_system|>{{ m['role'] }}<|im_middle|>{{ m['content'] }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>{% endif %}"
)
USER_PROFILE: dict[str, Any] = {
    "tokenizer": "tokenizer",  # relative to the config file, like dataset paths
    "chat_template": "chat_template.jinja",
    "generation_suffix": "<|im_assistant|>assistant<|im_middle|>",
    "eos_tokens": ["<|im_end|>"],
    "role_tokens": ["<|im_system|>", "<|im_assistant|>"],
    "max_prompt_tokens": 4096,
    "served_model_names": ["my-model"],
}


def deployment(tmp_path: Path, **profile_changes: Any) -> Path:
    """A config file declaring the profile `my-model`, beside its tokenizer directory and template file."""
    tokenizer = tmp_path / "tokenizer"
    if not tokenizer.exists():
        tokenizer.mkdir()
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (tokenizer / name).write_bytes((ensure_mini_tokenizer() / name).read_bytes())
        (tmp_path / "chat_template.jinja").write_text(USER_TEMPLATE)
    profile = {**USER_PROFILE, **profile_changes}
    config = {
        "defaults": {"profile": "my-model"},
        "datasets": {"d": {"paths": ["rows.jsonl"]}},
        "profiles": {"my-model": {k: v for k, v in profile.items() if v is not None}},
    }
    path = tmp_path / "regen.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def renderer(config: RegenConfig, name: str = "my-model") -> ChatRenderer:
    return ChatRenderer(config.profile(name))


def test_a_declared_profile_loads_with_its_own_template_and_roles(tmp_path: Path) -> None:
    config = load_config(deployment(tmp_path))
    assert config.profile_names == ["kimi-k2.5", "kimi-k2.5-mini", "my-model"]
    chat = renderer(config)
    text = chat.render_text([{"role": "user", "content": "Hi"}], None)
    assert text == "<|im_system|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|>"
    assert chat.roles.eos_ids == {163586} and chat.roles.reasoning_end is None and chat.roles.tool_calls is None
    assert chat.profile.tokenizer == str(tmp_path / "tokenizer")
    # The template file is what the manifests' fingerprint hashes, not the tokenizer's own template.
    import hashlib

    assert chat.fingerprint()["chat_template_sha256"] == hashlib.sha256(USER_TEMPLATE.encode()).hexdigest()
    assert chat.tokenizer.chat_template != USER_TEMPLATE  # the shared, loaded tokenizer was left alone


@pytest.mark.parametrize(
    "changes,message",
    [
        pytest.param(
            {"eos_tokens": ["<|not_a_token|>"]},
            r"profile 'my-model': eos_tokens: '<\|not_a_token\|>' is not one token of the tokenizer's vocabulary",
            id="unknown-token",
        ),
        pytest.param(
            {"role_tokens": ["<|im_system|>", "assistant turn"]},
            r"profile 'my-model': role_tokens: 'assistant turn' is not one token .* \(it encodes to [2-9] ids",
            id="several-ids",
        ),
        pytest.param(
            {"generation_suffix": "<|im_assistant|>assistant<|im_middle|><think>"},
            r"profile 'my-model': generation_suffix .* is not what the chat template appends for "
            r"add_generation_prompt=True: '<\|im_assistant\|>assistant<\|im_middle\|>'",
            id="suffix-not-rendered",
        ),
        pytest.param(
            {
                "tool_calls": {
                    "format": "sections",
                    "section_begin": "<|tool_calls_section_begin|>",
                    "section_end": "<|tool_calls_section_end|>",
                    "call_begin": "<|tool_call_begin|>",
                    "argument_begin": "<|tool_call_argument_begin|>",
                    "call_end": "<|call_ends_here|>",
                    "call_id_format": "functions.{name}:{index}",
                }
            },
            r"profile 'my-model': tool_calls.call_end: '<\|call_ends_here\|>' is not one token",
            id="missing-grammar-token",
        ),
        pytest.param(
            {
                "tool_calls": {
                    "format": "tagged_json",
                    "call_begin": "<|tool_call_begin|>",
                    "call_end": "<tool_call_end>",
                }
            },
            r"profile 'my-model': tool_calls.call_end: '<tool_call_end>' is not one token",
            id="tagged-grammar-token-unknown",
        ),
        pytest.param(
            {"chat_template": "no-such-template.jinja"},
            r"profile 'my-model': chat_template: cannot read .*no-such-template.jinja",
            id="template-file-missing",
        ),
    ],
)
def test_every_bad_field_names_the_profile_and_the_field(tmp_path: Path, changes: dict[str, Any], message: str) -> None:
    config = load_config(deployment(tmp_path, **changes))
    with pytest.raises((ConfigError, ValueError), match=message):
        renderer(config)


@pytest.mark.parametrize(
    "profiles,message",
    [
        pytest.param({"kimi-k2.5": USER_PROFILE}, r"profile 'kimi-k2.5' is built in", id="shadows-a-builtin"),
        pytest.param({"My Model": USER_PROFILE}, r"profile name 'My Model'", id="unsafe-name"),
        pytest.param(
            {"my-model": {**USER_PROFILE, "eos_token": "x"}},
            "profiles.my-model.eos_token: not a field here; did you mean .eos_tokens.",
            id="typo",
        ),
        pytest.param({"my-model": {"tokenizer": "t"}}, r"generation_suffix: Field required", id="no-suffix"),
        pytest.param(
            {"my-model": {**USER_PROFILE, "reasoning_start": "<think>", "reasoning_end": None}},
            r"profiles.my-model: give both reasoning_start and reasoning_end, or neither",
            id="half-a-reasoning-pair",
        ),
        pytest.param(
            {"my-model": {**USER_PROFILE, "tool_calls": {"format": "pythonic", "call_begin": "[", "call_end": "]"}}},
            r"tool_calls: .*does not match any of the expected tags: 'sections', 'tagged_json', 'tagged_xml'",
            id="unknown-grammar-format",
        ),
        pytest.param(
            {"my-model": {**USER_PROFILE, "tool_calls": {"format": "sections", "call_begin": "a", "call_end": "b"}}},
            r"tool_calls\.sections\.section_begin: Field required",
            id="sections-without-section-tokens",
        ),
        pytest.param(
            {
                "my-model": {
                    **USER_PROFILE,
                    "tool_calls": {"format": "tagged_xml", "call_begin": "a", "call_end": "b", "argument_begin": "c"},
                }
            },
            r"tool_calls\.tagged_xml\.argument_begin: not a field here",
            id="tagged-with-a-section-token",
        ),
    ],
)
def test_a_bad_declaration_fails_when_the_config_loads(tmp_path: Path, profiles: dict[str, Any], message: str) -> None:
    path = tmp_path / "regen.yaml"
    config = {"defaults": {"profile": "kimi-k2.5-mini"}, "datasets": {"d": {"paths": ["x"]}}, "profiles": profiles}
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_the_default_profile_must_be_one_there_is(tmp_path: Path) -> None:
    path = tmp_path / "regen.yaml"
    path.write_text(yaml.safe_dump({"defaults": {"profile": "qwen9"}, "datasets": {"d": {"paths": ["x"]}}}))
    known = r"known: kimi-k2.5, kimi-k2.5-mini"
    with pytest.raises(ConfigError, match=rf"defaults.profile: unknown profile 'qwen9'; {known}"):
        load_config(path)


def test_plan_fails_in_seconds_on_a_declared_profile_whose_tokenizer_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from regen import pipeline

    path = deployment(tmp_path, tokenizer="/nonexistent/tokenizer-dir")
    monkeypatch.setenv("REGEN_CONFIG", str(path))
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"profile 'my-model': tokenizer '/nonexistent/tokenizer-dir' does not load"):
        pipeline.plan({}, "manual__1")
    assert time.monotonic() - started < 30
