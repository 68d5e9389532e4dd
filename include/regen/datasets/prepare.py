"""The prepare stage: a dataset source -> normalised, deduplicated, tokenised prompt shards in storage.

Every row read is accounted for: it becomes prompts (one per regenerated turn) or a rejection with its reason in
`rejected/prepare.jsonl`, and `total == kept + dropped` counts prompts (in the default `turns: final` mode, one per
row, so `total` is also the rows read; with `turns: on_policy`, one per conversation, whose turns generate counts).
Memory stays flat whatever the dataset size: rows stream in, the seen sample ids live in an SQLite table on local
disk, rejections stream to a file and prompts leave a shard at a time.

A dataset larger than one part (`part_prompts`, and no limit) is prepared in parts, so that several workers share
its tokenising: one task reads the source once, normalises and deduplicates every row (dedupe stays exact across
parts) and writes the prompts to tokenise in parts (`prompts/parts/`); each part is tokenised into shards by a task of
its own (`prepare_part`), its shard numbers fixed in advance; `finish_parts` records the shards of every part in
`prompts/prepare.json`. A dataset of one part is tokenised at once, by the task that read it. A run with a limit is
prepared whole: the limit counts prompts that tokenise, which only one reader in order can count.

Idempotent: once `prompts/prepare.json` exists for a dataset version, it is the answer, so a cleared or retried task
never reshards prompts that later stages already consumed; so is a part's record, and the parts' index.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from regen.chat import ChatRenderer
from regen.config_datasets import DatasetConfig
from regen.datasets.decontaminate import EvalOverlap, check_prompts
from regen.datasets.eval_suites import Decontamination
from regen.datasets.formats import normalise_row
from regen.datasets.normalise import Conversation, Rejection
from regen.datasets.sources import BadRow, SourceRow, iter_rows
from regen.datasets.tokenise import Rendered, available_cores, render_ordered
from regen.errors import FinalError
from regen.layout import DatasetLocation
from regen.manifest import PreparedDataset, ShardManifest, StageStats
from regen.on_policy import dataset_turns
from regen.reasons import Reason
from regen.rejections import RejectionWriter
from regen.samples import samples_of
from regen.storage import S3ClientFactory, Storage, sha256_file, write_table

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 15.0
PROMPT_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("source_index", pa.int64()),
        ("source", pa.string()),
        ("messages", pa.string()),
        ("tools", pa.string()),
        ("meta", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("temperature", pa.float64()),  # null: the run's temperature
        ("sampling_seed", pa.int64()),  # null: no seed sent
        ("later", pa.string()),  # on-policy: the conversation after the first turn's prompt (JSON); else null
    ]
)
# A prompt to tokenise, as a part holds it: a shard's columns but its ids and samples, with what the shard needs.
PART_SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        *(PROMPT_SCHEMA.field(name) for name in ("source_index", "source", "messages", "tools", "meta", "later")),
        ("answers", pa.int64()),  # on-policy: the conversation's turns to regenerate; else 1
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


@dataclass(frozen=True, slots=True)
class Origin:
    index: int  # the row's position in the dataset stream
    source: str
    sample_id: str | None  # None when the row gave no conversation


class _SeenIds:
    """Sample ids already kept or queued, in an SQLite table on local disk: a Python set would grow with the data."""

    def __init__(self, directory: Path) -> None:
        self._db = sqlite3.connect(directory / "seen.sqlite3")
        self._db.execute("PRAGMA journal_mode = OFF")
        self._db.execute("PRAGMA synchronous = OFF")
        self._db.execute("CREATE TABLE seen (id TEXT PRIMARY KEY) WITHOUT ROWID")

    def first(self, sample_id: str) -> bool:
        """True the first time an id is offered, False for every repeat."""
        return self._db.execute("INSERT OR IGNORE INTO seen (id) VALUES (?)", (sample_id,)).rowcount == 1

    def close(self) -> None:
        self._db.close()


def _prompt_row(origin: Origin, conversation: Conversation, on_policy: bool) -> dict[str, Any]:
    """A prompt as a part holds it (PART_SCHEMA), before it is tokenised."""
    return {
        "sample_id": conversation.sample_id,
        "source_index": origin.index,
        "source": origin.source,
        # Key order kept as rendered: re-rendering the stored columns gives the same prompt_ids.
        "messages": json.dumps(conversation.messages, ensure_ascii=False),
        "tools": json.dumps(conversation.tools, ensure_ascii=False),
        "meta": json.dumps(conversation.meta, ensure_ascii=False, default=str),
        "later": json.dumps(conversation.later, ensure_ascii=False) if on_policy else None,
        "answers": len(dataset_turns(conversation.later)) if on_policy else 1,
    }


class _ShardWriter:
    """Tokenised prompts -> shards of `shard_size` rows, numbered from `first_shard`."""

    def __init__(
        self, location: DatasetLocation, storage: Storage, shard_size: int, config: DatasetConfig, first_shard: int = 0
    ) -> None:
        self.location, self.storage, self.shard_size, self.first_shard = location, storage, shard_size, first_shard
        self.temperatures, self.per_prompt = config.temperatures, config.samples_per_prompt
        self.on_policy = config.turns == "on_policy"
        self.shards: list[ShardManifest] = []
        self._rows: list[dict[str, Any]] = []
        self._answers = 0  # on-policy: the turns of the shard's conversations

    def add(self, prompt: dict[str, Any], prompt_ids: list[int]) -> None:
        """One row per sample of the prompt (regen.samples); a prompt's samples may span two shards."""
        shared = {name: prompt[name] for name in ("source_index", "source", "messages", "tools", "meta", "later")}
        for sample in samples_of(prompt["sample_id"], self.temperatures, self.per_prompt):
            row = {"id": sample.id, **shared, "prompt_ids": prompt_ids}
            self._rows.append({**row, "temperature": sample.temperature, "sampling_seed": sample.seed})
            self._answers += prompt["answers"]
            if len(self._rows) >= self.shard_size:
                self.flush()

    def flush(self) -> None:
        if not self._rows:
            return
        number = self.first_shard + len(self.shards)
        key = self.location.shard(number).prompts
        digest = write_table(self.storage, key, pa.Table.from_pylist(self._rows, schema=PROMPT_SCHEMA))
        answers = self._answers if self.on_policy else None
        self.shards.append(ShardManifest(self.location, number, key, digest, len(self._rows), num_answers=answers))
        self._rows, self._answers = [], 0


