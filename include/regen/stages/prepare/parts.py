"""A dataset prepared in parts: its one reader spools the prompts to tokenize into parts of whole shards
(`prompts/parts/part-*.parquet`, PART_SCHEMA) and writes the parts' index (PartsIndex); each part is tokenized into
its shards, numbered in advance, by a prepare_part task of its own; finish_parts records every part's shards as the
dataset's. A part's record and the index are the answer to a retry."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Self

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from regen.chat import ChatRenderer
from regen.config.datasets import DatasetConfig
from regen.errors import FinalError
from regen.holdout import source_key
from regen.layout import DatasetLocation
from regen.manifest import PreparedDataset, ShardManifest, StageStats
from regen.on_policy import dataset_turns
from regen.rejections import RejectionWriter
from regen.scratch import scratch_folder
from regen.stages.prepare.normalize import Conversation, reference_text
from regen.stages.prepare.reader import Origin, Tally, decontamination_record
from regen.stages.prepare.settings import PrepareSettings
from regen.stages.prepare.shards import PROMPT_FIELDS, PROMPT_SCHEMA, ShardWriter, record_prepared
from regen.stages.prepare.spill import remove_abandoned_spills
from regen.stages.prepare.tokenize import Rendered, render_ordered
from regen.storage import Storage, get_json, sha256_file

log = logging.getLogger(__name__)

# A prompt to tokenize, as a part holds it: a shard's columns but its ids and samples, with what the shard needs.
PART_SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        *(PROMPT_SCHEMA.field(name) for name in PROMPT_FIELDS),
        ("answers", pa.int64()),  # on-policy: the conversation's turns to regenerate; else 1
        # JSON {sample id: answer tokens} of the prompt's samples in the dataset's last version (PrepareSettings's
        # expected_tokens, read once by the dataset's prepare task); null: none known
        ("expected_tokens", pa.string()),
    ]
)
PART_BATCH = 4096  # prompts per Parquet row group of a part, and per read


class PartsNotPrepared(FinalError):
    """A part of a dataset prepared in parts has no record: its prepare_part task failed, and says why."""


@dataclass(frozen=True)
class PreparedParts:
    """A dataset read, deduplicated and waiting in `parts` parts for `prepare_part` (`prompts` in all)."""

    parts: int
    prompts: int


@dataclass(frozen=True)
class PartEntry:
    """A part in the index: its file and sha256, its prompts, the number of its first shard."""

    key: str
    sha256: str
    prompts: int
    first_shard: int


@dataclass(frozen=True)
class PartsIndex:
    """What the one reading of a dataset found (`prompts/parts/index.json`): its parts, its counts and rejection
    files, and what the record of the dataset needs once every part has its shards."""

    parts: tuple[PartEntry, ...]
    to_tokenize: int  # prompts passed on to the parts
    stats: StageStats  # the reader's: rows that gave no prompt, eval overlaps, duplicates
    rows_read: int
    duplicates: int
    decontamination: dict[str, Any]
    files: dict[str, str]
    shard_size: int
    profile: dict[str, Any]
    token_roles: dict[str, Any]
    inputs: dict[str, Any]
    run_id: str | None
    by_length: bool = False  # the parts' shards dealt longest first (PrepareSettings.by_length)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "stats": self.stats.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        renamed = {"to_tokenize": data["to_tokenise"]} if "to_tokenise" in data else {}  # as written before 2026-12
        return msgspec.convert({"decontamination": {}, **renamed, **data}, cls)  # decontamination: none before it

    @classmethod
    def read(cls, storage: Storage, location: DatasetLocation) -> Self:
        return cls.from_dict(get_json(storage, location.prepare_index))

    def write(self, storage: Storage, location: DatasetLocation) -> None:
        storage.put_bytes(location.prepare_index, json.dumps(self.to_dict(), indent=1).encode())


def prompt_row(
    origin: Origin,
    conversation: Conversation,
    on_policy: bool,
    expected_tokens: Mapping[str, int] | None = None,
    references: References | None = None,
) -> dict[str, Any]:
    """A prompt as a part holds it (PART_SCHEMA), before it is tokenized. `expected_tokens`: its samples' answer
    lengths in the last version; `references`: its reference answers' lengths (ShardWriter)."""
    references = references or References()
    return {
        "sample_id": conversation.sample_id,
        "source_index": origin.index,
        "source": origin.source,
        # Key order kept as rendered: re-rendering the stored columns gives the same prompt_ids.
        "messages": json.dumps(conversation.messages, ensure_ascii=False),
        "tools": json.dumps(conversation.tools, ensure_ascii=False),
        "source_key": source_key(conversation.messages, conversation.tools),  # its side of the held-out split
        "meta": json.dumps(conversation.meta, ensure_ascii=False, default=str),
        "later": json.dumps(conversation.later, ensure_ascii=False) if on_policy else None,
        "answers": answers_of(conversation, on_policy),
        "expected_tokens": json.dumps(expected_tokens) if expected_tokens else None,
        "reference_tokens": references.tokens,
        "turn_tokens": references.turns,
    }


