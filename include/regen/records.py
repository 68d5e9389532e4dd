"""The records that move between stages, and their files: raw answers (zstd JSON Lines) and training records.

A raw answer keeps what the server sent for one sample, exactly, minus the prompt ids (prompts/ has them): a raw file
that repeated them would be larger than the training data. Raw files are streamed both ways, never held whole.
msgspec decodes each line into a typed struct, so a token id that is not an integer fails the decode.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import zstandard

from regen.storage import Storage


class RawAnswer(msgspec.Struct, frozen=True):
    id: str  # the sample id
    output_ids: list[int]
    meta_info: dict[str, Any]
    text: str | None = None  # None when the server runs without a tokenizer
    rid: str = ""
    endpoint: str = ""
    attempts: int = 1

    @property
    def finish_reason(self) -> dict[str, Any]:
        reason = self.meta_info.get("finish_reason")
        return reason if isinstance(reason, dict) else {}

    @property
    def truncated(self) -> bool:
        return self.finish_reason.get("type") == "length"


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(RawAnswer)


def encode_answer(answer: RawAnswer) -> bytes:
    return _encoder.encode(answer)


def decode_answer(line: bytes | str) -> RawAnswer:
    return _decoder.decode(line)


def write_raw(path: Path, lines: Iterable[bytes]) -> None:
    """One JSON line per answer, zstd-compressed as it is written."""
    with path.open("wb") as f, zstandard.ZstdCompressor(level=3).stream_writer(f) as out:
        for line in lines:
            out.write(line)
            out.write(b"\n")


def read_raw(storage: Storage, key: str, workdir: Path) -> Iterator[RawAnswer]:
    """Answers of one raw file in order, streamed from a local copy."""
    path = workdir / "raw.jsonl.zst"
    storage.get_file(key, path)
    return iter_raw_file(path)


def iter_raw_file(path: Path) -> Iterator[RawAnswer]:
    with path.open("rb") as f, zstandard.ZstdDecompressor().stream_reader(f) as reader:
        for line in io.BufferedReader(reader, buffer_size=1 << 20):
            yield decode_answer(line)


def build_training_record(prompt_ids: list[int], output_ids: list[int]) -> tuple[list[int], list[int]]:
    """The one rule: the sequence is prompt_ids + output_ids untouched, the mask is the generation boundary."""
    return [*prompt_ids, *output_ids], [0] * len(prompt_ids) + [1] * len(output_ids)


class ShardPrompts:
    """A shard's prompts table, indexed by sample id; prompt ids are served as numpy views of one flat buffer."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self.ids: list[str] = table.column("id").to_pylist()
        self.row_of = {sample_id: row for row, sample_id in enumerate(self.ids)}
        prompt_ids = table.column("prompt_ids").combine_chunks()
        self._offsets = prompt_ids.offsets.to_numpy()
        self._values = prompt_ids.values.to_numpy()
        self._tools = table.column("tools").to_pylist()

    def prompt_ids(self, sample_id: str) -> np.ndarray:
        row = self.row_of[sample_id]
        return self._values[self._offsets[row] : self._offsets[row + 1]]

    def tools_json(self, sample_id: str) -> str:
        return str(self._tools[self.row_of[sample_id]] or "")
