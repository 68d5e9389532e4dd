"""The prepare tasks: a dataset read once (`prepare_dataset`), a large one's tokenizing shared by part tasks
(`prepare_dataset_part`), and every dataset recorded whole once its parts are (`finish_prepared`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from regen.config import ConfigError
from regen.errors import FinalError
from regen.hints import LAST_LENGTHS, Hints
from regen.layout import DatasetLocation
from regen.manifest import PreparedDataset
from regen.metrics import current as metrics
from regen.pipeline.run import renderer_for
from regen.pipeline.run_storage import RunStorage
from regen.run_params import RunSpec
from regen.samples import samples_of
from regen.stages.prepare.eval_suites import load_suites
from regen.stages.prepare.parts import part_prompts_to_map
from regen.stages.prepare.prepare import PreparedParts, PrepareSettings, finish_parts, prepare_part, run_prepare
from regen.stages.prepare.sources import source_digests
from regen.stages.prepare.tokenize import pool_size
from regen.storage import S3ClientFactory, Storage
from regen.version_inputs import (
    answer_lengths,
    dataset_inputs,
    dated,
    latest_of_another_profile,
    latest_published,
    unchanged_since,
)

log = logging.getLogger(__name__)


def prepare_dataset(
    run: RunSpec, dataset: str, s3_client: S3ClientFactory | None = None, tasks_at_once: int = 1
) -> dict[str, Any]:
    """The dataset read once, normalized and deduplicated, and tokenized into prompt shards: its name, shard and
    prompt counts (the shards themselves are in prompts/prepare.json, see `prepared_version`). A dataset of more
    than one part is left in `parts` for `prepare_dataset_part` and `finish_prepared`. Or, when its inputs are those
    of its last published version (and the run skips unchanged datasets), `unchanged_since` naming that version.
    `tasks_at_once`: the tasks this machine may run together, which share its cores when `tokenize_workers` is null."""
    location, at, renderer = run.location(dataset), RunStorage.open(run, s3_client), renderer_for(run)
    source, inputs, latest = run.dataset(dataset), {}, None
    cleaning = load_suites(run.decontamination, run.resolve, s3_client)
    if not at.storage.exists(location.prepared):  # a new version, not a resumed one
        sources = source_digests(source, run.resolve, s3_client)
        suites = cleaning.record if cleaning else None
        inputs = dataset_inputs(
            source, renderer.record, run.sampling, run.limit, sources, suites, run.validation_share, run.export
        )
        wanted = run.skip_unchanged or run.longest_first
        latest = latest_published(at.storage, location.profile, dataset) if wanted else None
        if run.skip_unchanged and unchanged_since(latest, dataset, inputs):
            return {"dataset": dataset, "unchanged_since": latest}
        inputs = dated(inputs, run.logical_date)  # the version's date, kept when a later run resumes it
    hints = Hints()  # for the run report: an ordering hint that could not be used
    uses_lengths = run.longest_first  # (an on-policy turn's last length is found by its turn id)
    if uses_lengths and latest is None and inputs:  # a first version here: another model's answers, if any
        latest = hints.use(LAST_LENGTHS, None, latest_of_another_profile, at.storage, location.profile, dataset)
    if inputs:  # what its send order is predicted from, for the run report (not an input: the digest stands)
        inputs = {**inputs, "lengths_from": lengths_from(latest if uses_lengths else None, run.longest_first)}
    with contextlib.ExitStack() as held:
        storage = held.enter_context(at.writing(location))  # VersionBusy before anything is read for the order
        expected = held.enter_context(_last_lengths(storage, latest, location, hints)) if uses_lengths else {}
        prepared = run_prepare(
            source,
            location,
            storage,
            renderer,
            PrepareSettings(
                shard_size=run.shard_size,
                limit=run.limit,
                resolve_path=run.resolve,
                s3_client=s3_client,
                workers=pool_size(run.tokenize_workers, tasks_at_once),
                inputs=inputs,
                run_id=run.run_id,
                part_prompts=run.prepare_part_prompts,
                decontamination=cleaning,
                expected_tokens=expected,
                by_length=run.longest_first,
            ),
        )
    warnings = hints.warnings(dataset)
    noted = {"warnings": warnings} if warnings else {}
    if isinstance(prepared, PreparedParts):
        return {"dataset": dataset, "parts": prepared.parts, "prompts": prepared.prompts, **noted}
    return {**_summary(prepared), **noted}


def _summary(prepared: PreparedDataset) -> dict[str, Any]:
    """A prepared dataset's counts for the tasks after it; its rejections counted (regen.metrics)."""
    dataset = prepared.location.dataset
    metrics().rejected(dataset, "prepare", prepared.stats.dropped_by_reason)
    answers = sum(s.num_prompts if s.num_answers is None else s.num_answers for s in prepared.shards)
    return {"dataset": dataset, "shard_count": len(prepared.shards), "prompts": prepared.stats.kept, "answers": answers}


