"""The mini tokenizer has Kimi-K2.5's layout: size, special strings at their ids, and lossless byte-level BPE."""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from regen.chat import ChatRenderer
from regen.tokenizers import kimi_mini
from regen.tokenizers.fast_kimi import KimiMiniTokenizerFast, load_mini_tokenizer
from regen.tokenizers.slow_kimi import ensure_slow_tokenizer

KIMI_SPECIAL_IDS = {
    "[BOS]": 163584,
    "[EOS]": 163585,
    "<|im_end|>": 163586,
    "<|im_user|>": 163587,
    "<|im_assistant|>": 163588,
    "<|start_header_id|>": 163590,
    "<|end_header_id|>": 163591,
    "[EOT]": 163593,
    "<|im_system|>": 163594,
    "<|tool_calls_section_begin|>": 163595,
    "<|tool_calls_section_end|>": 163596,
    "<|tool_call_begin|>": 163597,
    "<|tool_call_argument_begin|>": 163598,
    "<|tool_call_end|>": 163599,
    "<|im_middle|>": 163601,
    "<|media_begin|>": 163602,
    "<|media_content|>": 163603,
    "<|media_end|>": 163604,
    "<|media_pad|>": 163605,
    "<think>": 163606,
    "</think>": 163607,
    "[UNK]": 163838,
    "[PAD]": 163839,
}


def test_vocabulary_size_matches_kimi(renderer: ChatRenderer) -> None:
    assert len(renderer.tokenizer) == 163_840


@pytest.mark.parametrize("token,token_id", KIMI_SPECIAL_IDS.items())
def test_special_tokens_have_kimis_ids(renderer: ChatRenderer, token: str, token_id: int) -> None:
    tok = renderer.tokenizer
    assert tok.convert_tokens_to_ids(token) == token_id
    assert tok.encode(token, add_special_tokens=False) == [token_id]
    assert tok.convert_ids_to_tokens(token_id) == token


def test_unnamed_slots_are_reserved_tokens(renderer: ChatRenderer) -> None:
    assert renderer.tokenizer.convert_ids_to_tokens(163589) == "<|reserved_token_5|>"
    assert renderer.tokenizer.convert_ids_to_tokens(163837) == "<|reserved_token_253|>"


def test_skip_special_tokens_keeps_the_models_content_tokens(renderer: ChatRenderer) -> None:
    tok = renderer.tokenizer
    ids = tok.encode("<think>r</think><|tool_calls_section_begin|>x<|tool_calls_section_end|><|im_end|>")
    assert tok.decode(ids, skip_special_tokens=True) == (
        "<think>r</think><|tool_calls_section_begin|>x<|tool_calls_section_end|>"
    )
    assert tok.decode(ids, skip_special_tokens=False).endswith("<|im_end|>")


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("def f(x):\n    return {'a': x ** 2}  # comment\n\t\r\n", id="code"),
        pytest.param("你好，世界！这是一个测试。", id="chinese"),
        pytest.param("emoji 😀👩‍💻 and combining é ñ", id="emoji"),
        pytest.param("   leading and trailing spaces   ", id="spaces"),
        pytest.param("\x00\x01 control bytes \x7f", id="control"),
    ],
)
def test_any_text_round_trips_losslessly(renderer: ChatRenderer, text: str) -> None:
    ids = renderer.tokenizer.encode(text, add_special_tokens=False)
    assert all(0 <= i < 163_584 for i in ids)
    assert renderer.tokenizer.decode(ids) == text


def test_build_is_deterministic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    digests = []
    for name in ("a", "b"):
        monkeypatch.setenv("REGEN_ASSET_CACHE", str(tmp_path / name))
        directory = kimi_mini.ensure_mini_tokenizer()
        digests.append(hashlib.sha256((directory / "tokenizer.json").read_bytes()).hexdigest())
        assert AutoTokenizer.from_pretrained(str(directory)).convert_tokens_to_ids("<think>") == 163606
        assert isinstance(load_mini_tokenizer(directory), KimiMiniTokenizerFast)
    assert digests[0] == digests[1]


def test_the_builtin_profile_loads_the_class_that_declares_tools_like_kimis(renderer: ChatRenderer) -> None:
    assert type(renderer.tokenizer) is KimiMiniTokenizerFast


def test_the_cache_name_covers_every_file_the_build_reads_or_copies() -> None:
    assert kimi_mini.BUILD_INPUTS == (
        "kimi_mini.py",
        "corpus.txt",
        "kimi_k25_chat_template.jinja",
        "tool_declaration_ts.py",
    )


def test_tokenizer_directories_mirror_kimis_layout(renderer: ChatRenderer) -> None:
    """Kimi's repository has `tokenization_kimi.py` (loaded by auto_map) beside `tool_declaration_ts.py`; the slow
    twin's directory has the same shape, and both directories carry the encoder, so its digest is recorded."""
    encoder = resources.files("regen.tokenizers").joinpath("tool_declaration_ts.py").read_bytes()
    fast, slow = Path(renderer.tokenizer.name_or_path), ensure_slow_tokenizer()
    assert (fast / "tool_declaration_ts.py").read_bytes() == (slow / "tool_declaration_ts.py").read_bytes() == encoder
    assert "tool_declaration_ts.py" in renderer.fingerprint()["tokenizer_files_sha256"]
    config = json.loads((slow / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["auto_map"]["AutoTokenizer"][0] == "tokenization_kimi_mini.SlowKimiMiniTokenizer"
    assert (slow / "tokenization_kimi_mini.py").is_file()


def test_no_pytorch_advice_in_a_process_that_loads_tokenizers_only() -> None:
    """transformers warns at import that PyTorch is missing; the pipeline never loads a model, so its tasks' logs
    carry no such line."""
    import subprocess
    import sys

    code = (
        "from regen.chat import ChatRenderer; from regen.profiles import lookup; ChatRenderer(lookup('kimi-k2.5-mini'))"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRANSFORMERS_NO_ADVISORY_WARNINGS"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "PyTorch was not found" not in done.stderr + done.stdout
