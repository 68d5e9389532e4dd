"""A benchmark's figures kept besides its output: `--report PATH` writes them there as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def save(path: Path | None, figures: dict[str, Any]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures, indent=1, default=str))
    print(f"report: {path}")
