"""The export stage: validated raw answers -> training records, in the train/ and validation/ splits and the flagged
truncated/ split, and the train split's token counts.

Only records that passed validation are read here (validate wrote the rest to rejected/). A training record is the
prompt ids then the output ids, untouched, with a loss mask that is the generation boundary. Records are built as
whole columns (numpy buffers handed to Arrow), not as Python lists of ints: export runs at the speed of the file I/O.
A kept record goes to validation/ when its source prompt is held out (regen.holdout: the same prompts in every
version); a truncated one stays in truncated/ either way, its `side` column saying which. The ids under the train
split's loss mask (its answers) are counted as its columns are built (regen.vocab), one small file per shard that
publish sums.

Formats: Parquet (the default) and JSON Lines with `input_ids` and `loss_mask`, the shape the EAGLE-3 trainers'
data loaders read (docs/data.md says which loaders and why); an optional decoded `text` column for review.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec
import numpy as np
import pyarrow as pa

from regen.holdout import Sides
from regen.manifest import ShardManifest, StageStats
from regen.reasons import OK, split_of
from regen.records import read_prompts, read_raw
from regen.storage import Storage, read_table, write_table
from regen.vocab import counts_table, dense_counts

log = logging.getLogger(__name__)

ExportFormat = Literal["parquet", "jsonl"]
SPLITS = ("train", "validation", "truncated")
TRAIN_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("prompt_len", pa.int32()),
        ("verdict", pa.string()),
        ("flags", pa.list_(pa.string())),
        ("finish_reason", pa.string()),
        ("dataset", pa.string()),
        ("profile", pa.string()),
        # The sample's own (regen.samples), the float sent in its request exactly (float32 read 0.3 back as
        # 0.30000001192092896); null: the run's, in the manifest.
        ("temperature", pa.float64()),
        ("sampling_seed", pa.int64()),  # null: no seed was sent
    ]
)
REVIEW_FIELD = pa.field("text", pa.string())  # decode(output_ids): for people reading samples, never for training
SIDE_FIELD = pa.field("side", pa.string())  # truncated/ only: `train` or `validation`, its source prompt's side


@dataclass(frozen=True)
class ExportSettings:
    jsonl: bool = False  # also write each split as JSON Lines, beside the Parquet file
    review_text: bool = False
    validation_share: float = 0.0  # of source prompts held out (regen.holdout); 0: no validation/ split

    @property
    def formats(self) -> tuple[ExportFormat, ...]:
        return ("parquet", "jsonl") if self.jsonl else ("parquet",)


# An Arrow list array addresses its values with int32 offsets, so one holds fewer than 2^31 token ids: a shard's
# columns are built in chunks below that (a shard of long answers can pass it; one chunk per array, same schema).
MAX_LIST_VALUES = 2**31 - 1


def build_training_columns(
    prompts: list[np.ndarray], outputs: list[np.ndarray]
) -> tuple[pa.ChunkedArray, pa.ChunkedArray]:
    """input_ids = prompt + output per record and the loss mask (0 over the prompt, 1 over the output), as Arrow
    list columns, each chunk built from one buffer."""
    lengths = np.fromiter((len(p) + len(o) for p, o in zip(prompts, outputs, strict=True)), np.int64, len(prompts))
    ids, masks = [], []
    for start, end in _chunks(lengths):
        chunk_ids, chunk_mask = _list_columns(prompts[start:end], outputs[start:end], lengths[start:end])
        ids.append(chunk_ids)
        masks.append(chunk_mask)
    return pa.chunked_array(ids, pa.list_(pa.int32())), pa.chunked_array(masks, pa.list_(pa.int8()))


def _chunks(lengths: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) record ranges, each holding at most MAX_LIST_VALUES values (at least one range)."""
    ranges, start, total = [], 0, 0
    for i, length in enumerate(lengths.tolist()):
        if total + length > MAX_LIST_VALUES and i > start:
            ranges.append((start, i))
            start, total = i, 0
        total += length
    ranges.append((start, len(lengths)))
    return ranges


