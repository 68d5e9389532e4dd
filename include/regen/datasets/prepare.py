"""The prepare stage: a dataset source -> normalised, deduplicated, tokenised prompt shards in storage.

Every row read is accounted for: it becomes prompts (one per regenerated turn) or a rejection with its reason in
`rejected/prepare.jsonl`, and `total == kept + dropped` counts prompts (in the default `turns: final` mode, one per
row, so `total` is also the rows read; with `turns: on_policy`, one per conversation, whose turns generate counts).
Memory stays flat whatever the dataset size: rows stream in, the seen sample ids live in an SQLite table on local
disk, rejections stream to a file and prompts leave a shard at a time.

Idempotent: once `prompts/prepare.json` exists for a dataset version, it is the answer, so a cleared or retried task
never reshards prompts that later stages already consumed.
"""

from __future__ import annotations

import json
import logging
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

from regen.chat import ChatRenderer
from regen.config import DatasetConfig
from regen.datasets.formats import normalise_row
from regen.datasets.normalise import Conversation, Rejection
from regen.datasets.sources import BadRow, SourceRow, iter_rows
from regen.datasets.tokenise import Rendered, available_cores, render_ordered
from regen.layout import DatasetLocation
from regen.manifest import PreparedDataset, ShardManifest, StageStats
from regen.on_policy import dataset_turns
from regen.reasons import Reason
from regen.rejections import RejectionWriter
from regen.samples import samples_of
from regen.storage import S3ClientFactory, Storage, write_table

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


class _ShardWriter:
    def __init__(self, location: DatasetLocation, storage: Storage, shard_size: int, config: DatasetConfig) -> None:
        self.location, self.storage, self.shard_size = location, storage, shard_size
        self.temperatures, self.per_prompt = config.temperatures, config.samples_per_prompt
        self.on_policy = config.turns == "on_policy"
        self.shards: list[ShardManifest] = []
        self._rows: list[dict[str, Any]] = []
        self._answers = 0  # on-policy: the turns of the shard's conversations

    def add(self, origin: Origin, rendered: Rendered) -> None:
        """One row per sample of the prompt (regen.samples); a prompt's samples may span two shards."""
        conversation = rendered.conversation
        prompt = {
            "source_index": origin.index,
            "source": origin.source,
            # Key order kept as rendered: re-rendering the stored columns gives the same prompt_ids.
            "messages": json.dumps(conversation.messages, ensure_ascii=False),
            "tools": json.dumps(conversation.tools, ensure_ascii=False),
            "meta": json.dumps(conversation.meta, ensure_ascii=False, default=str),
            "prompt_ids": rendered.prompt_ids,
            "later": json.dumps(conversation.later, ensure_ascii=False) if self.on_policy else None,
        }
        answers = len(dataset_turns(conversation.later)) if self.on_policy else 1
        for sample in samples_of(conversation.sample_id, self.temperatures, self.per_prompt):
            row = {"id": sample.id, **prompt, "temperature": sample.temperature, "sampling_seed": sample.seed}
            self._rows.append(row)
            self._answers += answers
            if len(self._rows) >= self.shard_size:
                self.flush()

    def flush(self) -> None:
        if not self._rows:
            return
        number = len(self.shards)
        key = self.location.shard(number).prompts
        digest = write_table(self.storage, key, pa.Table.from_pylist(self._rows, schema=PROMPT_SCHEMA))
        answers = self._answers if self.on_policy else None
        self.shards.append(ShardManifest(self.location, number, key, digest, len(self._rows), num_answers=answers))
        self._rows, self._answers = [], 0


