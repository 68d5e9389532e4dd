"""One list of reasons: the enum every stage counts and writes, and the table in docs/data.md, kept equal."""

from __future__ import annotations

import re
from pathlib import Path

from regen.reasons import TRUNCATED, Reason

PAGE = Path(__file__).resolve().parents[2] / "docs" / "data.md"


def test_the_data_page_lists_every_reason_under_its_stage() -> None:
    text = PAGE.read_text(encoding="utf-8")
    table = text.split("<!-- reasons -->", 1)[1].split("<!-- /reasons -->", 1)[0]
    listed = {
        row.split("|")[1].strip(): re.findall(r"`([a-z0-9_]+)`", row.split("|")[2])
        for row in table.strip().splitlines()[2:]
    }
    by_stage: dict[str, list[str]] = {}
    for reason in Reason:
        by_stage.setdefault(reason.stage, []).append(reason.value)
    assert listed == by_stage


def test_truncations_are_validate_reasons() -> None:
    assert {r.stage for r in TRUNCATED} == {"validate"}