def lengths_from(latest: dict[str, Any] | None, uses_lengths: bool) -> dict[str, Any]:
    """Where a new version's expected answer lengths come from: its dataset's last version under this profile, or
    under another (`latest["profile"]`), then each row's reference answer; nothing when it keeps the source order."""
    if not uses_lengths:
        return {"predictor": "none"}
    if latest is None:
        return {"predictor": "reference_answers"}
    where = "another_profile" if "profile" in latest else "last_version"
    other = {"profile": latest["profile"]} if "profile" in latest else {}
    return {"predictor": where, "version": latest["version"], **other}


@contextlib.contextmanager
def _last_lengths(
    storage: Storage, latest: dict[str, Any] | None, location: DatasetLocation, hints: Hints
) -> Iterator[Mapping[str, int]]:
    """The last version's answer lengths, to send the longest first; none when this version's prompts or parts are
    written already (a retry reuses them), and none when they cannot be read (a hint: `hints` keeps why, for the run
    report)."""
    if latest is None or storage.exists(location.prepared) or storage.exists(location.prepare_index):
        yield {}
        return
    lengths = hints.use(LAST_LENGTHS, None, answer_lengths, storage, latest, location)
    if lengths is None:  # a manifest or verdicts an earlier version wrote differently, or lost
        yield {}
        return
    with lengths:
        yield lengths


MAX_MAP_LENGTH = 1024  # the most task instances Airflow maps from one input ([core] max_map_length's default)


def dataset_parts(run: RunSpec, prepared: list[dict[str, Any]]) -> list[list[int]]:
    """Every part of the datasets left in parts (`prepare_dataset`'s summaries), each `[the dataset's position in
    the run's datasets, part]`: a few bytes a part whatever the names, so the mapped input stays small. Raises
    ConfigError when there are more parts than Airflow maps."""
    parts = [[run.datasets.index(p["dataset"]), part] for p in prepared for part in range(p.get("parts", 0))]
    if len(parts) > MAX_MAP_LENGTH:
        raise ConfigError(
            f"{len(parts)} prepare parts, more than Airflow maps ({MAX_MAP_LENGTH}): set defaults.prepare_part_prompts "
            f"to at least {_part_prompts_to_map(run, [p for p in prepared if 'parts' in p])}"
        )
    return parts


def _part_prompts_to_map(run: RunSpec, in_parts: list[dict[str, Any]]) -> int:
    sizes = [(p["prompts"], run.dataset(p["dataset"])) for p in in_parts]
    counts = [(prompts, len(samples_of("", d.temperatures, d.samples_per_prompt))) for prompts, d in sizes]
    return part_prompts_to_map(run.shard_size, counts, MAX_MAP_LENGTH)


def part_name(run: RunSpec, reference: list[int]) -> str:
    """A part's name for people (the task's label): its dataset's and its number."""
    return f"{run.datasets[reference[0]]}/part-{reference[1]:05d}"


def prepare_dataset_part(
    run: RunSpec, reference: list[int], s3_client: S3ClientFactory | None = None
) -> dict[str, Any]:
    """One part (`dataset_parts`) of a dataset tokenized into its shards, in this process: the parts are what runs
    in parallel, and this process has the renderer already (the preload). Its counts."""
    dataset, part = run.datasets[reference[0]], reference[1]
    location = run.location(dataset)
    with RunStorage.open(run, s3_client).writing(location) as storage:
        record = prepare_part(run.dataset(dataset), location, storage, renderer_for(run), part, 1)
    return {"dataset": dataset, "part": part, "shards": len(record["shards"]), "kept": record["stats"]["kept"]}


def finish_prepared(
    run: RunSpec, prepared: list[dict[str, Any]], s3_client: S3ClientFactory | None = None
) -> list[dict[str, Any]]:
    """`prepare_dataset`'s summaries with every dataset left in parts recorded whole (regen.stages.prepare.prepare's
    `finish_parts`), once all its parts are tokenized. A dataset with a part that failed is left out, with its
    reason in the log: it is not prepared (its verify says so), and holds back no other dataset."""
    at, finished = RunStorage.open(run, s3_client), []
    for summary in prepared:
        if "parts" not in summary:
            finished.append(summary)
            continue
        location = run.location(summary["dataset"])
        try:
            with at.writing(location) as storage:
                dataset = finish_parts(run.dataset(summary["dataset"]), location, storage)
        except FinalError as e:
            log.error("%s", e)
            continue
        finished.append(_summary(dataset))
    for summary in finished:  # the run's planned work (list_shards' task): what its remaining work is counted from
        if "answers" in summary:  # (not an unchanged dataset's, nor a summary written before the field)
            metrics().planned_shards.labels(summary["dataset"]).set(summary["shard_count"])
            metrics().planned_answers.labels(summary["dataset"]).set(summary["answers"])
    return finished


def prepared_version(run: RunSpec, dataset: str, s3_client: S3ClientFactory | None = None) -> PreparedDataset:
    """What prepare recorded of this run's version of `dataset` (its prompts/prepare.json)."""
    return RunStorage.open(run, s3_client).prepared(dataset)
