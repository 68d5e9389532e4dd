"""The validate stage: every raw answer of a shard judged on its ids (regen.judge), each verdict written with its
lengths and flags, rejections filed with their reasons; a sample of prompts rendered again to catch a template that
moved since prepare, and a sample of answers re-tokenized to measure what a text pipeline would corrupt.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from regen.chat import ChatRenderer
from regen.errors import FinalError
from regen.judge import Judgement, declared_tools, judge
from regen.manifest import ShardManifest, StageStats
from regen.reasons import Reason
from regen.records import RawAnswer, ShardPrompts, read_raw
from regen.rejections import RejectionWriter
from regen.storage import Storage, read_table, write_table

log = logging.getLogger(__name__)


VERDICTS_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("verdict", pa.string()),
        ("flags", pa.list_(pa.string())),
        ("finish_reason", pa.string()),
        ("prompt_len", pa.int32()),
        ("output_len", pa.int32()),
        ("reasoning_len", pa.int32()),
        ("tool_calls", pa.int16()),
        # encode(decode(output_ids)) != output_ids, what a text pipeline would corrupt; null where not sampled
        ("retokenize_drift", pa.bool_()),
        # the length prepare expected of the answer (its send order: regen.stages.generate.order); null: none
        ("expected_tokens", pa.int32()),
    ]
)


class TemplateDrift(FinalError):
    """The template or tokenizer rendering prompts now is not the one that rendered this shard's prompts."""


def check_render_drift(prompts: pa.Table, renderer: ChatRenderer, fraction: float = 0.01, minimum: int = 16) -> int:
    """Re-render a deterministic sample of the shard's prompts from their stored messages and compare the ids.

    The sample is the rows with the smallest sample ids (ids are digests, so it is an unbiased sample that every
    retry picks again). Returns how many prompts were re-rendered."""
    count = min(prompts.num_rows, max(minimum, math.ceil(fraction * prompts.num_rows)))
    if count == 0:
        return 0
    rows = np.argsort(np.asarray(prompts.column("id").to_pylist(), dtype=object))[:count]
    sample = prompts.take(pa.array(rows)).select(["id", "messages", "tools", "prompt_ids"]).to_pylist()
    for row in sample:
        again = renderer.render_ids(json.loads(row["messages"]), json.loads(row["tools"]) or None)
        if again != row["prompt_ids"]:
            stored = row["prompt_ids"]
            same = (i for i, (a, b) in enumerate(zip(again, stored, strict=False)) if a != b)
            at = next(same, min(len(again), len(stored)))
            raise TemplateDrift(
                f"prompt {row['id']} renders differently now than at prepare (first difference at id {at}): the "
                f"chat template or tokenizer of profile {renderer.profile.name!r} changed since this version was "
                "prepared; use the original one, or start a new version"
            )
    return count


DRIFT_BATCH = 256  # decoded answers re-encoded per tokenizer call (a few MB of text at most)


@dataclass(frozen=True)
class ValidateSettings:
    render_check_fraction: float = 0.01  # of each shard's prompts re-rendered and compared with the stored ids
    render_check_minimum: int = 16
    # Share of kept records whose re-tokenization drift is measured (one encode each, the costliest check there is),
    # and at least this many per shard.
    retokenize_fraction: float = 0.05
    retokenize_minimum: int = 16

    def retokenize(self, sample_id: str, measured: int) -> bool:
        """A deterministic sample, by a hash of the sample id: the same records on every retry."""
        sampled = zlib.crc32(sample_id.encode()) % 10_000 < self.retokenize_fraction * 10_000
        return sampled or measured < self.retokenize_minimum