def answers_of(conversation: Conversation, on_policy: bool) -> int:
    """The answers a prompt asks for, each of its samples: one, or an on-policy conversation's turns."""
    return len(dataset_turns(conversation.later)) if on_policy else 1


@dataclass(frozen=True)
class References:
    """A prompt's reference answer length in the target's tokens (None: none); of an on-policy conversation, each
    turn's (`turns`) and their sum, the chain of answers its turns wait on one after another."""

    tokens: int | None = None
    turns: list[int | None] | None = None


def references_of(renderer: ChatRenderer, shards: ShardWriter, conversation: Conversation) -> References:
    """A prompt's reference lengths, where they order its samples (ShardWriter); none where they do not."""
    if not shards.needs_reference(conversation.sample_id, answers_of(conversation, shards.on_policy)):
        return References()

    def tokens(text: str | None) -> int | None:
        return None if text is None else len(renderer.tokenizer.encode(text, add_special_tokens=False))

    if not shards.on_policy:
        return References(tokens(conversation.reference))
    turns = [tokens(reference_text(turn.recorded)) for turn in dataset_turns(conversation.later)]
    known = [n for n in turns if n is not None]
    return References(sum(known) if known else None, turns)


def part_expected_tokens(path: Path) -> dict[str, int]:
    """The answer lengths a part's prompts carry (`prompt_row`), by sample id: the part's own, not the dataset's."""
    if "expected_tokens" not in pq.read_schema(path).names:  # a part written before parts carried them
        return {}
    column = pq.read_table(path, columns=["expected_tokens"]).column("expected_tokens").to_pylist()
    return {sample: tokens for cell in column if cell for sample, tokens in json.loads(cell).items()}


class PartSpool:
    """Prompts to tokenize, in parts of `size` prompts, spooled to local Parquet files as they come (memory stays
    flat); each full part is uploaded once the next one starts (the last one by whoever leaves the dataset in
    parts), its local file then removed."""

    def __init__(self, directory: Path, size: int, storage: Storage, location: DatasetLocation) -> None:
        self.directory, self.size, self.storage, self.location = directory, size, storage, location
        self.counts: list[int] = []
        self.uploaded: dict[int, str] = {}  # part -> the sha256 of its file
        self._rows: list[dict[str, Any]] = []
        self._writer: pq.ParquetWriter | None = None

    def path(self, part: int) -> Path:
        return self.directory / f"part-{part:05d}.parquet"

    def upload(self, part: int) -> None:
        self.uploaded[part] = self.storage.put_file(self.location.prepare_part(part), self.path(part))
        self.path(part).unlink()

    def add(self, row: dict[str, Any]) -> None:
        if not self.counts or self.counts[-1] == self.size:
            self._close_part()
            if self.counts:
                self.upload(len(self.counts) - 1)
            self.counts.append(0)
            self._writer = pq.ParquetWriter(self.path(len(self.counts) - 1), PART_SCHEMA, compression="zstd")
        self._rows.append(row)
        self.counts[-1] += 1
        if len(self._rows) >= PART_BATCH:
            self._write()

    def _write(self) -> None:
        if self._rows and self._writer is not None:
            self._writer.write_table(pa.Table.from_pylist(self._rows, schema=PART_SCHEMA))
        self._rows = []

    def _close_part(self) -> None:
        self._write()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def close(self) -> None:
        self._close_part()


