"""Prepare's one reader of a dataset: source rows -> prompts in order, each row accounted for. Rows that give no
prompt, prompts holding an eval item and repeated prompts come out as rejections; the seen sample ids live in an
SQLite table on local disk (memory stays flat), and a tally counts what the manifest reports."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regen.config.datasets import DatasetConfig
from regen.manifest import StageStats
from regen.reasons import Reason
from regen.rejections import RejectionWriter
from regen.scratch import scratch_table
from regen.stages.prepare.decontaminate import EvalOverlap, check_prompts
from regen.stages.prepare.eval_suites import Decontamination
from regen.stages.prepare.formats import normalize_row
from regen.stages.prepare.normalize import Conversation, Rejection
from regen.stages.prepare.sources import BadRow, SourceRow
from regen.stages.prepare.tokenize import Rendered

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 15.0


@dataclass(frozen=True, slots=True)
class Origin:
    index: int  # the row's position in the dataset stream
    source: str
    sample_id: str | None  # None when the row gave no conversation


class SeenIds:
    """Sample ids already kept or queued, in an SQLite table on local disk: a Python set would grow with the data."""

    def __init__(self, directory: Path) -> None:
        self._db = scratch_table(directory / "seen.sqlite3", "CREATE TABLE seen (id TEXT PRIMARY KEY) WITHOUT ROWID")

    def first(self, sample_id: str) -> bool:
        """True the first time an id is offered, False for every repeat."""
        return self._db.execute("INSERT OR IGNORE INTO seen (id) VALUES (?)", (sample_id,)).rowcount == 1

    def close(self) -> None:
        self._db.close()


class Tally:
    """The counts the manifest reports, with a progress line every few seconds."""

    def __init__(self, dataset: str) -> None:
        self.dataset = dataset
        self.stats = StageStats()
        self.rows_read = 0
        self.duplicates = 0
        self.to_tokenize = 0  # prepared in parts: prompts passed on to the parts, which count them kept or dropped
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
            self.to_tokenize += 1
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
            "%s %s: %d rows read, %d prompts kept, %d to tokenize in parts, %d duplicates, dropped %s (%.0f rows/s)",
            what,
            self.dataset,
            self.rows_read,
            self.stats.kept,
            self.to_tokenize,
            self.duplicates,
            dict(sorted(self.stats.dropped_by_reason.items())),
            self.rows_read / elapsed if elapsed else 0.0,
        )


def candidates(
    rows: Iterable[SourceRow | BadRow],
    config: DatasetConfig,
    id_format: str,
    seen: SeenIds,
    decontamination: Decontamination | None = None,
) -> Iterator[tuple[Origin, Conversation | Rejection]]:
    """Rows -> prompts to render, in order; rows that give none, prompts holding an eval item (before dedupe, so
    that each copy names its suite), and repeated prompts, as rejections."""
    for row in rows:
        if isinstance(row, BadRow):
            yield Origin(row.index, row.source, None), Rejection(row.reason, row.detail)
            continue
        result = normalize_row(row.value, config.format, id_format, config.turns, config.tool_result_names)
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


def reject(rejections: RejectionWriter, origin: Origin, rejection: Rejection) -> None:
    extra = {"suite": rejection.suite, "item": rejection.item} if isinstance(rejection, EvalOverlap) else {}
    rejections.add(
        origin.sample_id, rejection.reason, rejection.detail, source_index=origin.index, source=origin.source, **extra
    )


def decontamination_record(decontamination: Decontamination | None, tally: Tally) -> dict[str, Any]:
    """What the prompts were cleaned against (suites, names and sha256) and what each suite rejected."""
    if decontamination is None:
        return {}
    counts = {suite["name"]: tally.by_suite.get(suite["name"], 0) for suite in decontamination.record["suites"]}
    return {**decontamination.record, "rejected_by_suite": counts}