def run_validate(
    shard: ShardManifest, storage: Storage, renderer: ChatRenderer, settings: ValidateSettings | None = None
) -> ShardManifest:
    """Judges every raw answer; writes the verdicts (reports/...-verdicts.parquet) and the rejections."""

    settings = settings or ValidateSettings()
    if shard.raw_key is None:
        raise ValueError(f"{shard.name} has no raw answers yet: run generate first")
    checks_render = bool(settings.render_check_fraction or settings.render_check_minimum)
    columns_read = ["id", "prompt_ids", "tools", *(["messages"] if checks_render else [])]
    stored = read_table(storage, shard.prompts_key, columns_read, optional=("expected_tokens", "turn_tokens"))
    if checks_render:
        check_render_drift(stored, renderer, settings.render_check_fraction, settings.render_check_minimum)
    prompts = ShardPrompts(stored)
    stats, columns = StageStats(), _Columns()
    with RejectionWriter(storage, shard.keys.rejected("validate")) as rejections:
        with tempfile.TemporaryDirectory(prefix="regen-validate-") as tmp:
            for answer in read_raw(storage, shard.raw_key, Path(tmp)):
                prompt_ids = prompts.prompt_of(answer)
                tools_json = prompts.tools_json(answer.id)
                tools = declared_tools(tools_json)
                schemas = functools.partial(json.loads, tools_json or "[]")
                verdict = judge(prompt_ids, answer, renderer.roles, tools, renderer.decode_in_vocab, schemas)
                if verdict.split is None:
                    stats.drop(verdict.verdict)
                    rejections.add(answer.id, Reason.of(verdict.verdict), verdict.detail, finish=answer.finish_reason)
                else:
                    stats.keep()
                columns.append(answer, verdict, len(prompt_ids), prompts.expected_tokens(answer.id))
                if verdict.decoded is not None and settings.retokenize(answer.id, columns.measured):
                    columns.measure_drift(verdict.decoded, answer.output_ids, renderer)
            columns.flush_drift(renderer)
        files = rejections.upload()
    key = shard.keys.verdicts
    files[key] = write_table(storage, key, columns.table())
    log.info("%s %s validated: %s", shard.location.dataset, shard.name, stats.to_dict())
    return shard.with_stage("validate", stats, files)


class _Columns:
    """The verdicts file's columns, filled a record at a time; the re-tokenization drift of the sampled records is
    measured in batches (`DRIFT_BATCH` texts per encode call), filled in where each record's row is."""

    def __init__(self) -> None:
        self.data: dict[str, list[Any]] = {name: [] for name in VERDICTS_SCHEMA.names}
        self.measured = 0  # records whose re-tokenization drift was measured (or is waiting in the batch)
        self._waiting: list[tuple[int, str, list[int]]] = []  # (row, decoded text, output ids)

    def append(self, answer: RawAnswer, verdict: Judgement, prompt_len: int, expected: int | None) -> None:
        row = {
            "id": answer.id,
            "verdict": verdict.verdict,
            "flags": list(verdict.flags),
            "finish_reason": answer.finish_reason.get("type", ""),
            "prompt_len": prompt_len,
            "output_len": len(answer.output_ids),
            "reasoning_len": verdict.reasoning_len,
            "tool_calls": verdict.tool_calls,
            "retokenize_drift": None,  # null where not sampled; set by flush_drift where sampled
            "expected_tokens": expected,
        }
        for name, value in row.items():
            self.data[name].append(value)

    def measure_drift(self, decoded: str, output_ids: list[int], renderer: ChatRenderer) -> None:
        """encode(decode(output_ids)) != output_ids for the last appended row, measured with its batch."""
        self._waiting.append((len(self.data["id"]) - 1, decoded, output_ids))
        self.measured += 1
        if len(self._waiting) >= DRIFT_BATCH:
            self.flush_drift(renderer)

    def flush_drift(self, renderer: ChatRenderer) -> None:
        encoded = renderer.encode_texts([decoded for _, decoded, _ in self._waiting], add_special_tokens=False)
        for (row, _, output_ids), ids in zip(self._waiting, encoded, strict=True):
            self.data["retokenize_drift"][row] = ids != output_ids
        self._waiting.clear()

    def table(self) -> pa.Table:
        if self._waiting:
            raise RuntimeError("verdicts written before the sampled drift was measured (flush_drift)")
        return pa.Table.from_pydict(self.data, schema=VERDICTS_SCHEMA)