def leave_in_parts(
    spool: PartSpool,
    shards_per_part: int,
    tally: Tally,
    rejections: RejectionWriter,
    renderer: ChatRenderer,
    settings: PrepareSettings,
) -> PreparedParts:
    """A dataset read whole and left in its spooled parts for prepare_part tasks to share: the last part uploaded
    and the index written, which records what the dataset's record will need once every part has its shards."""
    last = len(spool.counts) - 1
    spool.upload(last)
    index = PartsIndex(
        parts=tuple(
            PartEntry(spool.location.prepare_part(part), spool.uploaded[part], count, part * shards_per_part)
            for part, count in enumerate(spool.counts)
        ),
        to_tokenize=tally.to_tokenize,
        stats=tally.stats,
        rows_read=tally.rows_read,
        duplicates=tally.duplicates,
        decontamination=decontamination_record(settings.decontamination, tally),
        files=rejections.upload(),
        shard_size=settings.shard_size,
        profile=renderer.record,
        token_roles=renderer.roles.as_record(),
        inputs=settings.inputs,
        run_id=settings.run_id,
        by_length=settings.by_length,
    )
    index.write(spool.storage, spool.location)
    tally.log(f"read into {len(index.parts)} parts")
    return PreparedParts(len(index.parts), tally.to_tokenize)


def part_rows(path: Path) -> Iterator[dict[str, Any]]:
    for batch in pq.ParquetFile(path).iter_batches(batch_size=PART_BATCH):
        yield from batch.to_pylist()


def tokenize_part(
    rows: Iterable[dict[str, Any]],
    renderer: ChatRenderer,
    workers: int,
    shards: ShardWriter,
    rejections: RejectionWriter,
) -> StageStats:
    """A part's prompts tokenized into its shards; what the template or the length limit refuses, rejected."""
    stats = StageStats()
    items = ((row, Conversation(json.loads(row["messages"]), json.loads(row["tools"]))) for row in rows)
    with closing(render_ordered(items, renderer, workers)) as rendered:
        for row, result in rendered:
            if isinstance(result, Rendered):
                stats.keep()
                shards.add(row, result.prompt_ids)
            else:
                stats.drop(result.reason)
                rejections.add(
                    row["sample_id"],
                    result.reason,
                    result.detail,
                    source_index=row["source_index"],
                    source=row["source"],
                )
    shards.flush()
    return stats


