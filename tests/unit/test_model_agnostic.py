"""Nothing about Kimi-K2.5 is written into the code outside its profiles (regen/chat.py) and the tokenizer builders
(regen/tokenizers/): no string or number constant in the library, the DAGs, the plugins, the tools or the benchmarks
names one of its special tokens, their ids, its call-id format or its tool-declaration header. Docstrings and
comments may use them as examples; code takes them from a profile."""

from __future__ import annotations

import ast
from pathlib import Path

from regen.tokenizers.kimi_mini import BPE_RANKS, NAMED_SPECIAL_TOKENS, VOCAB_SIZE

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ["include/regen", "plugins", "dags", "tools", "bench"]
ALLOWED = ["include/regen/chat.py", "include/regen/tokenizers/"]  # the built-in profiles, the tokenizers' builders
KIMI_STRINGS = [*NAMED_SPECIAL_TOKENS.values(), "functions.{name}:{index}", "tool_declare"]
KIMI_IDS = range(BPE_RANKS, VOCAB_SIZE)


def docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def kimi_constants(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip, found = docstrings(tree), []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or id(node) in skip:
            continue
        value = node.value
        if isinstance(value, str) and any(token in value for token in KIMI_STRINGS):
            found.append(f"{path}:{node.lineno}: {value[:60]!r}")
        elif isinstance(value, int) and not isinstance(value, bool) and value in KIMI_IDS:
            found.append(f"{path}:{node.lineno}: {value}")
    return found


def test_no_kimi_token_is_written_into_code_outside_its_profile() -> None:
    files = [p for folder in SCANNED for p in sorted((ROOT / folder).rglob("*.py"))]
    checked = [p for p in files if not any(str(p.relative_to(ROOT)).startswith(a) for a in ALLOWED)]
    assert len(checked) > 30  # the scan found the code it is meant to read
    found = [line for path in checked for line in kimi_constants(path)]
    assert not found, "\n".join(found)


def test_the_scan_sees_a_kimi_token_where_there_is_one(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text('"""Mentions <|im_end|> in a docstring: allowed."""\nSTOP = [163586]\nOPEN = "<|im_user|>"\n')
    assert sorted(line.split(": ", 1)[1] for line in kimi_constants(planted)) == ["'<|im_user|>'", "163586"]