class _PartSpool:
    """Prompts to tokenise, in parts of `size` prompts, spooled to local Parquet files as they come (memory stays
    flat); each full part is handed to `on_full` (which uploads it) once the next one starts."""

    def __init__(self, directory: Path, size: int, on_full: Callable[[int, Path], None]) -> None:
        self.directory, self.size, self.on_full = directory, size, on_full
        self.counts: list[int] = []
        self._rows: list[dict[str, Any]] = []
        self._writer: pq.ParquetWriter | None = None

    def path(self, part: int) -> Path:
        return self.directory / f"part-{part:05d}.parquet"

    def add(self, row: dict[str, Any]) -> None:
        if not self.counts or self.counts[-1] == self.size:
            self._close_part()
            if self.counts:
                self.on_full(len(self.counts) - 1, self.path(len(self.counts) - 1))
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


def _part_rows(path: Path) -> Iterator[dict[str, Any]]:
    for batch in pq.ParquetFile(path).iter_batches(batch_size=PART_BATCH):
        yield from batch.to_pylist()


def _tokenise_part(
    rows: Iterable[dict[str, Any]],
    renderer: ChatRenderer,
    workers: int,
    shards: _ShardWriter,
    rejections: RejectionWriter,
) -> StageStats:
    """A part's prompts tokenised into its shards; what the template or the length limit refuses, rejected."""
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


