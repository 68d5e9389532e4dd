"""Exactly once, counted from the data: every source row published once or rejected once, by id.

The source rows are read here, line by line with plain json, never with the pipeline's reader: a reader bug that
dropped or merged rows would otherwise drop them from what is expected too, and cancel out. The ids a row should give
are computed from the row itself (its prompts' sample ids, regen.samples, and an on-policy conversation's turn ids),
never from the version's manifest; what the version holds is read back from its
folders: the `id` column of every `train/` and `truncated/` Parquet file, and every line of every `rejected/` file.
A row is accounted for when it was rejected at prepare (a bad row, a duplicate, a prompt the template or the length
limit refused), or when each of its answers is in exactly one of train/, truncated/ and a later stage's rejected/.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from regen.config import DatasetConfig
from regen.layout import SPLITS
from regen.on_policy import dataset_turns
from regen.samples import samples_of, turn_id
from regen.stages.prepare.formats import normalize_row
from regen.stages.prepare.normalize import Conversation, Rejection

EXAMPLES = 5  # ids shown per kind of problem
# A source row: its index and its prompts, each as (prompt id, the answer ids it should give).
SourcePrompts = tuple[int, list[tuple[str, list[str]]]]


def source_rows(config: DatasetConfig) -> Iterator[tuple[int, Any]]:
    """Every line of the dataset's JSON Lines files, numbered from 0 across them, as its JSON value (None when it is
    not JSON: the pipeline rejects such a line, as it does a blank one)."""
    if config.hf is not None or not config.paths:
        raise ValueError("the exactly-once count reads the JSON Lines files the bench wrote, not a hub dataset")
    index = 0
    for path in config.paths:
        if not str(path).endswith(".jsonl"):
            raise ValueError(f"{path}: the exactly-once count reads plain .jsonl files only")
        with open(path, "rb") as lines:
            for line in lines:  # every line, a blank one too: each is a row the pipeline must account for
                try:
                    value = json.loads(line)
                except ValueError:
                    value = None
                yield index, value
                index += 1


def source_prompts(config: DatasetConfig, id_format: str) -> Iterator[SourcePrompts]:
    """Every row of the dataset's source, as the bench wrote it, with the ids it should give."""
    for index, value in source_rows(config):
        result = normalize_row(value, config.format, id_format, config.turns, config.tool_result_names)
        if isinstance(result, Rejection):
            yield index, []
            continue
        yield index, [(c.sample_id, _answer_ids(c, config)) for c in result]


def _answer_ids(conversation: Conversation, config: DatasetConfig) -> list[str]:
    samples = samples_of(conversation.sample_id, config.temperatures, config.samples_per_prompt)
    if config.turns != "on_policy":
        return [s.id for s in samples]
    turns = len(dataset_turns(conversation.later))
    return [turn_id(s.id, turn) for s in samples for turn in range(1, turns + 1)]


def published_ids(version: Path) -> Counter[str]:
    """How often each id is a record in the version's train/ and truncated/ Parquet files."""
    ids: Counter[str] = Counter()
    for split in SPLITS:
        for path in sorted((version / split).glob("*.parquet")):
            ids.update(pq.read_table(path, columns=["id"]).column("id").to_pylist())
    return ids


def rejected_lines(version: Path) -> Iterator[dict[str, Any]]:
    for path in sorted((version / "rejected").glob("*.jsonl")):
        with path.open(encoding="utf-8") as lines:
            yield from (json.loads(line) for line in lines if line.strip())


class _Problems:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, list[Any]] = {}

    def add(self, kind: str, example: Any) -> None:
        self.counts[kind] += 1
        shown = self.examples.setdefault(kind, [])
        if len(shown) < EXAMPLES:
            shown.append(example)


def count_once(version: Path, rows: Iterable[SourcePrompts]) -> dict[str, Any]:
    """`rows` (source_prompts) against the version's data: every row accounted for exactly once, nothing else."""
    published = published_ids(version)
    at_prepare: Counter[tuple[int | None, str | None]] = Counter()
    later: Counter[str] = Counter()  # rejected by generate, validate or export
    rejected_by_stage: Counter[str] = Counter()
    for line in rejected_lines(version):
        rejected_by_stage[line["stage"]] += 1
        if line["stage"] == "prepare":
            at_prepare[(line.get("source_index"), line["id"])] += 1
        else:
            later[line["id"]] += 1
    problems, expected, seen_prompts = _Problems(), set(), set()
    source_rows = prompts = 0
    for index, row_prompts in rows:
        source_rows += 1
        if not row_prompts and at_prepare.pop((index, None), 0) != 1:
            problems.add("row_not_rejected_once", index)
        for prompt, answers in row_prompts:
            prompts += 1
            refused = at_prepare.pop((index, prompt), 0)
            first = prompt not in seen_prompts
            seen_prompts.add(prompt)
            if refused > 1 or (not first and refused != 1):
                problems.add("prompt_not_rejected_once", {"source_index": index, "id": prompt})
            for answer in answers if first else ():
                expected.add(answer)
                _check_answer(answer, published[answer], later[answer], refused, problems)
    for kind, ids in (("published_not_from_source", published), ("rejected_not_from_source", later)):
        for answer in ids.keys() - expected:
            problems.add(kind, answer)
    for (row, rejected_id), n in at_prepare.items():
        problems.add("prepare_rejection_not_from_source", {"source_index": row, "id": rejected_id, "times": n})
    return {
        "source_rows": source_rows,
        "prompts": prompts,
        "published": sum(published.values()),
        "rejected": dict(sorted(rejected_by_stage.items())),
        "problems": dict(problems.counts),
        "examples": problems.examples,
        "ok": not problems.counts,
    }


def _check_answer(answer: str, published: int, rejected: int, refused_at_prepare: int, problems: _Problems) -> None:
    if published > 1:
        problems.add("published_twice", answer)
    if rejected > 1:
        problems.add("rejected_twice", answer)
    if published and rejected:
        problems.add("published_and_rejected", answer)
    if refused_at_prepare and (published or rejected):
        problems.add("rejected_at_prepare_and_answered", answer)
    if not refused_at_prepare and not published and not rejected:
        problems.add("missing", answer)
