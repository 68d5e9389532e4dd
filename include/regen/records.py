"""The records that move between stages, and their files: raw answers (zstd JSON Lines) and training records.

A raw answer keeps what the server sent for one sample: its `output_ids` and `meta_info` exactly, and of its `text`
a digest. The prompt ids are not repeated (prompts/ has them), and the text is the decode of the ids whenever the
server is sound, which validate proves by comparing digests; kept whole, it alone doubled raw/. Raw files are
streamed both ways, never held whole; msgspec decodes each line into a typed struct, so a token id that is not an
integer fails the decode.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import zstandard

from regen.storage import Storage, read_table

REPLACEMENT = "\ufffd"  # what a detokenizer writes for an unfinished UTF-8 character


def text_digest(text: str | None) -> tuple[str | None, int]:
    """A server text as raw answers keep it: the blake2b-128 of the text without its trailing U+FFFD characters, and
    how many there were (SGLang's detokenizer may write one for a character a length cut left unfinished)."""
    if text is None:
        return None, 0
    body = text.rstrip(REPLACEMENT)
    return hashlib.blake2b(body.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest(), len(text) - len(body)


class RawAnswer(msgspec.Struct, frozen=True):
    id: str  # the sample id
    output_ids: list[int]
    meta_info: dict[str, Any]
    text_digest: str | None = None  # of the server's text (see text_digest); None: the server sent no text
    text_replacement_tail: int = 0
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
        self._tools = table.column("tools").to_pylist() if "tools" in table.column_names else []
        names = table.column_names
        self._temperature = table.column("temperature").to_pylist() if "temperature" in names else []
        self._seed = table.column("sampling_seed").to_pylist() if "sampling_seed" in names else []

    def prompt_ids(self, sample_id: str) -> np.ndarray:
        row = self.row_of[sample_id]
        return self._values[self._offsets[row] : self._offsets[row + 1]]

    def tools_json(self, sample_id: str) -> str:
        return str(self._tools[self.row_of[sample_id]] or "")

    def sampling(self, sample_id: str) -> dict[str, Any]:
        """The sample's own sampling over the run's: its temperature and seed, where it has them (regen.samples)."""
        row = self.row_of[sample_id]
        own: dict[str, Any] = {}
        if self._temperature and self._temperature[row] is not None:
            own["temperature"] = self._temperature[row]
        if self._seed and self._seed[row] is not None:
            own["sampling_seed"] = self._seed[row]
        return own


SAMPLING_COLUMNS = ("temperature", "sampling_seed")  # absent from prompts prepared before samples existed


def read_prompts(storage: Storage, key: str, columns: list[str]) -> ShardPrompts:
    """A shard's prompts with `columns`, and its samples' own sampling where the file has it."""
    return ShardPrompts(read_table(storage, key, columns, optional=SAMPLING_COLUMNS))
