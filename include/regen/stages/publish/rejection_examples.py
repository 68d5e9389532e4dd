"""The report's rejections: each reason a stage rejected rows for, its count, and the first rejected row as an
example, read from the version's rejected/ files (streamed, and only until every reason has its example)."""

from __future__ import annotations

import io
import json
from typing import Any

from regen.storage import Storage

DETAIL_CHARS = 200  # of an example's detail, in the report


def rejection_examples(storage: Storage, keys: list[str], counts: dict[tuple[str, str], int]) -> list[dict[str, Any]]:
    """`counts`: rows rejected by (stage, reason), from the stages' stats; `keys`: the version's rejected/ files."""
    examples: dict[tuple[str, str], dict[str, Any]] = {}
    for key in sorted(keys):
        if len(examples) == len(counts):
            break
        with storage.open(key) as raw:
            for line in io.TextIOWrapper(raw, encoding="utf-8"):
                record = json.loads(line)
                where = (record.get("stage", ""), record.get("reason", ""))
                if where in counts and where not in examples:
                    examples[where] = record
    return [
        {"stage": stage, "reason": reason, "count": count, **_example(examples.get((stage, reason)))}
        for (stage, reason), count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    ]


def _example(record: dict[str, Any] | None) -> dict[str, Any]:
    if record is None:
        return {}
    where = f"{record['source']}:{record['source_index']}" if "source_index" in record else None
    detail = str(record.get("detail") or "")
    clipped = detail if len(detail) <= DETAIL_CHARS else detail[:DETAIL_CHARS] + "..."
    return {"example": record.get("id") or where, "source": where, "detail": clipped}
