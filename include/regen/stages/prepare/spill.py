"""Prompt rows waiting to be dealt longest first, on local disk: the order needs every row's answer length, so
ShardWriter cannot write a shard before the last row, and holding the rows in memory until then made a task's memory
grow with its rows (about 11.8 KB a row at 1,000-token prompts: 11.8 GB at a limit of 10^6 prompts).

Each row goes to an append-only local file as it comes (msgpack, its prompt ids as raw int32, a zstd frame: a
third of the bytes of real token ids on local disk for some 30 us a row); memory keeps, a row, where it starts in
the file (8 bytes) and its expected answer length (4 bytes and a known flag): 28 bytes a row at most, with the sort
(bench/bench_prepare.py writer). At the end the order is computed on those arrays and the rows are read back a shard
at a time with plain reads. Not a memory map: read at random (the order scatters a shard's rows over the whole
file), a mapping of it on a kernel that keeps large page-cache folios brought most of the file into the task's RSS
for a single shard.

The file (GBs at 10^6 rows) is in its prepare's scratch folder; a task killed without its `finally` (OOM) leaves both,
named by its pid and no longer locked, and the next prepare on the machine removes them (`remove_abandoned_spills`).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import numpy as np
import zstandard

from regen.scratch import remove_abandoned, scratch_prefix

# A prepare's scratch (regen.scratch): its folder, a part's, and a spill file made outside them.
SCRATCH_KINDS = ("prepare", "part", "longest-first")
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(dict[str, Any])


class LongestFirstSpill:
    """Rows in, with their expected answer lengths; out (`dealt`) longest first, as many at a time as a shard
    holds. The file is made at the first row, in `directory` (None: the system's temporary folder), and removed by
    `close`, which a caller calls however it ends."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory
        self.path: Path | None = None
        self._file: BinaryIO | None = None
        self._starts = array("q")  # where each row starts in the file
        self._lengths = array("i")  # its expected answer tokens (0 where not known)
        self._known = bytearray()  # 1 where its length is known
        self._end = 0
        self._compress = zstandard.ZstdCompressor(level=1).compress
        self._decompress = zstandard.ZstdDecompressor().decompress

    def __len__(self) -> int:
        return len(self._starts)

    def add(self, row: dict[str, Any], expected_tokens: int | None) -> None:
        """A row of PROMPT_SCHEMA's columns (its `prompt_ids` a list or an int32 array), spilled to the file."""
        ids = np.asarray(row["prompt_ids"], dtype=np.int32).tobytes()
        blob = self._compress(_encoder.encode({**row, "prompt_ids": ids}))
        file = self._file if self._file is not None else self._open()
        file.write(blob)
        self._starts.append(self._end)
        self._lengths.append(0 if expected_tokens is None else expected_tokens)
        self._known.append(expected_tokens is not None)
        self._end += len(blob)

    def dealt(self, size: int) -> Iterator[list[dict[str, Any]]]:
        """Every row, longest first (`longest_first_positions`), `size` at a time; each row as it was added, its
        prompt ids an int32 array."""
        if self._file is None:
            return
        self._file.flush()
        lengths = np.frombuffer(self._lengths, dtype=np.intc)
        order = longest_first_positions(lengths, np.frombuffer(self._known, dtype=np.bool_))
        del lengths  # a view of the array: it would pin it
        for start in range(0, len(order), size):
            yield self._read(order[start : start + size])

    def close(self) -> None:
        """The file closed and removed; the writer is empty again."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None
        self._starts, self._lengths, self._known, self._end = array("q"), array("i"), bytearray(), 0

    def _open(self) -> BinaryIO:
        prefix = scratch_prefix("longest-first")
        descriptor, name = tempfile.mkstemp(prefix=prefix, suffix=".msgpack.zst", dir=self.directory)
        fcntl.flock(descriptor, fcntl.LOCK_EX)  # held until closed, or until the process dies
        self.path = Path(name)
        self._file = os.fdopen(descriptor, "wb+", buffering=1 << 20)
        return self._file

    def _read(self, positions: np.ndarray) -> list[dict[str, Any]]:
        """The rows at `positions`, in that order, read forwards through the file."""
        if self._file is None:
            raise RuntimeError("rows read back after their spill file was closed")
        descriptor, count = self._file.fileno(), len(self._starts)
        rows: list[dict[str, Any]] = [{}] * len(positions)
        for at in np.argsort(positions, kind="stable").tolist():
            position = int(positions[at])
            start = self._starts[position]
            stop = self._starts[position + 1] if position + 1 < count else self._end
            blob = os.pread(descriptor, stop - start, start)
            if len(blob) != stop - start:
                raise OSError(f"{self.path}: row {position} read back {len(blob)} of its {stop - start} bytes")
            row = _decoder.decode(self._decompress(blob))
            row["prompt_ids"] = np.frombuffer(row["prompt_ids"], dtype=np.int32)
            rows[at] = row
        return rows


def remove_abandoned_spills(folder: Path | None = None) -> list[Path]:
    """What prepares killed on this machine left in `folder` (the system's temporary one): their scratch folders and
    spill files, whose processes are gone. Their paths."""
    return remove_abandoned(SCRATCH_KINDS, folder)


def longest_first_positions(lengths: np.ndarray, known: np.ndarray) -> np.ndarray:
    """`regen.records.longest_first_order` over arrays, the same order: by expected answer length, longest first;
    one of unknown length (`known` false) where the known lengths' median would be; equal lengths in the order
    given. (A stable sort on the negated lengths keeps equal ones in order, as Python's reverse sort does.)"""
    known_lengths = np.sort(lengths[known])
    median = int(known_lengths[len(known_lengths) // 2]) if len(known_lengths) else 0
    keys = np.where(known, lengths.astype(np.int64), np.int64(median))
    np.negative(keys, out=keys)
    return np.argsort(keys, kind="stable")