class _Tally:
    """The counts the manifest reports, with a progress line every few seconds."""

    def __init__(self, dataset: str) -> None:
        self.dataset = dataset
        self.stats = StageStats()
        self.rows_read = 0
        self.duplicates = 0
        self.to_tokenise = 0  # prepared in parts: prompts passed on to the parts, which count them kept or dropped
        self.by_suite: dict[str, int] = {}  # eval_overlap rejections per eval suite
        self._last_index = -1
        self._started = self._logged = time.monotonic()

    def count(self, origin: Origin, result: Rendered | Conversation | Rejection) -> None:
        if origin.index != self._last_index:  # a row's prompts arrive together, rows in order
            self.rows_read += 1
            self._last_index = origin.index
        if isinstance(result, Rendered):
            self.stats.keep()
        elif isinstance(result, Conversation):
            self.to_tokenise += 1
        else:
            self.stats.drop(result.reason)
            self.duplicates += result.reason == Reason.DUPLICATE
            if isinstance(result, EvalOverlap):
                self.by_suite[result.suite] = self.by_suite.get(result.suite, 0) + 1
        if time.monotonic() - self._logged >= PROGRESS_EVERY_S:
            self._logged = time.monotonic()
            self.log("preparing")

    def log(self, what: str) -> None:
        elapsed = time.monotonic() - self._started
        log.info(
            "%s %s: %d rows read, %d prompts kept, %d to tokenise in parts, %d duplicates, dropped %s (%.0f rows/s)",
            what,
            self.dataset,
            self.rows_read,
            self.stats.kept,
            self.to_tokenise,
            self.duplicates,
            dict(sorted(self.stats.dropped_by_reason.items())),
            self.rows_read / elapsed if elapsed else 0.0,
        )


def _candidates(
    rows: Iterable[SourceRow | BadRow],
    config: DatasetConfig,
    id_format: str,
    seen: _SeenIds,
    decontamination: Decontamination | None = None,
) -> Iterator[tuple[Origin, Conversation | Rejection]]:
    """Rows -> prompts to render, in order; rows that give none, prompts holding an eval item (before dedupe, so
    that each copy names its suite), and repeated prompts, as rejections."""
    for row in rows:
        if isinstance(row, BadRow):
            yield Origin(row.index, row.source, None), Rejection(row.reason, row.detail)
            continue
        result = normalise_row(row.value, config.format, id_format, config.turns, config.tool_result_names)
        if isinstance(result, Rejection):
            yield Origin(row.index, row.source, None), result
            continue
        overlaps = check_prompts(decontamination.index, result) if decontamination else [None] * len(result)
        for conversation, overlap in zip(result, overlaps, strict=True):
            origin = Origin(row.index, row.source, conversation.sample_id)
            if overlap is not None:
                yield origin, overlap
            elif seen.first(conversation.sample_id):
                yield origin, conversation
            else:
                yield origin, Rejection(Reason.DUPLICATE, "same prompt as an earlier row")


def _reject(rejections: RejectionWriter, origin: Origin, rejection: Rejection) -> None:
    extra = {"suite": rejection.suite, "item": rejection.item} if isinstance(rejection, EvalOverlap) else {}
    rejections.add(
        origin.sample_id, rejection.reason, rejection.detail, source_index=origin.index, source=origin.source, **extra
    )


def _cleaned(decontamination: Decontamination | None, tally: _Tally) -> dict[str, Any]:
    """What the prompts were cleaned against (suites, names and sha256) and what each suite rejected."""
    if decontamination is None:
        return {}
    counts = {suite["name"]: tally.by_suite.get(suite["name"], 0) for suite in decontamination.record["suites"]}
    return {**decontamination.record, "rejected_by_suite": counts}


def _prepare_whole(
    candidates: Iterable[tuple[Origin, Conversation | Rejection]],
    renderer: ChatRenderer,
    workers: int,
    tally: _Tally,
    shards: _ShardWriter,
    rejections: RejectionWriter,
    limit: int | None,
) -> None:
    """Every prompt tokenised as it is read, up to `limit` kept."""
    with closing(render_ordered(candidates, renderer, workers)) as rendered:
        for origin, result in rendered:
            tally.count(origin, result)
            if isinstance(result, Rendered):
                shards.add(_prompt_row(origin, result.conversation, shards.on_policy), result.prompt_ids)
            else:
                _reject(rejections, origin, result)
            if limit is not None and tally.stats.kept >= limit:
                return


