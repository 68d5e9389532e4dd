"""The library never imports Airflow: it runs, is tested and benchmarked without it."""

from __future__ import annotations

import subprocess
import sys

BLOCK_AIRFLOW = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "airflow" or name.startswith("airflow."):
            raise ImportError(f"the library imported {name}")
sys.meta_path.insert(0, Block())
import pkgutil, regen
from regen.tokenizers.loading import restore_transformers4_imports
restore_transformers4_imports()  # regen.tokenizers.tiktoken_kimi is remote code written against transformers 4
for module in pkgutil.walk_packages(regen.__path__, "regen."):
    if not module.name.endswith("__main__"):
        __import__(module.name)
print("ok")
"""


def test_library_imports_without_airflow() -> None:
    result = subprocess.run([sys.executable, "-c", BLOCK_AIRFLOW], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
