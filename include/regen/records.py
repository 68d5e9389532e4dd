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
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import zstandard

from regen.samples import sample_of, seed_of, turn_id, turn_of
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
    prompt_ids: list[int] | None = None  # the prompt sent, where prompts/ does not hold it (an on-policy turn)

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


class ShardPrompts:
    """A shard's prompts table, indexed by sample id; prompt ids are served as numpy views of one flat buffer.

    An answer id is a sample id, or an on-policy turn of one (regen.samples.turn_id): lookups by answer id find the
    sample's row, and an on-policy answer carries its own prompt (`prompt_of`)."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self.ids: list[str] = table.column("id").to_pylist()
        self.row_of = {sample_id: row for row, sample_id in enumerate(self.ids)}
        prompt_ids = table.column("prompt_ids").combine_chunks()
        self._offsets = prompt_ids.offsets.to_numpy()
        self._values = prompt_ids.values.to_numpy()
        names = table.column_names
        self._tools = table.column("tools").to_pylist() if "tools" in names else []
        self._temperature = table.column("temperature").to_pylist() if "temperature" in names else []
        self._seed = table.column("sampling_seed").to_pylist() if "sampling_seed" in names else []
        self._later = table.column("later").to_pylist() if "later" in names else []
        self._messages = table.column("messages").to_pylist() if "messages" in names else []
        self._expected = table.column("expected_tokens").to_pylist() if "expected_tokens" in names else []
        self._source_key = table.column("source_key").to_pylist() if "source_key" in names else []
        self._reference = table.column("reference_tokens").to_pylist() if "reference_tokens" in names else []
        self._turn_tokens = table.column("turn_tokens").to_pylist() if "turn_tokens" in names else []

    @property
    def on_policy(self) -> bool:
        return any(later is not None for later in self._later)

    def row(self, answer_id: str) -> int:
        row = self.row_of.get(answer_id)
        return row if row is not None else self.row_of[sample_of(answer_id)]

    def __contains__(self, answer_id: object) -> bool:
        return isinstance(answer_id, str) and (answer_id in self.row_of or sample_of(answer_id) in self.row_of)

    def prompt_ids(self, sample_id: str) -> np.ndarray:
        row = self.row_of[sample_id]
        return self._values[self._offsets[row] : self._offsets[row + 1]]

    def prompt_of(self, answer: RawAnswer) -> np.ndarray:
        """The prompt an answer was generated for: its own, or its sample's in prompts/."""
        if answer.prompt_ids is not None:
            return np.asarray(answer.prompt_ids, dtype=self._values.dtype)
        return self.prompt_ids(answer.id)

    def expected_tokens(self, answer_id: str) -> int | None:
        """The answer length prepare expected (the last version's, or the reference's); None: not known. Of an
        on-policy conversation (its sample id), its turns' together; of one of its turns, that turn's (turn_tokens)."""
        if answer_id not in self.row_of:
            return self.turn_tokens(answer_id)
        return self._expected[self.row_of[answer_id]] if self._expected else None

    def turn_tokens(self, answer_id: str) -> int | None:
        """An on-policy turn's expected answer length, as prepare recorded it: the last version's answer to the same
        turn, else the turn's reference answer in the target's tokens; None: neither."""
        turns = self._turn_tokens[self.row(answer_id)] if self._turn_tokens else None
        turn = turn_of(answer_id)
        return turns[turn - 1] if turns and turn is not None and 0 < turn <= len(turns) else None

    def reference_tokens(self, answer_id: str) -> int | None:
        """The row's reference answer, in the target's tokens (prepare counted it for a first version); None: none."""
        return self._reference[self.row(answer_id)] if self._reference else None

    def source_key(self, sample_id: str) -> str | None:
        """Its source prompt's digest (regen.holdout), as prepare recorded it; None: prepared before it was."""
        return self._source_key[self.row_of[sample_id]] if self._source_key else None

    def tools_json(self, answer_id: str) -> str:
        return str(self._tools[self.row(answer_id)] or "")

    def messages_json(self, sample_id: str) -> str:
        return str(self._messages[self.row_of[sample_id]])

    def later(self, sample_id: str) -> str | None:
        """The JSON of an on-policy conversation's messages after its first prompt; None for any other sample."""
        return self._later[self.row_of[sample_id]] if self._later else None

    def answer_ids(self, turns_of: Callable[[str], int]) -> list[str]:
        """Every answer the shard's samples need, in order: a sample's own, or each turn of an on-policy sample
        (`turns_of(later)`: how many turns its conversation has)."""
        ids = []
        for row, sample_id in enumerate(self.ids):
            later = self._later[row] if self._later else None
            if later is None:
                ids.append(sample_id)
            else:
                ids.extend(turn_id(sample_id, turn) for turn in range(1, turns_of(later) + 1))
        return ids

    def longest_expected_first(self, todo: list[str]) -> list[str]:
        """`todo` with the samples whose answers were longest in the dataset's last version first, so that the
        shard's last requests are short ones and the fleet stays full to its end (`longest_first_order`)."""
        if not self._expected:
            return todo
        return [todo[i] for i in longest_first_order([self._expected[self.row(a)] for a in todo])]

    def sampling(self, answer_id: str) -> dict[str, Any]:
        """The sample's own sampling over the run's: its temperature and seed, where it has them (regen.samples); each
        turn of an on-policy sample with a seed has its own, derived from the turn's id."""
        row = self.row(answer_id)
        own: dict[str, Any] = {}
        if self._temperature and self._temperature[row] is not None:
            own["temperature"] = self._temperature[row]
        if self._seed and self._seed[row] is not None:
            own["sampling_seed"] = self._seed[row] if answer_id in self.row_of else seed_of(answer_id)
        return own


def longest_first_order(expected: Sequence[int | None]) -> list[int]:
    """Positions by expected answer length, longest first: one of unknown length (a prompt new since the last
    version) where the known lengths' median would be, equal lengths in the order given, and all in the order given
    when none is known (a first version)."""
    known = sorted(n for n in expected if n is not None)
    median = known[len(known) // 2] if known else 0

    def length(i: int) -> int:
        n = expected[i]
        return median if n is None else n

    return sorted(range(len(expected)), key=length, reverse=True)


# absent from prompts prepared before they existed
OPTIONAL_COLUMNS = (
    "temperature",
    "sampling_seed",
    "later",
    "expected_tokens",
    "source_key",
    "reference_tokens",
    "turn_tokens",
)


def read_prompts(storage: Storage, key: str, columns: list[str], sides: bool = False) -> ShardPrompts:
    """A shard's prompts with `columns`, and its samples' own sampling and on-policy conversations where the file
    has them. `sides`: with what decides each sample's side of the held-out split (regen.holdout.side_of): its
    source key, or for prompts prepared before keys were recorded, its messages and tools."""
    prompts = ShardPrompts(read_table(storage, key, columns, optional=OPTIONAL_COLUMNS))
    # No key, or a null one (a part tokenized before keys, in a version finished after: its shard has the column)
    if sides and prompts.ids and (not prompts._source_key or None in prompts._source_key):
        return ShardPrompts(read_table(storage, key, [*columns, "messages", "tools"], optional=OPTIONAL_COLUMNS))
    return prompts