def part_layout(shard_size: int, samples: int, part_prompts: int) -> tuple[int, int]:
    """(prompts per part, shards per part): a part is whole shards of its prompts' samples, so each part's shard
    numbers are known before any part is tokenized (a part whose prompts were rejected leaves a gap after its last)."""
    prompts = max(1, max(1, part_prompts // shard_size) * shard_size // samples)
    return prompts, math.ceil(prompts * samples / shard_size)


def part_prompts_to_map(shard_size: int, datasets: list[tuple[int, int]], cap: int) -> int:
    """The least prepare_part_prompts whose parts, cut as part_layout cuts them (whole shards of samples a part),
    number at most `cap` over these datasets (each its prompts and samples a prompt); a dataset of one part is
    prepared whole and maps none."""

    def parts(shards: int) -> int:
        cuts = [part_layout(shard_size, samples, shards * shard_size)[0] for _, samples in datasets]
        counts = [-(-prompts // cut) for (prompts, _), cut in zip(datasets, cuts, strict=True)]
        return sum(n for n in counts if n > 1)

    low, high = 1, max(p for p, _ in datasets) * max(s for _, s in datasets)  # high: every dataset one part
    while low < high:  # parts(shards) only falls as a part holds more shards
        middle = (low + high) // 2
        low, high = (low, middle) if parts(middle) <= cap else (middle + 1, high)
    return low * shard_size


def prepare_part(
    config: DatasetConfig,
    location: DatasetLocation,
    storage: Storage,
    renderer: ChatRenderer,
    part: int,
    workers: int,
) -> dict[str, Any]:
    """One part of a dataset prepared in parts, tokenized into its shards (longest first by the answer lengths its
    prompts carry): its record (shards, stats, files), also stored beside it, where a retry finds it."""
    record_key = location.prepare_part(part, ".json")
    if storage.exists(record_key):
        return dict(get_json(storage, record_key))
    index = PartsIndex.read(storage, location)
    entry = index.parts[part]
    started = time.monotonic()
    remove_abandoned_spills()  # what killed prepares left on this machine's disk
    rejections = RejectionWriter(storage, location.prepare_part_rejections(part))
    with scratch_folder("part") as tmp, rejections:
        path = Path(tmp) / "part.parquet"
        storage.get_file(entry.key, path)
        if sha256_file(path) != entry.sha256:
            raise ValueError(f"{entry.key} does not read back as written (sha256 differs): run the task again")
        expected = part_expected_tokens(path)
        first, by_length = entry.first_shard, index.by_length
        with ShardWriter(location, storage, index.shard_size, config, first, expected, Path(tmp), by_length) as shards:
            stats = tokenize_part(part_rows(path), renderer, workers, shards, rejections)
        files = rejections.upload()
    record = {"part": part, "shards": [s.to_dict() for s in shards.shards], "stats": stats.to_dict(), "files": files}
    storage.put_bytes(record_key, json.dumps(record, indent=1).encode())
    log.info(
        "prepared %s part %d of %d: %d prompts kept in %d shards, dropped %s (%.1f s)",
        location.dataset,
        part,
        len(index.parts),
        stats.kept,
        len(shards.shards),
        stats.dropped_by_reason,
        time.monotonic() - started,
    )
    return record


def finish_parts(config: DatasetConfig, location: DatasetLocation, storage: Storage) -> PreparedDataset:
    """A dataset prepared in parts, recorded whole in `prompts/prepare.json` once every part has its shards; the
    parts themselves are deleted then. Raises PartsNotPrepared naming the parts that did not finish."""
    if storage.exists(location.prepared):
        prepared = PreparedDataset.from_dict(get_json(storage, location.prepared))
    else:
        index = PartsIndex.read(storage, location)
        records, missing = [], []
        for part in range(len(index.parts)):
            key = location.prepare_part(part, ".json")
            if storage.exists(key):
                records.append(get_json(storage, key))
            else:
                missing.append(part)
        if missing:
            raise PartsNotPrepared(
                f"{location.dataset}: parts {missing} of {len(index.parts)} were not tokenized (their prepare_part "
                "tasks failed and say why); clear them, and the dataset goes on from the parts that finished"
            )
        prepared = _prepared_from(location, index, records)
        record_prepared(storage, prepared, config, index.run_id)
        log.info("prepared %s from %d parts (%d shards)", location.dataset, len(records), len(prepared.shards))
    for leftover in storage.list_keys(location.prepare_parts_folder):  # also after a crash right after the record
        storage.delete(leftover)
    return prepared


def _prepared_from(location: DatasetLocation, index: PartsIndex, records: list[dict[str, Any]]) -> PreparedDataset:
    """The dataset as its parts' records and the reader's index give it."""
    files = dict(index.files)
    for record in records:
        files |= record["files"]
    return PreparedDataset(
        location=location,
        shards=[ShardManifest.from_dict(shard) for record in records for shard in record["shards"]],
        stats=StageStats.merged([index.stats, *(StageStats.from_dict(r["stats"]) for r in records)]),
        duplicates=index.duplicates,
        profile=index.profile,
        token_roles=index.token_roles,
        files=dict(sorted(files.items())),
        rows_read=index.rows_read,
        inputs=index.inputs,
        decontamination=index.decontamination,
    )