def _list_columns(prompts: list[np.ndarray], outputs: list[np.ndarray], lengths: np.ndarray) -> tuple[Any, Any]:
    parts = [part for pair in zip(prompts, outputs, strict=True) for part in pair]
    values = np.concatenate(parts).astype(np.int32, copy=False) if parts else np.zeros(0, np.int32)
    offsets = np.zeros(len(prompts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > MAX_LIST_VALUES:  # one record past the limit: far beyond any context length
        raise ValueError(f"a record of {offsets[-1]} token ids does not fit an Arrow list")
    mask = np.ones(len(values), dtype=np.int8)
    for start, prompt in zip(offsets[:-1].tolist(), prompts, strict=True):
        mask[start : start + len(prompt)] = 0
    arrow_offsets = pa.array(offsets.astype(np.int32))
    return pa.ListArray.from_arrays(arrow_offsets, pa.array(values)), pa.ListArray.from_arrays(
        arrow_offsets, pa.array(mask)
    )


@dataclass
class _Split:
    """The records of one split, gathered column by column."""

    prompts: list[np.ndarray] = field(default_factory=list)
    outputs: list[np.ndarray] = field(default_factory=list)
    rows: dict[str, list[Any]] = field(
        default_factory=lambda: {
            k: [] for k in ("id", "verdict", "flags", "finish_reason", "text", "temperature", "sampling_seed", "side")
        }
    )

    def add(
        self,
        prompt: np.ndarray,
        output: list[int],
        verdict: dict[str, Any],
        text: str | None,
        sampling: dict[str, Any],
        side: str,
    ) -> None:
        self.prompts.append(prompt)
        self.outputs.append(np.asarray(output, dtype=np.int32))
        for name in ("id", "verdict", "flags", "finish_reason"):
            self.rows[name].append(verdict[name])
        self.rows["text"].append(text)
        self.rows["temperature"].append(sampling.get("temperature"))
        self.rows["sampling_seed"].append(sampling.get("sampling_seed"))
        self.rows["side"].append(side)

    def table(self, dataset: str, profile: str, review_text: bool, sides: bool = False) -> pa.Table:
        input_ids, loss_mask = build_training_columns(self.prompts, self.outputs)
        n = len(self.prompts)
        columns = {
            "id": pa.array(self.rows["id"], pa.string()),
            "input_ids": input_ids,
            "loss_mask": loss_mask,
            "prompt_len": pa.array([len(p) for p in self.prompts], pa.int32()),
            "verdict": pa.array(self.rows["verdict"], pa.string()),
            "flags": pa.array(self.rows["flags"], pa.list_(pa.string())),
            "finish_reason": pa.array(self.rows["finish_reason"], pa.string()),
            "dataset": pa.repeat(pa.scalar(dataset), n),
            "profile": pa.repeat(pa.scalar(profile), n),
            "temperature": pa.array(self.rows["temperature"], pa.float64()),
            "sampling_seed": pa.array(self.rows["sampling_seed"], pa.int64()),
        }
        schema = TRAIN_SCHEMA
        if review_text:
            columns["text"] = pa.array(self.rows["text"], pa.string())
            schema = schema.append(REVIEW_FIELD)
        if sides:
            columns["side"] = pa.array(self.rows["side"], pa.string())
            schema = schema.append(SIDE_FIELD)
        return pa.table(columns, schema=schema)


def _write_jsonl(table: pa.Table, path: Path) -> None:
    """One JSON object per line: id, input_ids, loss_mask (and text when reviewed)."""
    encoder = msgspec.json.Encoder()
    names = [n for n in ("id", "input_ids", "loss_mask", "text") if n in table.column_names]
    with path.open("wb") as f:
        for batch in table.select(names).to_batches(max_chunksize=256):
            for row in batch.to_pylist():
                f.write(encoder.encode(row))
                f.write(b"\n")


def _upload(storage: Storage, shard: ShardManifest, split: str, table: pa.Table, fmt: ExportFormat) -> dict[str, str]:
    if fmt == "parquet":
        # Dictionaries and statistics only where they help: token-id lists gain nothing from either, and computing
        # them was a tenth of the write.
        strings = [f.name for f in table.schema if pa.types.is_string(f.type)]
        scalars = [f.name for f in table.schema if not pa.types.is_list(f.type)]
        key = shard.keys.split(split, "parquet")
        return {key: write_table(storage, key, table, use_dictionary=strings, write_statistics=scalars)}
    key = shard.keys.split(split, "jsonl")
    with tempfile.TemporaryDirectory(prefix="regen-export-") as tmp:
        path = Path(tmp) / "out.jsonl"
        _write_jsonl(table, path)
        return {key: storage.put_file(key, path)}


def run_export(
    shard: ShardManifest,
    storage: Storage,
    settings: ExportSettings | None = None,
    decode: Callable[[list[int]], str] | None = None,
) -> ShardManifest:
    settings = settings or ExportSettings()
    if shard.raw_key is None:
        raise ValueError(f"{shard.name} has no raw answers yet: run generate first")
    if settings.review_text and decode is None:
        raise ValueError("review_text needs the profile's tokenizer to decode outputs")
    columns = ["id", "verdict", "flags", "finish_reason"]
    verdicts = read_table(storage, shard.keys.verdicts, columns).to_pylist()
    kept = {v["id"]: v for v in verdicts if split_of(v["verdict"]) is not None}
    share = settings.validation_share
    prompts = read_prompts(storage, shard.prompts_key, ["id", "prompt_ids"], sides=share > 0)
    side = Sides(prompts, share)
    splits = {name: _Split() for name in SPLITS}
    with tempfile.TemporaryDirectory(prefix="regen-export-") as tmp:
        for answer in read_raw(storage, shard.raw_key, Path(tmp)):
            verdict = kept.get(answer.id)
            if verdict is not None:
                text = decode(answer.output_ids) if settings.review_text and decode else None
                split, held = str(split_of(verdict["verdict"])), side(answer.id)
                splits["validation" if split == "train" and held == "validation" else split].add(
                    prompts.prompt_of(answer), answer.output_ids, verdict, text, prompts.sampling(answer.id), held
                )
    stats = StageStats()
    for record in kept.values():
        stats.keep() if record["verdict"] == OK else stats.drop(record["verdict"])
    files: dict[str, str] = {}
    dataset, profile = shard.location.dataset, shard.location.profile
    for split_name, records in splits.items():
        # train/ always exists, and validation/ when prompts are held out, so a reader finds every shard
        if split_name == "train" or (split_name == "validation" and share) or records.prompts:
            table = records.table(dataset, profile, settings.review_text, sides=split_name == "truncated")
            for fmt in settings.formats:
                files |= _upload(storage, shard, split_name, table, fmt)
    counts = counts_table(dense_counts(splits["train"].outputs))  # the train split's loss_mask == 1 ids
    files[shard.keys.token_counts] = write_table(storage, shard.keys.token_counts, counts)
    split_records = {name: len(records.prompts) for name, records in splits.items()}
    exported = shard.with_stage(
        "export", stats, files, train_key=shard.keys.split("train"), split_records=split_records
    )
    storage.put_bytes(shard.keys.report, json.dumps(exported.to_dict(), indent=1).encode())
    log.info("%s %s exported: %s", dataset, shard.name, dict(Counter(v["verdict"] for v in kept.values())))
    return exported
