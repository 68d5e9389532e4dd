"""Tokenized prompts -> prompt shards in storage (`prompts/shard-*.parquet`, PROMPT_SCHEMA), one row per sample, and
the record of a prepared dataset's shards (`prompts/prepare.json`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

import numpy as np
import pyarrow as pa

from regen.config.datasets import DatasetConfig
from regen.layout import DatasetLocation
from regen.manifest import PreparedDataset, ShardManifest
from regen.samples import samples_of, turn_id
from regen.stages.prepare.spill import LongestFirstSpill
from regen.storage import Storage, write_table

PROMPT_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("source_index", pa.int64()),
        ("source", pa.string()),
        ("messages", pa.string()),
        ("tools", pa.string()),
        ("source_key", pa.string()),  # regen.holdout.source_key: its source prompt's side of the held-out split
        ("meta", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("temperature", pa.float64()),  # null: the run's temperature
        ("sampling_seed", pa.int64()),  # null: no seed sent
        ("later", pa.string()),  # on-policy: the conversation after the first turn's prompt (JSON); else null
        # the sample's answer tokens in the dataset's last version (regen.version_inputs.answer_lengths), else its
        # reference answer's; null: not known. Generate sends the longest first, so the shard's last requests are
        # short ones.
        ("expected_tokens", pa.int32()),
        ("reference_tokens", pa.int32()),  # the row's own answer at the cut, in the target's tokens; null: none
        # on-policy: each turn's expected answer tokens (null: none), where they order the shards: the last version's
        # answer to the same turn (by turn id), else the turn's recorded answer in the target's tokens; the row's
        # expected_tokens is their sum, the chain of answers the conversation waits on
        ("turn_tokens", pa.list_(pa.int32())),
    ]
)


# A prompt's, the same in each of its samples' rows.
PROMPT_FIELDS = (
    "source_index",
    "source",
    "messages",
    "tools",
    "source_key",
    "meta",
    "later",
    "reference_tokens",
    "turn_tokens",
)


class ShardWriter:
    """Tokenized prompts -> shards of `shard_size` rows, numbered from `first_shard`, written as they fill.

    `expected_tokens`: each answer's length in the dataset's last version, by answer id (a sample's; an on-policy
    turn's, by turn id); an answer it does not know takes its reference length (`reference_tokens`, the dataset's own
    answer; an on-policy turn's, its entry in `turn_tokens`). With `by_length`, the rows
    wait for the end (`flush`) and are dealt into shards longest first: the first shards hold the longest answers and
    the last ones the shortest, so the run's last minutes are short answers, not the few longest with most of the fleet
    idle. Generate then sends each shard's longest first too. An on-policy row's length is its conversation's: its
    turns' reference answers together, the chain of answers it waits on. The waiting rows are spilled to a local file as
    they come (regen.stages.prepare.spill), and memory keeps 13 bytes a row (28 while they are dealt), so a task's
    memory is bounded by a shard, not by its rows (held in memory, a row of a 1,000-token prompt cost about 11.8 KB:
    11.8 GB at a limit of 10^6 prompts; bench/bench_prepare.py writer). The file is in `directory` (None: the system's
    temporary folder); `close`, or the writer used as a context manager, removes it however the writer ends."""

    def __init__(
        self,
        location: DatasetLocation,
        storage: Storage,
        shard_size: int,
        config: DatasetConfig,
        first_shard: int = 0,
        expected_tokens: Mapping[str, int] | None = None,
        directory: Path | None = None,
        by_length: bool | None = None,
    ) -> None:
        self.location, self.storage, self.shard_size, self.first_shard = location, storage, shard_size, first_shard
        self.temperatures, self.per_prompt = config.temperatures, config.samples_per_prompt
        self.on_policy = config.turns == "on_policy"
        self.expected_tokens = expected_tokens or {}
        self.shards: list[ShardManifest] = []
        self._rows: list[dict[str, Any]] = []  # the shard being filled (never the rows waiting to be dealt)
        self._answers = 0  # on-policy: the turns of the shard's conversations
        self.by_length = bool(self.expected_tokens) if by_length is None else by_length
        self._waiting = LongestFirstSpill(directory) if self.by_length else None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """The rows waiting to be dealt and their file, dropped (after `flush`, there are none)."""
        if self._waiting is not None:
            self._waiting.close()

    def needs_reference(self, prompt_id: str, turns: int = 1) -> bool:
        """Whether a prompt's reference lengths would order any of its answers: one the last version did not give
        (on-policy: of its samples' `turns` turns)."""
        if not self.by_length:
            return False
        return len(self.expected_of(prompt_id, turns)) < len(self._answer_ids(prompt_id, turns))

    def expected_of(self, prompt_id: str, turns: int = 1) -> dict[str, int]:
        """The answer lengths this writer knows of the prompt's samples, by answer id (on-policy: of their `turns`
        turns, by turn id)."""
        if not self.expected_tokens:
            return {}
        known = {answer_id: self.expected_tokens.get(answer_id) for answer_id in self._answer_ids(prompt_id, turns)}
        return {answer_id: tokens for answer_id, tokens in known.items() if tokens is not None}

    def _answer_ids(self, prompt_id: str, turns: int) -> list[str]:
        samples = samples_of(prompt_id, self.temperatures, self.per_prompt)
        if not self.on_policy:
            return [s.id for s in samples]
        return [turn_id(s.id, k) for s in samples for k in range(1, turns + 1)]

    def _turn_tokens(self, sample_id: str, prompt: dict[str, Any]) -> list[int | None] | None:
        """An on-policy sample's expected answer length a turn: the last version's answer to that turn, else the
        turn's reference (as prompt_row counted it); None when none is known."""
        references = prompt.get("turn_tokens") or [None] * prompt["answers"]
        turns = [self.expected_tokens.get(turn_id(sample_id, k), n) for k, n in enumerate(references, 1)]
        return turns if any(n is not None for n in turns) else prompt.get("turn_tokens")

    def add(self, prompt: dict[str, Any], prompt_ids: list[int]) -> None:
        """One row per sample of the prompt (regen.samples); a prompt's samples may span two shards."""
        shared = {name: prompt.get(name) for name in PROMPT_FIELDS}  # (a part written before source_key: null)
        waiting = self._waiting
        ids: list[int] | np.ndarray = np.asarray(prompt_ids, dtype=np.int32) if waiting is not None else prompt_ids
        for sample in samples_of(prompt["sample_id"], self.temperatures, self.per_prompt):
            if self.on_policy:  # a conversation's work: its turns' answers together
                turns = self._turn_tokens(sample.id, prompt)
                known = [n for n in turns or () if n is not None]
                expected, shared["turn_tokens"] = (sum(known) if known else None), turns
            else:
                expected = self.expected_tokens.get(sample.id, prompt.get("reference_tokens"))
            row = {"id": sample.id, **shared, "prompt_ids": ids, "expected_tokens": expected}
            row |= {"temperature": sample.temperature, "sampling_seed": sample.seed}
            self._answers += prompt["answers"]
            if waiting is not None:
                waiting.add(row, expected)
                continue
            self._rows.append(row)
            if len(self._rows) >= self.shard_size:
                self._write(self._rows)

    def flush(self) -> None:
        """The rows not written yet: the last shard, or with `expected_tokens` every shard, longest first (read
        back from their file a shard at a time); their file removed, also when writing fails."""
        if self._waiting is None:
            self._write(self._rows)
            return
        try:
            for rows in self._waiting.dealt(self.shard_size):
                self._write(rows)
        finally:
            self._waiting.close()

    def _write(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        number = self.first_shard + len(self.shards)
        key = self.location.shard(number).prompts
        digest = write_table(self.storage, key, pa.Table.from_pylist(rows, schema=PROMPT_SCHEMA))
        answers = self._answers if self.on_policy else None
        known = [row["expected_tokens"] for row in rows if row["expected_tokens"] is not None]
        longest = max(known) if self.by_length and known else None
        self.shards.append(
            ShardManifest(self.location, number, key, digest, len(rows), num_answers=answers, longest_expected=longest)
        )
        if rows is self._rows:
            self._rows, self._answers = [], 0


def record_prepared(storage: Storage, prepared: PreparedDataset, config: DatasetConfig, run_id: str | None) -> None:
    """The prepared dataset, recorded in `prompts/prepare.json`: the answer to every later prepare of its version."""
    prepared.stats.check()
    record = {
        **prepared.to_dict(),
        "turns": config.turns,
        "prepared_at": datetime.now(UTC).isoformat(),
        "run_id": run_id,
    }
    storage.put_bytes(prepared.location.prepared, json.dumps(record, indent=1).encode())
