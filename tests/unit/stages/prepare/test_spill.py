"""The rows waiting to be dealt longest first: out in `longest_first_order`'s order (the one generate shares), each
as it went in, and the file removed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from regen.records import longest_first_order
from regen.stages.prepare.spill import LongestFirstSpill, longest_first_positions

INT32 = st.integers(-(2**31), 2**31 - 1)


@given(st.lists(st.one_of(st.none(), st.integers(0, 6), INT32), max_size=60))
def test_the_order_is_longest_first_order(expected: list[int | None]) -> None:
    """Ties (small lengths repeat), unknown lengths at the median, none known, and int32's ends."""
    lengths = np.array([0 if n is None else n for n in expected], dtype=np.intc)
    known = np.array([n is not None for n in expected], dtype=np.bool_)
    assert longest_first_positions(lengths, known).tolist() == longest_first_order(expected)


def test_rows_come_back_as_they_went_in_a_shard_at_a_time(tmp_path: Path) -> None:
    spill = LongestFirstSpill(tmp_path)
    rows = [
        {"id": "a", "messages": "[]", "prompt_ids": [1, 2, 3], "temperature": None, "expected_tokens": 5},
        {"id": "b", "messages": '["é"]', "prompt_ids": np.array([2**31 - 1], np.int32), "temperature": 0.7},
        {"id": "c", "messages": "", "prompt_ids": [], "temperature": 1e-300, "expected_tokens": 9},
    ]
    for row, expected in zip(rows, [5, None, 9], strict=True):
        spill.add(row, expected)
    assert len(spill) == 3 and spill.path is not None and spill.path.parent == tmp_path
    dealt = list(spill.dealt(2))
    assert [[row["id"] for row in shard] for shard in dealt] == [["b", "c"], ["a"]]  # b: unknown, the median (9)
    back = {row["id"]: row for shard in dealt for row in shard}
    for row in rows:
        assert back[row["id"]]["prompt_ids"].dtype == np.int32
        assert {**back[row["id"]], "prompt_ids": back[row["id"]]["prompt_ids"].tolist()} == {
            **row,
            "prompt_ids": list(row["prompt_ids"]),
        }
    spill.close()
    assert list(tmp_path.iterdir()) == [] and len(spill) == 0 and list(spill.dealt(2)) == []