class _Tally:
    """The counts the manifest reports, with a progress line every few seconds."""

    def __init__(self, dataset: str) -> None:
        self.dataset = dataset
        self.stats = StageStats()
        self.rows_read = 0
        self.duplicates = 0
        self._last_index = -1
        self._started = self._logged = time.monotonic()

    def count(self, origin: Origin, result: Rendered | Rejection) -> None:
        if origin.index != self._last_index:  # a row's prompts arrive together, rows in order
            self.rows_read += 1
            self._last_index = origin.index
        if isinstance(result, Rendered):
            self.stats.keep()
        else:
            self.stats.drop(result.reason)
            self.duplicates += result.reason == Reason.DUPLICATE
        if time.monotonic() - self._logged >= PROGRESS_EVERY_S:
            self._logged = time.monotonic()
            self.log("preparing")

    def log(self, what: str) -> None:
        elapsed = time.monotonic() - self._started
        log.info(
            "%s %s: %d rows read, %d prompts kept, %d duplicates, dropped %s (%.0f prompts/s)",
            what,
            self.dataset,
            self.rows_read,
            self.stats.kept,
            self.duplicates,
            dict(sorted(self.stats.dropped_by_reason.items())),
            self.stats.total / elapsed if elapsed else 0.0,
        )


def _candidates(
    rows: Iterable[SourceRow | BadRow], config: DatasetConfig, id_format: str, seen: _SeenIds
) -> Iterator[tuple[Origin, Conversation | Rejection]]:
    """Rows -> prompts to render, in order; rows that give none, and repeated prompts, as rejections."""
    for row in rows:
        if isinstance(row, BadRow):
            yield Origin(row.index, row.source, None), Rejection(row.reason, row.detail)
            continue
        result = normalise_row(row.value, config.format, id_format, config.turns, config.tool_result_names)
        if isinstance(result, Rejection):
            yield Origin(row.index, row.source, None), result
            continue
        for conversation in result:
            origin = Origin(row.index, row.source, conversation.sample_id)
            if seen.first(conversation.sample_id):
                yield origin, conversation
            else:
                yield origin, Rejection(Reason.DUPLICATE, "same prompt as an earlier row")


def _consume(
    rendered: Iterable[tuple[Origin, Rendered | Rejection]],
    tally: _Tally,
    shards: _ShardWriter,
    rejections: RejectionWriter,
    limit: int | None,
) -> None:
    for origin, result in rendered:
        tally.count(origin, result)
        if isinstance(result, Rendered):
            shards.add(origin, result)
        else:
            rejections.add(
                origin.sample_id, result.reason, result.detail, source_index=origin.index, source=origin.source
            )
        if limit is not None and tally.stats.kept >= limit:
            return


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
) -> PreparedDataset:
    """`s3_client` makes the boto3 client for `s3://` sources; `workers` tokenises in that many processes (None:
    all cores, 1: in this process); `inputs` (regen.version_inputs.dataset_inputs) is recorded as what the version
    is made from."""
    existing = location.prepared
    if storage.exists(existing):
        log.info("%s already prepared; reusing %s", location.dataset, storage.uri(existing))
        return PreparedDataset.from_dict(json.loads(storage.get_bytes(existing)))

    # A prepare that failed part-way (a damaged source, a killed task) left shards with no prepare.json: they are
    # not this version's prompts, and a source fixed since may give fewer shards.
    for stale in storage.list_keys(location.prompts_folder):
        storage.delete(stale)
    tally = _Tally(location.dataset)
    rejections = RejectionWriter(storage, location.prepare_rejections)
    with tempfile.TemporaryDirectory(prefix="regen-prepare-") as tmp, rejections:
        workdir = Path(tmp)
        shards = _ShardWriter(location, storage, shard_size, config)
        with closing(_SeenIds(workdir)) as seen:
            rows = iter_rows(config, resolve_path, s3_client)
            candidates = _candidates(rows, config, renderer.profile.tool_call_id_format, seen)
            with closing(render_ordered(candidates, renderer, workers or available_cores())) as rendered:
                _consume(rendered, tally, shards, rejections, limit)
        shards.flush()
        files = rejections.upload()

    tally.stats.check()
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
    )
    record = {
        **prepared.to_dict(),
        "turns": config.turns,
        "prepared_at": datetime.now(UTC).isoformat(),
        "run_id": run_id,
    }
    storage.put_bytes(existing, json.dumps(record, indent=1).encode())
    tally.log(f"prepared ({len(shards.shards)} shards)")
    return prepared
