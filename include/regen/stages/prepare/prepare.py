"""The prepare stage: a dataset source -> normalized, deduplicated, tokenized prompt shards in storage.

Every row read is accounted for: it becomes prompts (one per regenerated turn) or a rejection with its reason in
`rejected/prepare.jsonl`, and `total == kept + dropped` counts prompts (in the default `turns: final` mode, one per
row, so `total` is also the rows read; with `turns: on_policy`, one per conversation, whose turns generate counts).
Memory stays flat whatever the dataset size: rows stream in, the seen sample ids live in an SQLite table on local
disk, rejections stream to a file and prompts leave a shard at a time; dealt longest first, they wait for the last
one in a local file, not in memory (regen.stages.prepare.spill).

A dataset larger than one part (`part_prompts`, and no limit) is prepared in parts, so that several workers share
its tokenizing: one task reads the source once, normalizes and deduplicates every row (dedupe stays exact across
parts) and writes the prompts to tokenize in parts (`prompts/parts/`); each part is tokenized into shards by a task of
its own (`prepare_part`), its shard numbers fixed in advance; `finish_parts` records the shards of every part in
`prompts/prepare.json`. A dataset of one part is tokenized at once, by the task that read it. A run with a limit is
prepared whole: the limit counts prompts that tokenize, which only one reader in order can count. Its memory is
bounded all the same (a limit of 10^6 prompts dealt longest first is under 30 bytes a row and a shard); only its
tokenizing is not shared with other tasks.

Idempotent: once `prompts/prepare.json` exists for a dataset version, it is the answer, so a cleared or retried task
never reshards prompts that later stages already consumed; so is a part's record, and the parts' index.

Here: the stage's entry (`run_prepare`) and a dataset prepared whole; the reader is regen.stages.prepare.reader,
the parts (their index, `prepare_part`, `finish_parts`) regen.stages.prepare.parts, the shards and their record
regen.stages.prepare.shards.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from contextlib import closing
from pathlib import Path

from regen.chat import ChatRenderer
from regen.config.datasets import DatasetConfig
from regen.layout import DatasetLocation
from regen.manifest import PreparedDataset, StageStats
from regen.rejections import RejectionWriter
from regen.samples import samples_of
from regen.scratch import scratch_folder
from regen.stages.prepare.normalize import Conversation, Rejection
from regen.stages.prepare.parts import (
    PART_SCHEMA,
    PartsIndex,
    PartsNotPrepared,
    PartSpool,
    PreparedParts,
    answers_of,
    finish_parts,
    leave_in_parts,
    part_layout,
    part_rows,
    prepare_part,
    prompt_row,
    references_of,
    tokenize_part,
)
from regen.stages.prepare.reader import Origin, SeenIds, Tally, candidates, decontamination_record, reject
from regen.stages.prepare.settings import PrepareSettings
from regen.stages.prepare.shards import PROMPT_SCHEMA, ShardWriter, record_prepared
from regen.stages.prepare.sources import iter_rows
from regen.stages.prepare.spill import remove_abandoned_spills
from regen.stages.prepare.tokenize import Rendered, available_cores, render_ordered
from regen.storage import Storage, get_json

# The names callers know the stage by, wherever they live now.
__all__ = [
    "PART_SCHEMA",
    "PROMPT_SCHEMA",
    "PartsIndex",
    "PartsNotPrepared",
    "PrepareSettings",
    "PreparedParts",
    "finish_parts",
    "part_layout",
    "prepare_part",
    "run_prepare",
]

log = logging.getLogger(__name__)


def _prepare_whole(
    candidates: Iterable[tuple[Origin, Conversation | Rejection]],
    renderer: ChatRenderer,
    workers: int,
    tally: Tally,
    shards: ShardWriter,
    rejections: RejectionWriter,
    limit: int | None,
) -> None:
    """Every prompt tokenized as it is read, up to `limit` kept."""
    with closing(render_ordered(candidates, renderer, workers)) as rendered:
        for origin, result in rendered:
            tally.count(origin, result)
            if isinstance(result, Rendered):
                references = references_of(renderer, shards, result.conversation)
                row = prompt_row(origin, result.conversation, shards.on_policy, references=references)
                shards.add(row, result.prompt_ids)
            else:
                reject(rejections, origin, result)
            if limit is not None and tally.stats.kept >= limit:
                return


def run_prepare(
    config: DatasetConfig,
    location: DatasetLocation,
    storage: Storage,
    renderer: ChatRenderer,
    settings: PrepareSettings,
) -> PreparedDataset | PreparedParts:
    """The dataset prepared whole (PreparedDataset), or, with more prompts than `settings.part_prompts` and no limit,
    read, deduplicated and left in parts for `prepare_part` (PreparedParts)."""
    existing = location.prepared
    if storage.exists(existing):
        log.info("%s already prepared; reusing %s", location.dataset, storage.uri(existing))
        return PreparedDataset.from_dict(get_json(storage, existing))
    if storage.exists(location.prepare_index):
        index = PartsIndex.read(storage, location)
        log.info("%s already read into %d parts; reusing them", location.dataset, len(index.parts))
        return PreparedParts(len(index.parts), index.to_tokenize)

    # A prepare that failed part-way (a damaged source, a killed task) left shards with no prepare.json: they are
    # not this version's prompts, and a source fixed since may give fewer shards.
    for stale in storage.list_keys(location.prompts_folder):
        storage.delete(stale)
    remove_abandoned_spills()  # what killed prepares left on this machine's disk
    tally = Tally(location.dataset)
    rejections = RejectionWriter(storage, location.prepare_rejections)
    on_policy = config.turns == "on_policy"
    workers = settings.workers or available_cores()
    with (
        scratch_folder("prepare") as tmp,
        rejections,
        ShardWriter(
            location, storage, settings.shard_size, config, 0, settings.expected_tokens, Path(tmp), settings.by_length
        ) as shards,
    ):
        samples = len(samples_of("", config.temperatures, config.samples_per_prompt))
        per_part, shards_per_part = part_layout(settings.shard_size, samples, settings.part_prompts or 1)
        spool = PartSpool(Path(tmp), per_part, storage, location)

        with closing(SeenIds(Path(tmp))) as seen:
            rows = iter_rows(config, settings.resolve_path, settings.s3_client)
            found = candidates(rows, config, renderer.profile.tool_call_id_format, seen, settings.decontamination)
            if settings.part_prompts is None or settings.limit is not None:
                _prepare_whole(found, renderer, workers, tally, shards, rejections, settings.limit)
            else:
                for origin, outcome in found:
                    tally.count(origin, outcome)
                    if isinstance(outcome, Rejection):
                        reject(rejections, origin, outcome)
                    else:
                        known = shards.expected_of(outcome.sample_id, answers_of(outcome, on_policy))
                        references = references_of(renderer, shards, outcome)
                        spool.add(prompt_row(origin, outcome, on_policy, known, references))
        spool.close()
        if len(spool.counts) > 1:  # left in parts, for prepare_part tasks to share
            return leave_in_parts(spool, shards_per_part, tally, rejections, renderer, settings)
        if spool.counts:  # one part: tokenized here and now
            part_stats = tokenize_part(part_rows(spool.path(0)), renderer, workers, shards, rejections)
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
        inputs=settings.inputs,
        decontamination=decontamination_record(settings.decontamination, tally),
    )
    record_prepared(storage, prepared, config, settings.run_id)
    tally.log(f"prepared ({len(shards.shards)} shards)")
    return prepared
