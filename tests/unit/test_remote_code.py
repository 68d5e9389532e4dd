"""Kimi-K2.5's tokenizer is remote code (tiktoken, transformers-4 imports): it loads under the pinned transformers,
and when it cannot load, the message says what to install or pin. Each case runs in a fresh process, so that what
one import did (or blocked) cannot leak into another."""

from __future__ import annotations

import subprocess
import sys
import time

from regen.tokenizers.kimi_mini import ensure_tiktoken_tokenizer

LOAD = """
import sys
directory, mode = sys.argv[1], sys.argv[2]
if mode == "no-tiktoken":
    sys.modules["tiktoken"] = None  # as if it were not installed
from regen.chat import ChatRenderer
from regen.profiles import lookup
from regen.tokenizers.loading import why_tokenizer_fails
mini = lookup("kimi-k2.5-mini")
profile = mini.replaced(name="kimi-layout", tokenizer=directory, trust_remote_code=True)
if mode == "without-restoring-imports":
    from transformers import AutoTokenizer
    loader = lambda: AutoTokenizer.from_pretrained(directory, trust_remote_code=True)
else:
    loader = lambda: ChatRenderer(profile)
try:
    loader()
    print("loaded")
except Exception as e:
    print(why_tokenizer_fails(profile.tokenizer_source, e))
"""


def load(mode: str) -> tuple[str, float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", LOAD, str(ensure_tiktoken_tokenizer()), mode],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1], time.monotonic() - started


def test_it_loads_with_the_transformers4_imports_restored() -> None:
    assert load("as-in-production")[0] == "loaded"


def test_without_them_the_published_import_of_bytes_to_unicode_breaks() -> None:
    """Why regen.chat restores it: transformers 5 moved the function that Kimi's code imports from the GPT-2 module."""
    message, _ = load("without-restoring-imports")
    assert "an import in its code failed" in message and "bytes_to_unicode" in message
    assert "transformers release" in message


def test_without_tiktoken_the_message_names_it_and_how_to_install_it() -> None:
    message, seconds = load("no-tiktoken")
    assert "imports the module 'tiktoken', which is not installed" in message
    assert "pip install tiktoken" in message
    print(f"failed in {seconds:.1f} s, interpreter start included")
