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


def _killed_while_spilling(folder: Path) -> tuple[Path, Path]:
    """A prepare's process, SIGKILLed (as by the OOM killer) with a row spilled in its scratch folder and another
    spill file beside it (no folder given): both left behind, as its `finally` never ran."""
    import os
    import signal
    import tempfile

    from regen.scratch import scratch_folder

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the prepare's process
        try:
            tempfile.tempdir = str(folder)
            with scratch_folder("prepare") as scratch:
                inside, beside = LongestFirstSpill(scratch), LongestFirstSpill()
                for spill in (inside, beside):
                    spill.add({"id": "a", "prompt_ids": [1, 2]}, 3)
                os.write(write, f"{scratch}\n{beside.path}".encode())
                os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)
    os.close(write)
    with os.fdopen(read) as answer:
        scratch, beside = answer.read().splitlines()
    os.waitpid(pid, 0)
    return Path(scratch), Path(beside)


def test_what_a_killed_prepare_spilled_is_removed_by_the_next_and_a_live_one_s_is_kept(tmp_path: Path) -> None:
    """Removed: a scratch folder and a spill file whose process is gone. Kept: this live process's, one locked by a
    process of a pid this machine does not know (another pid namespace sharing the folder), and what is not named
    by a pid."""
    from regen.scratch import locked, scratch_folder
    from regen.stages.prepare.spill import remove_abandoned_spills

    scratch, beside = _killed_while_spilling(tmp_path)
    assert any(scratch.glob("regen-longest-first-*.msgpack.zst")) and beside.exists()
    elsewhere, unnamed = tmp_path / "regen-part-999999999-abc", tmp_path / "regen-prepare-unrelated"
    elsewhere.mkdir()
    unnamed.mkdir()
    with scratch_folder("prepare") as live, locked(elsewhere):
        spill = LongestFirstSpill(live)
        spill.add({"id": "b", "prompt_ids": [3]}, None)
        assert sorted(remove_abandoned_spills(tmp_path)) == sorted([scratch, beside])
        assert spill.path is not None and spill.path.exists() and elsewhere.exists() and unnamed.exists()
        assert not scratch.exists() and not beside.exists()
        spill.close()
    assert remove_abandoned_spills(tmp_path) == [elsewhere]  # its lock dropped: its process is gone
