"""Stream rows from dataset files, one at a time, so memory never grows with the dataset.

A line that is not valid UTF-8 or not valid JSON becomes a `BadRow`, counted and rejected downstream, never an
exception that stops the dataset.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class SourceRow:
    index: int  # position in the dataset's stream, over all its files
    source: str  # file and line, for people tracing a rejection
    value: Any


@dataclass(frozen=True)
class BadRow:
    index: int
    source: str
    reason: str
    detail: str


def expand_paths(patterns: list[str]) -> list[Path]:
    paths: list[Path] = []
    for pattern in patterns:
        if "://" in pattern:
            raise ValueError(f"{pattern}: remote dataset sources are not supported yet; use a local path")
        matches = sorted(glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else [pattern]
        if not matches or not all(Path(m).is_file() for m in matches):
            raise FileNotFoundError(f"dataset source {pattern!r} matches no file")
        paths.extend(Path(m) for m in matches)
    return paths


def iter_jsonl(paths: list[Path]) -> Iterator[SourceRow | BadRow]:
    index = 0
    for path in paths:
        with path.open("rb") as f:
            for line_number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                where = f"{path.name}:{line_number}"
                try:
                    yield SourceRow(index, where, json.loads(line.decode("utf-8")))
                except UnicodeDecodeError as e:
                    yield BadRow(index, where, "invalid_utf8", str(e))
                except json.JSONDecodeError as e:
                    yield BadRow(index, where, "malformed_json", str(e))
                index += 1
