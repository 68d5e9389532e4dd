"""Fixtures of the differential tests: SGLang's chat layer (the oracle) and the project's renderer over the same
tokenizer directory, a Kimi-K2.5-shaped one loaded as remote code on both sides, as production loads Kimi's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from regen.chat import ChatRenderer
from regen.profiles import lookup
from regen.tokenizers.kimi_mini import ensure_tiktoken_tokenizer
from tests.parity.oracle import Oracle, Served


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/parity/" in str(item.path):
            item.add_marker(pytest.mark.parity)


THINKING_OFF_SUFFIX = "<|im_assistant|>assistant<|im_middle|><think></think>"


@pytest.fixture(scope="session")
def kimi_served() -> Served:
    return Served(
        tokenizer=ensure_tiktoken_tokenizer(),
        tool_call_parser="kimi_k2",
        reasoning_parser="kimi_k2",
        model_type="kimi_k25",
        architecture="KimiK25ForConditionalGeneration",
        multimodal=True,  # K2.5 is a vision-language model: text requests reuse the chat layer's ids (checked)
        trust_remote_code=True,
    )


@pytest.fixture(scope="session")
def kimi_oracle(kimi_served: Served) -> Iterator[Oracle]:
    with Oracle(kimi_served) as oracle:
        yield oracle


@pytest.fixture(scope="session")
def kimi_renderers(kimi_served: Served) -> dict[bool, ChatRenderer]:
    """thinking -> the project's renderer for the same tokenizer directory, as a production profile names it."""
    base = lookup("kimi-k2.5-mini").replaced(
        name="kimi-parity",
        tokenizer=str(kimi_served.tokenizer),
        trust_remote_code=True,
        max_prompt_tokens=131_072,  # Kimi-K2.5's: the long-prompt cases must not stop at the mini profile's limit
    )
    off = base.replaced(
        name="kimi-parity-instant",
        chat_template_kwargs={"thinking": False},
        generation_suffix=THINKING_OFF_SUFFIX,
    )
    return {True: ChatRenderer(base), False: ChatRenderer(off)}


@pytest.fixture(scope="session")
def qwen_served() -> Served:
    from regen.tokenizers.qwen36 import ensure_qwen36_tokenizer

    return Served(
        tokenizer=ensure_qwen36_tokenizer(),
        tool_call_parser="qwen3_coder",
        reasoning_parser="qwen3",
        model_type="qwen3_5_moe",
        architecture="Qwen3_5MoeForConditionalGeneration",
        multimodal=True,
    )


@pytest.fixture(scope="session")
def qwen_oracle(qwen_served: Served) -> Iterator[Oracle]:
    with Oracle(qwen_served) as oracle:
        yield oracle


@pytest.fixture(scope="session")
def qwen_renderers() -> dict[bool, ChatRenderer]:
    """thinking -> the qwen3.6 profile of the project's config, with `enable_thinking` as asked."""
    from regen.config import load_config

    base = load_config().profile("qwen3.6")
    off = base.replaced(
        name="qwen3.6-instant",
        chat_template_kwargs={"enable_thinking": False},
        generation_suffix="<|im_start|>assistant\n<think>\n\n</think>\n\n",
    )
    return {True: ChatRenderer(base), False: ChatRenderer(off)}


@pytest.fixture(scope="session")
def deepseek_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The DeepSeek-style profile's tokenizer and template (tests/deepseek_style.py), DeepSeek's own token strings."""
    from tests.deepseek_style import deepseek_profile

    folder = tmp_path_factory.mktemp("deepseek")
    deepseek_profile(folder, "deepseek-parity", parser=True)
    return folder


@pytest.fixture(scope="session")
def deepseek_renderer(deepseek_folder: Path) -> ChatRenderer:
    """The project's renderer for a profile naming SGLang's deepseekv31 and deepseek-v3 parsers."""
    from regen.profiles import Profile
    from tests.deepseek_style import deepseek_profile

    declared = deepseek_profile(deepseek_folder, "deepseek-parity", parser=True)
    profile = Profile.model_validate({**declared, "name": "deepseek-parity"})
    return ChatRenderer(profile.with_paths(lambda p: str(deepseek_folder / p)))


@pytest.fixture(scope="session")
def deepseek_oracle(deepseek_folder: Path) -> Iterator[Oracle]:
    served = Served(
        tokenizer=deepseek_folder / "tokenizer",
        tool_call_parser="deepseekv31",
        reasoning_parser="deepseek-v3",
        model_type="deepseek_v3",
        architecture="DeepseekV3ForCausalLM",
    )
    with Oracle(served) as oracle:
        yield oracle