def part_layout(shard_size: int, samples: int, part_prompts: int) -> tuple[int, int]:
    """(prompts per part, shards per part): a part is whole shards of its prompts' samples, so each part's shard
    numbers are known before any part is tokenised (a part whose prompts were rejected leaves a gap after its last)."""
    prompts = max(1, max(1, part_prompts // shard_size) * shard_size // samples)
    return prompts, math.ceil(prompts * samples / shard_size)


def run_prepare(
    config: DatasetConfig,
    location: DatasetLocation,
    storage: Storage,
    renderer: ChatRenderer,
    shard_size: int,
    limit: int | None,
    resolve_path: Callable[[str], str] = str,
    *,
    s3_client: S3ClientFactory | None = None,
    workers: int | None = None,
    inputs: dict[str, Any] | None = None,
    run_id: str | None = None,
    part_prompts: int | None = None,
    decontamination: Decontamination | None = None,
) -> PreparedDataset | PreparedParts:
    """`s3_client` makes the boto3 client for `s3://` sources; `workers` tokenises in that many processes (None:
    all cores, 1: in this process); `inputs` (regen.version_inputs.dataset_inputs) is recorded as what the version
    is made from; `part_prompts`: a dataset with more prompts than this (and no limit) is left in parts for
    `prepare_part`, returned as PreparedParts (None: always prepared whole); `decontamination`: the eval suites'
    index, prompts holding an item rejected (`eval_overlap`)."""
    existing = location.prepared
    if storage.exists(existing):
        log.info("%s already prepared; reusing %s", location.dataset, storage.uri(existing))
        return PreparedDataset.from_dict(json.loads(storage.get_bytes(existing)))
    if storage.exists(location.prepare_index):
        index = json.loads(storage.get_bytes(location.prepare_index))
        log.info("%s already read into %d parts; reusing them", location.dataset, len(index["parts"]))
        return PreparedParts(len(index["parts"]), index["to_tokenise"])

    # A prepare that failed part-way (a damaged source, a killed task) left shards with no prepare.json: they are
    # not this version's prompts, and a source fixed since may give fewer shards.
    for stale in storage.list_keys(location.prompts_folder):
        storage.delete(stale)
    tally = _Tally(location.dataset)
    rejections = RejectionWriter(storage, location.prepare_rejections)
    on_policy = config.turns == "on_policy"
    workers = workers or available_cores()
    with tempfile.TemporaryDirectory(prefix="regen-prepare-") as tmp, rejections:
        workdir = Path(tmp)
        shards = _ShardWriter(location, storage, shard_size, config)
        uploaded: dict[int, str] = {}
        samples = len(samples_of("", config.temperatures, config.samples_per_prompt))
        per_part, shards_per_part = part_layout(shard_size, samples, part_prompts or 1)

        def _upload(part: int, path: Path) -> None:
            uploaded[part] = storage.put_file(location.prepare_part(part), path)
            path.unlink()

        spool = _PartSpool(workdir, per_part, _upload)

        with closing(_SeenIds(workdir)) as seen:
            rows = iter_rows(config, resolve_path, s3_client)
            candidates = _candidates(rows, config, renderer.profile.tool_call_id_format, seen, decontamination)
            if part_prompts is None or limit is not None:
                _prepare_whole(candidates, renderer, workers, tally, shards, rejections, limit)
            else:
                for origin, outcome in candidates:
                    tally.count(origin, outcome)
                    if isinstance(outcome, Rejection):
                        _reject(rejections, origin, outcome)
                    else:
                        spool.add(_prompt_row(origin, outcome, on_policy))
        spool.close()
        if len(spool.counts) > 1:  # left in parts, for prepare_part tasks to share
            _upload(len(spool.counts) - 1, spool.path(len(spool.counts) - 1))
            files = rejections.upload()
            parts = [
                {"key": location.prepare_part(part), "sha256": uploaded[part], "prompts": count}
                | {"first_shard": part * shards_per_part}
                for part, count in enumerate(spool.counts)
            ]
            index = {
                "parts": parts,
                "to_tokenise": tally.to_tokenise,
                "stats": tally.stats.to_dict(),
                "rows_read": tally.rows_read,
                "duplicates": tally.duplicates,
                "decontamination": _cleaned(decontamination, tally),
                "files": files,
                "shard_size": shard_size,
                "profile": renderer.record,
                "token_roles": renderer.roles.as_record(),
                "inputs": inputs or {},
                "run_id": run_id,
            }
            storage.put_bytes(location.prepare_index, json.dumps(index, indent=1).encode())
            tally.log(f"read into {len(parts)} parts")
            return PreparedParts(len(parts), tally.to_tokenise)
        if spool.counts:  # one part: tokenised here and now
            part_stats = _tokenise_part(_part_rows(spool.path(0)), renderer, workers, shards, rejections)
            tally.stats = StageStats.merged([tally.stats, part_stats])
        shards.flush()
        files = rejections.upload()

    prepared = PreparedDataset(
        location=location,
        shards=shards.shards,
        stats=tally.stats,
        duplicates=tally.duplicates,
        profile=renderer.record,
        token_roles=renderer.roles.as_record(),
        files=files,
        rows_read=tally.rows_read,
        inputs=inputs or {},
        decontamination=_cleaned(decontamination, tally),
    )
    _record(storage, prepared, config, run_id)
    tally.log(f"prepared ({len(shards.shards)} shards)")
    return prepared


def _record(storage: Storage, prepared: PreparedDataset, config: DatasetConfig, run_id: str | None) -> None:
    prepared.stats.check()
    record = {
        **prepared.to_dict(),
        "turns": config.turns,
        "prepared_at": datetime.now(UTC).isoformat(),
        "run_id": run_id,
    }
    storage.put_bytes(prepared.location.prepared, json.dumps(record, indent=1).encode())


def prepare_part(
    config: DatasetConfig, location: DatasetLocation, storage: Storage, renderer: ChatRenderer, part: int, workers: int
) -> dict[str, Any]:
    """One part of a dataset prepared in parts, tokenised into its shards: its record (shards, stats, files), also
    stored beside it, where a retry finds it."""
    record_key = location.prepare_part(part, ".json")
    if storage.exists(record_key):
        return dict(json.loads(storage.get_bytes(record_key)))
    index = json.loads(storage.get_bytes(location.prepare_index))
    entry = index["parts"][part]
    started = time.monotonic()
    rejections = RejectionWriter(storage, location.prepare_part_rejections(part))
    with tempfile.TemporaryDirectory(prefix="regen-part-") as tmp, rejections:
        path = Path(tmp) / "part.parquet"
        storage.get_file(entry["key"], path)
        if sha256_file(path) != entry["sha256"]:
            raise ValueError(f"{entry['key']} does not read back as written (sha256 differs): run the task again")
        shards = _ShardWriter(location, storage, index["shard_size"], config, entry["first_shard"])
        stats = _tokenise_part(_part_rows(path), renderer, workers, shards, rejections)
        files = rejections.upload()
    record = {"part": part, "shards": [s.to_dict() for s in shards.shards], "stats": stats.to_dict(), "files": files}
    storage.put_bytes(record_key, json.dumps(record, indent=1).encode())
    log.info(
        "prepared %s part %d of %d: %d prompts kept in %d shards, dropped %s (%.1f s)",
        location.dataset,
        part,
        len(index["parts"]),
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
        prepared = PreparedDataset.from_dict(json.loads(storage.get_bytes(location.prepared)))
    else:
        index = json.loads(storage.get_bytes(location.prepare_index))
        records, missing = [], []
        for part in range(len(index["parts"])):
            key = location.prepare_part(part, ".json")
            if storage.exists(key):
                records.append(json.loads(storage.get_bytes(key)))
            else:
                missing.append(part)
        if missing:
            raise PartsNotPrepared(
                f"{location.dataset}: parts {missing} of {len(index['parts'])} were not tokenised (their prepare_part "
                "tasks failed and say why); clear them, and the dataset goes on from the parts that finished"
            )
        files = dict(index["files"])
        for record in records:
            files |= record["files"]
        prepared = PreparedDataset(
            location=location,
            shards=[ShardManifest.from_dict(shard) for record in records for shard in record["shards"]],
            stats=StageStats.merged(
                [StageStats.from_dict(s) for s in [index["stats"], *(r["stats"] for r in records)]]
            ),
            duplicates=index["duplicates"],
            profile=index["profile"],
            token_roles=index["token_roles"],
            files=dict(sorted(files.items())),
            rows_read=index["rows_read"],
            inputs=index["inputs"],
            decontamination=index.get("decontamination", {}),
        )
        _record(storage, prepared, config, index["run_id"])
        log.info("prepared %s from %d parts (%d shards)", location.dataset, len(records), len(prepared.shards))
    for leftover in storage.list_keys(location.prepare_parts_folder):  # also after a crash right after the record
        storage.delete(leftover)
    return prepared
